"""What /livez, /readyz (and /health, the same page) answer in each state."""

from __future__ import annotations

from services.aggregator import metrics, pages


class FakeDependencies:
    def __init__(self, up: bool) -> None:
        self.up = up

    async def healthy(self) -> bool:
        return self.up


def test_livez_answers_while_the_loop_runs_whatever_the_phase() -> None:
    assert pages.livez("recovering") == pages.Page(200, {"status": "alive", "phase": "recovering"})


async def test_readyz_is_503_with_the_reason_when_stalled_even_if_dependencies_answer() -> None:
    answer = await pages.readyz(
        stalled="no results processed for 120 s",
        phase="recovering",
        dependencies=FakeDependencies(True),
        backlog={},
    )
    assert answer.status == 503 and answer.body["status"] == "stalled"
    assert answer.body["reason"] == "no results processed for 120 s" and answer.body["phase"] == "recovering"


async def test_readyz_is_503_before_the_clients_exist_and_when_a_dependency_is_down() -> None:
    starting = await pages.readyz(stalled=None, phase="unassigned", dependencies=None, backlog={})
    assert (starting.status, starting.body["status"]) == (503, "starting")
    down = await pages.readyz(
        stalled=None, phase="processing", dependencies=FakeDependencies(False), backlog={}
    )
    assert (down.status, down.body["status"]) == (503, "unhealthy")


async def test_readyz_is_200_with_the_backlog_when_ready() -> None:
    answer = await pages.readyz(
        stalled=None, phase="processing", dependencies=FakeDependencies(True), backlog={"results[0]": 3}
    )
    assert answer == pages.Page(
        200, {"status": "healthy", "phase": "processing", "backlog": {"results[0]": 3}}
    )


def test_metrics_exposes_the_stall_counter_and_the_phase() -> None:
    assert metrics.STALLS is not None  # registered at import, served by the page
    body, content_type = pages.metrics()
    assert content_type.startswith("text/plain")
    assert b"batchstream_aggregator_stalls_total" in body and b"batchstream_aggregator_phase" in body
