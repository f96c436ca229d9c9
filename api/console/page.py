"""``/ui``: the console's page and its assets, served from the package itself.

Everything the page loads ships in ``api/console/assets/`` (the vendored libraries in
``vendor/`` with their licences). The page may load nothing from another host: its
Content Security Policy allows this worker only. The page's inline scripts (its import
map, and the first request of the view it opens with) are allowed by their hashes.
"""

from __future__ import annotations

import base64
import hashlib
import html
import mimetypes
import re
from collections.abc import MutableMapping
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse

PAGE_URL = "/ui"
ASSETS_URL = "/ui/assets"
#: A script written in the page (no ``src``), the import map included.
_INLINE_SCRIPT = re.compile(r'<script(?: type="importmap")?>(.*?)</script>', re.DOTALL)


def assets_directory() -> Path:
    """The folder of the console's files (inside the installed package)."""
    folder = Path(str(resources.files("api.console").joinpath("assets")))
    if not (folder / "index.html").is_file():
        raise RuntimeError(f"the console's files are missing from {folder}: reinstall")
    return folder


class Assets:
    """The console's files, read once and served from memory (pure ASGI): no disk and no
    thread per request, so a busy worker answers them as fast as it answers anything."""

    def __init__(self, folder: Path) -> None:
        self.files: dict[str, tuple[bytes, bytes, bytes]] = {}
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.name != "index.html":
                body = path.read_bytes()
                kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                if kind.startswith("text/") or kind.endswith("javascript"):
                    kind += "; charset=utf-8"
                etag = f'"{hashlib.blake2b(body, digest_size=12).hexdigest()}"'
                self.files["/" + path.relative_to(folder).as_posix()] = (
                    body,
                    kind.encode(),
                    etag.encode(),
                )

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        # A mounted app's path still holds its mount point, which root_path ends with.
        path, root = scope["path"], scope.get("root_path", "")
        found = self.files.get(path[len(root) :] if path.startswith(root) else path)
        if scope["method"] not in ("GET", "HEAD") or found is None:
            await _answer(send, 404, b"text/plain; charset=utf-8", b"not found")
            return
        body, kind, etag = found
        headers = ((b"etag", etag), (b"cache-control", b"no-cache"))
        if dict(scope["headers"]).get(b"if-none-match") == etag:
            await _answer(send, 304, kind, b"", headers)
            return
        await _answer(send, 200, kind, b"" if scope["method"] == "HEAD" else body, headers)


async def _answer(
    send: Any, status: int, kind: bytes, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    head = [(b"content-type", kind), (b"x-content-type-options", b"nosniff"), *headers]
    head.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def content_security_policy(page: str) -> str:
    """This worker only; the page's inline scripts by their hashes."""
    scripts = ["'self'"]
    for found in _INLINE_SCRIPT.finditer(page):
        digest = hashlib.sha256(found.group(1).encode("utf-8")).digest()
        scripts.append(f"'sha256-{base64.b64encode(digest).decode('ascii')}'")
    return "; ".join(
        [
            "default-src 'none'",
            f"script-src {' '.join(scripts)}",
            "style-src 'self'",
            "img-src 'self' data:",
            "font-src 'self'",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


def page_for(page: str, *, token_required: bool, first_table: str) -> str:
    """The page as a worker serves it: whether the workers want a token (so that it asks
    before its first request), and the table the tables view opens with (so that it asks
    for that table's first keys at once)."""
    page = page.replace('content="TOKEN_REQUIRED"', f'content="{str(token_required).lower()}"')
    return page.replace('content="FIRST_TABLE"', f'content="{html.escape(first_table)}"')


def add_console_page(api: FastAPI) -> None:
    """Serve ``/ui/`` (the page; ``/ui`` redirects to it) and ``/ui/assets/*``."""
    folder = assets_directory()
    page = (folder / "index.html").read_text(encoding="utf-8")
    pages: dict[tuple[bool, str], str] = {}
    headers = {
        "Content-Security-Policy": content_security_policy(page),
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
    }
    api.mount(ASSETS_URL, Assets(folder), name="console-assets")

    @api.get(PAGE_URL, include_in_schema=False)
    async def console_redirect() -> RedirectResponse:
        # Relative: right behind a proxy that serves the API under a prefix too.
        return RedirectResponse("ui/", status_code=307)

    @api.get(f"{PAGE_URL}/", include_in_schema=False)
    async def console(request: Request) -> HTMLResponse:
        required = bool(request.app.state.worker.settings.api_token)
        # the tables view lists the tables in this order and opens with the first
        first = next(iter(request.app.state.queries.tables), "")
        found = pages.get((required, first))
        if found is None:
            found = pages[required, first] = page_for(
                page, token_required=required, first_table=first
            )
        return HTMLResponse(found, headers=headers)
