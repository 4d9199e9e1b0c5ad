"""The worker's probes: /livez answers while the loop runs, /readyz names the checks that fail;
/metrics counts every line handled so far."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from services.inference.engine import CHAT
from services.inference.fake_engine import FakeEngine
from services.inference.handler import RequestHandler
from services.inference.health import HealthServer
from services.inference.settings import InferenceSettings
from shared.protocol.messages import RequestMessage

ANY_PORT = InferenceSettings(engine="fake", health_port=0)


async def test_probes_follow_the_checks() -> None:
    state = {"engine": False, "consumer": False, "group_joined": False}
    server = HealthServer(ready=lambda: state["consumer"], settings=ANY_PORT, checks=lambda: dict(state))
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


def _scraped(text: str, sample: str) -> float:
    """A sample's value in a /metrics answer; 0 while the sample is not there yet."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample + " ")]
    return values[0] if values else 0.0


async def test_a_scrape_counts_every_line_handled_before_it() -> None:
    handler = RequestHandler(FakeEngine())
    body = {"messages": [{"role": "user", "content": "one two three"}]}
    server = HealthServer(ready=lambda: True, settings=ANY_PORT)
    async with TestClient(TestServer(server.app())) as client:
        before = await (await client.get("/metrics")).text()
        for i in range(3):
            await handler.handle(RequestMessage(request_id=f"r{i}", custom_id=f"c{i}", url=CHAT, body=body))
        after = await (await client.get("/metrics")).text()
    for sample, added in (
        ('batchstream_inference_requests_total{status="200"}', 3),
        ("batchstream_inference_started_total", 3),
        ("batchstream_inference_prompt_tokens_total", 9),
        ("batchstream_inference_generated_tokens_total", 3),
    ):
        assert _scraped(after, sample) - _scraped(before, sample) == added, sample
