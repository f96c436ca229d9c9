"""``/ui``: the console's page and its assets, served from the package itself.

Everything the page loads ships in ``api/console/assets/`` (the vendored libraries in
``vendor/`` with their licences). The page may load nothing from another host: its
Content Security Policy allows this worker only. The one inline script is the page's
import map, allowed by its hash.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

PAGE_URL = "/ui"
ASSETS_URL = "/ui/assets"
_IMPORT_MAP = re.compile(r'<script type="importmap">(.*?)</script>', re.DOTALL)


def assets_directory() -> Path:
    """The folder of the console's files (inside the installed package)."""
    folder = Path(str(resources.files("api.console").joinpath("assets")))
    if not (folder / "index.html").is_file():
        raise RuntimeError(f"the console's files are missing from {folder}: reinstall")
    return folder


def content_security_policy(page: str) -> str:
    """This worker only; the page's inline import map by its hash."""
    scripts = ["'self'"]
    for found in _IMPORT_MAP.finditer(page):
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


def add_console_page(api: FastAPI) -> None:
    """Serve ``/ui/`` (the page; ``/ui`` redirects to it) and ``/ui/assets/*``. The page
    says whether the workers want a token (so that it asks before its first request)."""
    folder = assets_directory()
    page = (folder / "index.html").read_text(encoding="utf-8")
    pages = {
        required: page.replace('content="TOKEN_REQUIRED"', f'content="{str(required).lower()}"')
        for required in (True, False)
    }
    headers = {
        "Content-Security-Policy": content_security_policy(page),
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
    }
    api.mount(ASSETS_URL, StaticFiles(directory=folder), name="console-assets")

    @api.get(PAGE_URL, include_in_schema=False)
    async def console_redirect() -> RedirectResponse:
        # Relative: right behind a proxy that serves the API under a prefix too.
        return RedirectResponse("ui/", status_code=307)

    @api.get(f"{PAGE_URL}/", include_in_schema=False)
    async def console(request: Request) -> HTMLResponse:
        required = bool(request.app.state.worker.settings.api_token)
        return HTMLResponse(pages[required], headers=headers)
