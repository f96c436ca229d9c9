"""Wait until a local Kafka cluster answers metadata requests with all its brokers.

Standard library only, so that `make kafka-up` works before any virtualenv exists.
It speaks just enough of the Kafka protocol: a Metadata v4 request for no topics,
and the broker list of the answer.

    python3 ops/kafka_ready.py --port 9092 --brokers 3 --timeout 60
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

METADATA_API_KEY = 3
METADATA_VERSION = 4
CLIENT_ID = b"streamstate-ops"


def _metadata_request(correlation_id: int) -> bytes:
    header = struct.pack(
        ">hhih", METADATA_API_KEY, METADATA_VERSION, correlation_id, len(CLIENT_ID)
    )
    # topics: empty array (no topics), allow_auto_topic_creation: false
    body = struct.pack(">i?", 0, False)
    payload = header + CLIENT_ID + body
    return struct.pack(">i", len(payload)) + payload


def _read_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        chunks.extend(chunk)
    return bytes(chunks)


def broker_count(host: str, port: int, timeout: float = 3.0) -> int:
    """Return how many brokers the node at host:port reports in its metadata."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(_metadata_request(1))
        (size,) = struct.unpack(">i", _read_exact(sock, 4))
        answer = _read_exact(sock, size)
    # correlation_id (int32), throttle_time_ms (int32), brokers array length (int32)
    _, _, count = struct.unpack_from(">iii", answer, 0)
    return int(count)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9092)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args()
    ports = [args.port + 2 * i for i in range(args.brokers)]
    deadline = time.monotonic() + args.timeout
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        try:
            counts = [broker_count(args.host, port) for port in ports]
            if all(count >= args.brokers for count in counts):
                return 0
            last_error = f"brokers seen per node: {counts}"
        except (OSError, struct.error) as exc:
            last_error = str(exc)
        time.sleep(0.1)
    print(f"kafka not ready after {args.timeout:.0f}s: {last_error}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
