"""The readiness probe of the local Kafka: its Metadata request and answer parsing."""

from __future__ import annotations

import socket
import struct
import threading

from ops.kafka_ready import CLIENT_ID, _metadata_request, broker_count


def test_metadata_request_is_a_sized_v4_request_for_no_topics() -> None:
    request = _metadata_request(7)
    (size,) = struct.unpack_from(">i", request, 0)
    assert size == len(request) - 4
    api_key, version, correlation, client_len = struct.unpack_from(">hhih", request, 4)
    assert (api_key, version, correlation) == (3, 4, 7)
    assert request[14 : 14 + client_len] == CLIENT_ID
    assert request[14 + client_len :] == struct.pack(">i?", 0, False)


def test_broker_count_reads_the_broker_array_length_of_the_answer() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_once() -> None:
        connection, _ = server.accept()
        with connection:
            (size,) = struct.unpack(">i", connection.recv(4))
            connection.recv(size)
            body = struct.pack(">iii", 1, 0, 3) + b"\x00" * 16
            connection.sendall(struct.pack(">i", len(body)) + body)

    thread = threading.Thread(target=answer_once)
    thread.start()
    try:
        assert broker_count("127.0.0.1", port) == 3
    finally:
        thread.join(5)
        server.close()
