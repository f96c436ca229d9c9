"""The worker takes its HTTP port at the first moment of its process (app/listen.py)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from app import listen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(autouse=True)
def nothing_reserved() -> Iterator[None]:
    yield
    listen.take("", 0)  # closes whatever a test left reserved


def test_the_address_comes_from_the_worker_command_line_then_the_environment() -> None:
    command = ["faust", "--datadir", "d", "-A", "app.main", "worker", "-l", "info"]
    assert listen.worker_address(command, {}) == ("127.0.0.1", 6066)
    assert listen.worker_address(command, {"WEB_PORT": "7000", "WEB_HOST": "h"}) == ("h", 7000)
    given = [*command, "--web-host", "10.0.0.5", "--web-port=6070"]
    assert listen.worker_address(given, {"WEB_PORT": "7000"}) == ("10.0.0.5", 6070)
    assert listen.worker_address([*command, "-p", "6071"], {}) == ("127.0.0.1", 6071)
    assert listen.worker_address(["pytest", "tests"], {}) is None
    assert listen.worker_address(["faust", "-A", "app.main", "agents"], {}) is None


def get(port: int, path: str) -> tuple[int, dict[str, str], Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), json.loads(answer.read())
    finally:
        conn.close()


def test_a_reserved_port_answers_starting_until_the_server_takes_it_over() -> None:
    port = free_port()
    command = ["faust", "-A", "app.main", "worker", "--web-port", str(port)]
    reserved = listen.reserve(command, {})
    assert reserved is not None
    assert get(port, "/health")[::2] == (200, {"status": "ok"})
    status, headers, body = get(port, "/ready")
    assert (status, body["status"], headers["retry-after"]) == (503, "recovering", "1")
    status, headers, body = get(port, "/tables/word_counts/keys/the")
    assert (status, headers["retry-after"]) == (503, "1")
    assert "starting" in body["detail"]
    assert listen.take("127.0.0.1", port) is reserved
    assert listen.take("127.0.0.1", port) is None  # once
    listen.hand_over(reserved)
    # handed over: connections wait for the server, nothing answers them now
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as waiting:
        waiting.settimeout(0.5)
        waiting.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        with pytest.raises(TimeoutError):
            waiting.recv(100)
    reserved.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2.0)


def test_a_port_taken_by_another_process_is_left_to_the_server() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        command = ["faust", "-A", "app.main", "worker", "--web-port", str(port)]
        assert listen.reserve(command, {}) is None


def test_a_reservation_for_another_address_is_closed_when_the_server_takes_its_own() -> None:
    port = free_port()
    command = ["faust", "-A", "app.main", "worker", "--web-port", str(port)]
    reserved = listen.reserve(command, {})
    assert reserved is not None
    assert listen.take("127.0.0.1", port + 1) is None
    assert reserved.fileno() == -1  # closed


def test_the_servers_connections_on_a_reserved_port_send_without_delay() -> None:
    """asyncio turns Nagle's algorithm off only on connections of a socket named TCP: on
    one that is not, a response written in two parts waits out the client's delayed ACK
    (40 ms a read)."""
    port = free_port()
    reserved = listen.reserve(["faust", "-A", "app.main", "worker", "--web-port", str(port)], {})
    assert reserved is not None
    listen.take("127.0.0.1", port)
    listen.hand_over(reserved)
    nodelay: list[int] = []

    async def serve() -> None:
        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nodelay.append(
                writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            )
            writer.close()

        server = await asyncio.start_server(on_connection, sock=reserved)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if nodelay:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(serve())
    assert nodelay
    assert nodelay[0] != 0
