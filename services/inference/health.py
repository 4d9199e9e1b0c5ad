"""The worker's probes and metrics on a small aiohttp server (aiohttp ships with vLLM).

- ``/livez``: the process is alive and its event loop answers (an answer at all is the proof);
  a liveness probe that fails means "restart me".
- ``/readyz``: every readiness check passes (the engine is started, the consumer runs and has
  joined its group, so Kafka answered); 503 naming the checks that fail otherwise.
- ``/health``: as before, 200 ``healthy`` once the engine is started and the consumer runs.
- ``/metrics``: Prometheus (with the lines counted so far, see ``metrics.LINES``).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from services.inference import metrics
from services.inference.settings import InferenceSettings, worker_defaults

Checks = Callable[[], dict[str, bool]]


class HealthServer:
    """Healthy once ``ready()`` says so; ready (``/readyz``) once every one of ``checks()`` passes."""

    def __init__(
        self,
        ready: Callable[[], bool],
        settings: InferenceSettings | None = None,
        checks: Checks | None = None,
    ) -> None:
        """Listens on ``settings``' health host and port (without settings, their defaults)."""
        settings = settings if settings is not None else worker_defaults()
        self.port = settings.health_port
        self.host = settings.health_host
        self.ready = ready
        self.checks: Checks = checks or (lambda: {"ready": ready()})
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/readyz", self._readyz)
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

    async def _livez(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def _readyz(self, _: web.Request) -> web.Response:
        checks = self.checks()
        failing = sorted(name for name, ok in checks.items() if not ok)
        if failing:
            return web.json_response(
                {"status": "not ready", "failing": failing, "checks": checks}, status=503
            )
        return web.json_response({"status": "ready", "checks": checks})

    async def _metrics(self, _: web.Request) -> web.Response:
        metrics.LINES.flush()  # the per-line counts, held as plain integers until now
        response = web.Response(body=generate_latest(REGISTRY))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response
