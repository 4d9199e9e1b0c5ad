"""/livez stays 200 while a dependency is down (no restart loop); /readyz and /health say 503.

The dependencies are fakes (a ping that succeeds or raises): this checks the routing of the
probes, not the clients; tests/integration/api/test_errors.py stops a real MongoDB.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from services.api.routes import health


class FakePing:
    def __init__(self, up: bool) -> None:
        self.up = up

    async def ping(self) -> None:
        if not self.up:
            raise ConnectionError("fake dependency down")

    async def fetch_all_metadata(self) -> None:
        await self.ping()


def app_with_fake_dependencies(mongo_up: bool) -> TestClient:
    app = FastAPI()
    app.include_router(health.router)
    app.state.services = SimpleNamespace(
        mongo=FakePing(mongo_up), store=FakePing(True), producer=SimpleNamespace(client=FakePing(True))
    )
    return TestClient(app)


@pytest.mark.parametrize("path", ["/readyz", "/health"])
def test_readiness_fails_while_a_dependency_is_down(path: str) -> None:
    response = app_with_fake_dependencies(mongo_up=False).get(path)
    assert response.status_code == 503
    assert response.json()["unavailable"] == ["mongodb"]
    assert response.headers["retry-after"]


@pytest.mark.parametrize("path", ["/readyz", "/health"])
def test_readiness_passes_when_every_dependency_answers(path: str) -> None:
    response = app_with_fake_dependencies(mongo_up=True).get(path)
    assert response.status_code == 200 and response.json() == {"status": "healthy"}


def test_liveness_ignores_dependencies() -> None:
    response = app_with_fake_dependencies(mongo_up=False).get("/livez")
    assert response.status_code == 200 and response.json() == {"status": "alive"}
