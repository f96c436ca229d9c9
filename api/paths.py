"""What a request's path names, read from the path as it was sent.

The server undoes percent-escapes before routing, so a key's ``%2F`` becomes a ``/`` like
any separator: ``/tables/t/keys/x%2Fchanges`` (the key ``x/changes``) and
``/tables/t/keys/x/changes`` (the change stream of the key ``x``) have the same decoded
path. Only the raw path (``scope["raw_path"]``, the request line's) tells them apart:
there, only an unescaped ``/`` separates segments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

#: The last path segment of a key's change stream.
CHANGES = b"changes"


def raw_path(scope: Mapping[str, Any]) -> bytes:
    """The path as it was sent; the decoded path, encoded again, for a server that does
    not give it (then a ``%2F`` cannot be told from a ``/``)."""
    raw: bytes | None = scope.get("raw_path")
    return scope["path"].encode("utf-8") if raw is None else raw


def names_changes(raw: bytes) -> bool:
    """Whether a raw path's last segment is ``changes`` (escaped or not): a key's change
    stream, not the key ``.../changes``, whose last ``/`` is escaped (``%2F``)."""
    last = raw.rpartition(b"/")[2]
    return last == CHANGES or (b"%" in last and unquote_to_bytes(last) == CHANGES)


def utf8_path(scope: Mapping[str, Any]) -> bool:
    """Whether the request's path is UTF-8 once its percent-escapes are undone. The server
    decodes it leniently (an escape that is not UTF-8 becomes U+FFFD), which would read
    another key than the one sent; only a path holding U+FFFD needs the check."""
    if "\ufffd" not in scope["path"]:
        return True
    raw = scope.get("raw_path")
    if raw is None:
        return True
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
