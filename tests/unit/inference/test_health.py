"""The worker's probes: /livez answers while the loop runs, /readyz names the checks that fail."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from services.inference.health import HealthServer


async def test_probes_follow_the_checks() -> None:
    state = {"engine": False, "consumer": False, "group_joined": False}
    server = HealthServer(0, ready=lambda: state["consumer"], checks=lambda: dict(state))
    async with TestClient(TestServer(server.app())) as client:
        assert (await client.get("/livez")).status == 200
        response = await client.get("/readyz")
        assert response.status == 503
        assert (await response.json())["failing"] == ["consumer", "engine", "group_joined"]
        assert (await client.get("/health")).status == 503

        state.update(engine=True, consumer=True)
        response = await client.get("/readyz")
        assert response.status == 503 and (await response.json())["failing"] == ["group_joined"]
        assert (await client.get("/health")).status == 200  # as before: engine and consumer

        state["group_joined"] = True
        response = await client.get("/readyz")
        assert response.status == 200 and (await response.json())["status"] == "ready"
        assert (await client.get("/livez")).status == 200
