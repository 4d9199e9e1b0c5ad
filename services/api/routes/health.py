"""Liveness, readiness and Prometheus metrics of the api.

- ``/livez``: the process serves requests (a liveness probe: restart the container when it fails).
  It checks nothing else, so a MongoDB outage does not make Kubernetes restart every api pod.
- ``/readyz``: every dependency answers (a readiness probe: take the pod out of the Service while
  one does not); 503 with ``retry-after`` and the names of those that do not.
- ``/health``: the same answer as ``/readyz``, kept for existing monitors.

Prometheus metrics are not on this port: their series name projects and their queues, so they are
served on a port of their own (``BATCHSTREAM_API_METRICS_PORT``, ``serve_metrics``) that only the
scraper reaches.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable
from wsgiref.simple_server import WSGIServer

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from prometheus_client import start_http_server

from services.api.deps import services

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 3.0


@router.get("/livez")
async def livez() -> JSONResponse:
    return JSONResponse({"status": "alive"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    return await _dependencies_answer(request)


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    return await _dependencies_answer(request)


async def _dependencies_answer(request: Request) -> JSONResponse:
    state = services(request)
    checks: dict[str, Awaitable[object]] = {
        "mongodb": state.mongo.ping(),
        "object_storage": state.store.ping(),
        "kafka": state.producer.client.fetch_all_metadata(),
    }
    down: list[str] = []
    for name, check in checks.items():
        try:
            await asyncio.wait_for(check, CHECK_TIMEOUT_S)
        except Exception as exc:
            log.warning("health check failed", extra={"dependency": name, "error": str(exc)})
            down.append(name)
    if down:
        return JSONResponse(
            {"status": "unhealthy", "unavailable": down},
            status_code=503,
            headers={"retry-after": "2"},
        )
    return JSONResponse({"status": "healthy"})


class MetricsServer:
    """Prometheus' own HTTP server (a thread) on the metrics port; stopped with the api."""

    def __init__(self, host: str, port: int) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
