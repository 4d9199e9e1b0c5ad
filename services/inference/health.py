"""GET /health and GET /metrics on a small aiohttp server (aiohttp ships with vLLM)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


class HealthServer:
    """Healthy once ``ready()`` says so (engine started and consumer running)."""

    def __init__(self, port: int, ready: Callable[[], bool], host: str = "127.0.0.1") -> None:
        self.port = port
        self.host = host
        self.ready = ready
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, _: web.Request) -> web.Response:
        if self.ready():
            return web.json_response({"status": "healthy"})
        return web.json_response({"status": "starting"}, status=503)

    async def _metrics(self, _: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(REGISTRY))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response
