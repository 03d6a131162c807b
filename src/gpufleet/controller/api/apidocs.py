"""The API's own documentation pages, served with no request leaving the cluster.

FastAPI's default ``/docs`` and ``/redoc`` pages load Swagger UI and ReDoc from a public CDN: blank on
an air-gapped cluster. Here ``/docs`` loads Swagger UI from the controller itself, from the copy the
``fastapi-offline`` package ships (Swagger UI 5, Apache licensed; none of that package's code is used):
``/docs/assets/swagger-ui-bundle.js`` and friends. There is no ``/redoc``: ReDoc still fetches its logo
from its vendor's CDN. ``/docs`` reads ``/openapi.json``; with ``openapi_requires_auth`` there is no
public document to read, so the page is not served either.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS = "/docs/assets"


def assets_dir() -> Path:
    """The shipped Swagger UI / ReDoc files (a directory inside the installed fastapi_offline package)."""
    return Path(str(resources.files("fastapi_offline").joinpath("static")))


def install(app: FastAPI, openapi_url: str, title: str) -> None:
    """Serve ``/docs`` (Swagger UI) and its assets from this process."""
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="api-docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=openapi_url, title=f"{title} - API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon.png")
