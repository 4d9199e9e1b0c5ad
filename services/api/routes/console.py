"""The web console at ``/console``: static pages (services/api/console/) over the public API.

The pages are plain HTML, CSS and one script served by the api itself (no CDN, no build step);
they call the same endpoints with the key the user enters, so the console shows exactly what the
API shows that key's project. ``/console/config.json`` hands the script the facts it must not
restate (endpoints, windows, statuses, the defaults' fields, page sizes), from their owners.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

from services.api.page_sizes import console_page_sizes
from services.api.schemas import BatchCreateParams
from shared.lifecycle import STATUSES, TERMINAL
from shared.protocol.messages import SamplingDefaults
from shared.protocol.openai import COMPLETION_WINDOWS, SUPPORTED_ENDPOINTS
from shared.stores.models import WORKER_ALIVE_S

PAGES = Path(__file__).resolve().parent.parent / "console"
# Nothing but the api itself: no script, style, font or image from anywhere else.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def console_config() -> dict[str, Any]:
    priority = BatchCreateParams.model_json_schema()["properties"]["priority"]["anyOf"][0]
    return {
        "endpoints": list(SUPPORTED_ENDPOINTS),
        "completion_windows": list(COMPLETION_WINDOWS),
        "statuses": list(STATUSES),
        "terminal": sorted(TERMINAL),
        "priority": {"minimum": priority.get("minimum"), "maximum": priority.get("maximum")},
        "defaults": SamplingDefaults.model_json_schema()["properties"],
        "worker_alive_s": WORKER_ALIVE_S,
        "pages": console_page_sizes(),
    }


@router.get("/console")
async def console_root() -> RedirectResponse:
    return RedirectResponse("/console/", status_code=308)


@router.get("/console/config.json")
async def config() -> dict[str, Any]:
    return console_config()


class ConsolePages(StaticFiles):
    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(SECURITY_HEADERS)
        return response


def install_console(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/console", ConsolePages(directory=PAGES, html=True), name="console")
