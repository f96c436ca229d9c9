"""/docs (Swagger UI) and /redoc (ReDoc), served with their assets from the worker itself.

FastAPI's own pages load Swagger UI and ReDoc from a public CDN, their favicon from
another site and ReDoc's fonts from Google: on a network without internet access they
render blank. Here the scripts, the stylesheet and the favicon come from the
``fastapi-offline`` package, which bundles released Swagger UI and ReDoc builds, and the
pages name no other host.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: Where the bundled assets are served.
ASSETS_URL = "/docs/assets"
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
#: No badge from an online validator: it would fetch an image from another host.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}
#: The pages may load nothing from another host, whatever the bundles ask for (ReDoc's
#: sidebar shows a logo from its vendor's CDN). The inline parts are FastAPI's start-up
#: script and the styles both UIs set on elements; ReDoc's search runs in a blob: worker.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self' 'unsafe-inline'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "worker-src 'self' blob:",
        "base-uri 'none'",
        "form-action 'self'",
    ]
)


def _same_host_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


def assets_directory() -> Path:
    """The folder of the bundled Swagger UI and ReDoc builds."""
    folder = Path(str(resources.files("fastapi_offline").joinpath("static")))
    missing = [name for name in ASSETS if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"fastapi-offline lacks {missing} in {folder}: reinstall it")
    return folder


def add_docs(api: FastAPI) -> None:
    """Serve /docs, /docs/oauth2-redirect and /redoc (create ``api`` with
    ``docs_url=None, redoc_url=None``)."""
    api.mount(ASSETS_URL, StaticFiles(directory=assets_directory()), name="docs-assets")
    redirect_url = api.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @api.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _same_host_only(
            get_swagger_ui_html(
                openapi_url=f"{root}{api.openapi_url}",
                title=f"{api.title} - Swagger UI",
                swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
                oauth2_redirect_url=f"{root}{redirect_url}",
                swagger_ui_parameters={
                    **SWAGGER_UI_PARAMETERS,
                    **(api.swagger_ui_parameters or {}),
                },
            )
        )

    @api.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return _same_host_only(get_swagger_ui_oauth2_redirect_html())

    @api.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _same_host_only(
            get_redoc_html(
                openapi_url=f"{root}{api.openapi_url}",
                title=f"{api.title} - ReDoc",
                redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
                with_google_fonts=False,
            )
        )
