"""The worker takes its HTTP port at the first moment of its process (app/listen.py)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
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
    assert listen.worker_address(["pytest", "-k", "worker"], {}) is None  # not faust's
    assert listen.worker_address(["/venv/bin/faust", "worker"], {}) == ("127.0.0.1", 6066)
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


def test_a_port_another_process_holds_is_waited_for_then_refused() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        command = ["faust", "-A", "app.main", "worker", "--web-port", str(port)]
        started = time.monotonic()
        with pytest.raises(listen.PortTaken, match=f"127.0.0.1:{port} is taken by another"):
            listen.reserve(command, {}, wait_s=0.3)
        assert time.monotonic() - started >= 0.3


def test_a_port_let_go_of_while_waiting_is_taken() -> None:
    """A worker started again right after a kill -9 finds its port free moments later."""
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    port = other.getsockname()[1]
    threading.Timer(0.3, other.close).start()
    command = ["faust", "-A", "app.main", "worker", "--web-port", str(port)]
    reserved = listen.reserve(command, {}, wait_s=5.0)
    assert reserved is not None
    assert listen.take("127.0.0.1", port) is reserved
    listen.hand_over(reserved)
    reserved.close()


def test_a_worker_whose_port_is_taken_exits_at_once_saying_so() -> None:
    """Before, it ran on without its API for a minute, joined to its group under an
    address it could not serve."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        started = time.monotonic()
        finished = subprocess.run(
            [sys.executable, "-m", "faust", "-A", "app.main", "worker", "--web-port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert finished.returncode == 1, finished
    assert f"127.0.0.1:{port} is taken by another process" in finished.stderr
    assert "--web-port" in finished.stderr
    assert time.monotonic() - started < 30


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
