"""One model's failing round holds no other model back: it backs off on its own, and the loop
still rests (no busy loop while it waits)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from services.api.dispatch import loop as dispatch_loop
from services.api.dispatch.loop import Dispatcher
from services.api.dispatch.settings import DispatchSettings
from shared.settings import KafkaSettings
from tests.unit.api.dispatch.test_refusals import batch


class FakeClockValue:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dispatcher(clock: FakeClockValue) -> Dispatcher:
    """A dispatcher whose stores are never reached: the round's steps are replaced below."""
    mongo: Any = SimpleNamespace(dispatch_leases=None, dispatch_positions=None)
    return Dispatcher(
        mongo=mongo,
        batches=None,  # type: ignore[arg-type]
        files=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        producer=None,  # type: ignore[arg-type]
        kafka=KafkaSettings(),
        settings=DispatchSettings(),
        owner="test",
        clock=clock,
    )


@pytest.fixture
def clock() -> FakeClockValue:
    return FakeClockValue()


async def test_a_model_whose_round_fails_backs_off_while_the_other_goes_on(
    clock: FakeClockValue, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = dispatcher(clock)
    for name in ("broken", "fine"):
        state = batch()
        state.batch_id, state.model = f"batch-{name}", name
        d.batches[state.unit] = state
    d._refresh_now = False
    d._refreshed_at = clock.now
    d._journeys_at = clock.now
    dispatched: list[str] = []

    async def lead(model: str, now: float) -> bool:
        return True

    async def meter(model: str, now: float) -> None:
        return None

    async def dispatch(model: str, now: float) -> int:
        dispatched.append(model)
        if model == "broken":
            raise RuntimeError("the topic cannot be written")
        return 5

    async def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(d, "_lead", lead)
    monkeypatch.setattr(d, "_meter", meter)
    monkeypatch.setattr(d, "_dispatch", dispatch)
    monkeypatch.setattr(d, "_save_positions", nothing)

    assert await d.round() == 5
    assert dispatched == ["broken", "fine"]
    broken = d.models["broken"]
    assert broken.failures == 1 and broken.retry_at == clock.now + dispatch_loop.MODEL_RETRY_S

    clock.now += dispatch_loop.MODEL_RETRY_S / 2  # still backing off: only the other model runs
    assert await d.round() == 5
    assert dispatched == ["broken", "fine", "fine"]
    assert 0 < d._pause(clock.now) <= dispatch_loop.MODEL_RETRY_S / 2 + 1e-9

    clock.now = broken.retry_at  # tried again, failing again: the wait doubles
    await d.round()
    assert broken.failures == 2 and broken.retry_at == clock.now + 2 * dispatch_loop.MODEL_RETRY_S
