"""The worker's HTTP port, taken at the first moment of the process.

Peers remove a member whose port *refuses* connections (api/members.py): its process is
gone. A worker that restarts (after a kill -9, say) would refuse them too while Python
imports faust and the app, a second or more, and its peers would remove it: it would
join again as a new member, with a rebalance of the whole group, instead of taking its
partitions back as the static member it is. So ``app/__init__.py`` binds and listens on
the port the command line names before anything else is imported; connections wait in
the backlog until the API server, started later on this same socket, accepts them.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping, Sequence

#: Where the worker serves when neither the command line nor the environment says
#: (core/settings.py's defaults).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6066

_reserved: dict[tuple[str, int], socket.socket] = {}


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


def worker_address(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The host and port a ``faust ... worker`` command line serves on; None for any
    other command (or a port that is not a number)."""
    if "worker" not in argv[1:]:
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


def reserve(argv: Sequence[str], environ: Mapping[str, str]) -> socket.socket | None:
    """Bind and listen on the worker's address now; None when this is no worker's
    command line or the address cannot be bound (the server then binds it later, as
    without this)."""
    address = worker_address(argv, environ)
    if address is None:
        return None
    sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        return None
    _reserved[address] = sock
    return sock


def take(host: str, port: int) -> socket.socket | None:
    """The socket reserved for ``host:port``, once; any other reservation is closed."""
    sock = _reserved.pop((host, port), None)
    for other in _reserved.values():
        with contextlib.suppress(OSError):
            other.close()
    _reserved.clear()
    return sock
