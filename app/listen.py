"""The worker's HTTP port, taken at the first moment of the process.

Peers remove a member whose port *refuses* connections (api/members.py): its process is
gone. A worker that restarts (after a kill -9, say) would refuse them too while Python
imports faust and the app, a second or more, and its peers would remove it: it would
join again as a new member, with a rebalance of the whole group, instead of taking its
partitions back as the static member it is. So ``app/__init__.py`` binds and listens on
the port the command line names before anything else is imported. Until the API server
takes the socket over (:func:`hand_over`), a thread answers on it: ``/health`` 200,
``/ready`` 503 ``recovering``, anything else 503, each with ``Retry-After``: a peer that
forwards a read to a starting worker turns to a standby at once instead of waiting out
its timeout.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections.abc import Mapping, Sequence

#: Where the worker serves when neither the command line nor the environment says
#: (core/settings.py's defaults).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6066
#: How long a worker waits for its address while another process holds it.
TAKEN_WAIT_S = 3.0

_reserved: dict[tuple[str, int], socket.socket] = {}
_answering: dict[socket.socket, StartingAnswers] = {}

#: What a starting worker answers: /health as the API does, the rest as not yet.
STARTING = b"the worker process is starting"
_HEALTHY = b'{"status":"ok"}'
_NOT_READY = b'{"status":"recovering","assigned":0,"progress":null,"detail":"' + STARTING + b'"}'
_NOT_YET = b'{"detail":"' + STARTING + b'; retry"}'


class StartingAnswers(threading.Thread):
    """Answers each request on a listening socket until :meth:`stop`."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(name="starting-answers", daemon=True)
        self.sock = sock
        self.answered = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        self.sock.settimeout(0.05)
        while not self._stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed (the worker stops before its API started)
                return
            with conn:
                self.answer(conn)

    def answer(self, conn: socket.socket) -> None:
        conn.settimeout(1.0)
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < 16_384:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
        path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
        if path == b"/health":
            status, body = b"200 OK", _HEALTHY
        else:
            status, body = b"503 Service Unavailable", _NOT_READY if path == b"/ready" else _NOT_YET
        response = (
            b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"retry-after: 1\r\nconnection: close\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        with contextlib.suppress(OSError):
            conn.sendall(response)
        self.answered += 1

    def stop(self) -> None:
        self._stopping.set()
        self.join(2.0)
        self.sock.settimeout(None)


def _option(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last of ``names`` on the command line (``--name v`` or
    ``--name=v``)."""
    found = None
    for index, arg in enumerate(argv):
        for name in names:
            if arg == name and index + 1 < len(argv):
                found = argv[index + 1]
            elif name.startswith("--") and arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def _faust_command(argv: Sequence[str]) -> bool:
    """Whether the command line is faust's (``faust -A app.main worker ...``): pytest or
    a script with "worker" among its arguments serves nothing."""
    named_app = any(arg in ("-A", "--app") or arg.startswith("--app=") for arg in argv)
    return named_app or "faust" in argv[0].rsplit("/", 1)[-1]


def worker_address(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The host and port a ``faust ... worker`` command line serves on; None for any
    other command (or a port that is not a number)."""
    if "worker" not in argv[1:] or not _faust_command(argv):
        return None
    host = (
        _option(argv, "--web-host", "-h")
        or environ.get("WEB_HOST")
        or environ.get("web_host")
        or DEFAULT_HOST
    )
    port = (
        _option(argv, "--web-port", "-p")
        or environ.get("WEB_PORT")
        or environ.get("web_port")
        or str(DEFAULT_PORT)
    )
    try:
        return host, int(port)
    except ValueError:
        return None


class PortTaken(OSError):
    """Another process holds the worker's address: the worker cannot serve."""


def reserve(
    argv: Sequence[str], environ: Mapping[str, str], wait_s: float = TAKEN_WAIT_S
) -> socket.socket | None:
    """Bind and listen on the worker's address now; None when this is no worker's
    command line or the address cannot be bound for another reason than its being taken
    (the server then binds it later, as without this). An address another process holds
    is waited for ``wait_s`` (a worker killed just before lets go of it within
    milliseconds), then :class:`PortTaken` is raised: a worker that cannot serve its
    address would join its group under that address all the same."""
    address = worker_address(argv, environ)
    if address is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sock = _listen(address)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                return None
            if time.monotonic() >= deadline:
                raise PortTaken(
                    error.errno,
                    f"the worker's address {address[0]}:{address[1]} is taken by another "
                    f"process ({error.strerror}); give the worker a free one with --web-port "
                    "(or WEB_PORT)",
                ) from None
            time.sleep(0.1)
            continue
        break
    _reserved[address] = sock
    answers = _answering[sock] = StartingAnswers(sock)
    answers.start()
    return sock


def _listen(address: tuple[str, int]) -> socket.socket:
    # Named TCP, as the server's own socket would be: asyncio turns Nagle's algorithm off
    # (TCP_NODELAY) only on connections of a socket whose protocol says TCP; with it on,
    # a response written in two parts waited out the client's delayed ACK (40 ms).
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def take(host: str, port: int) -> socket.socket | None:
    """The socket reserved for ``host:port``, once (it is answered on until
    :func:`hand_over`); any other reservation is closed."""
    sock = _reserved.pop((host, port), None)
    for other in _reserved.values():
        hand_over(other)
        with contextlib.suppress(OSError):
            other.close()
    _reserved.clear()
    return sock


def hand_over(sock: socket.socket) -> None:
    """Stop answering on ``sock``: the API server serves it from now on."""
    answers = _answering.pop(sock, None)
    if answers is not None:
        answers.stop()
