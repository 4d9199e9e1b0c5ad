"""One model's failing round holds no other model back: it backs off on its own, and the loop
still rests (no busy loop while it waits). One batch whose input cannot be read fails alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from services.api.announcer import ControlAnnouncer
from services.api.dispatch import loop as dispatch_loop
from services.api.dispatch.loop import Dispatcher
from services.api.dispatch.sender import LineSender
from services.api.dispatch.settings import DispatchSettings
from shared.settings import KafkaSettings
from shared.storage import ObjectNotFound
from tests.unit.api.dispatch.test_refusals import FakeProducer, batch, raw_line


class FakeClockValue:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dispatcher(clock: FakeClockValue) -> Dispatcher:
    """A dispatcher whose stores are never reached: the round's steps are replaced below."""
    mongo: Any = SimpleNamespace(batches=None, dispatch_leases=None, dispatch_positions=None)
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


class FakeStore:
    """Stands in for object storage (named fake: unit tests only): ``gone`` keys are not found."""

    def __init__(self, files: dict[str, bytes], gone: set[str]) -> None:
        self.files, self.gone = files, gone

    async def iter_chunks(self, key: str, offset: int = 0, **_: Any) -> AsyncIterator[bytes]:
        if key in self.gone:
            raise ObjectNotFound(key)
        yield self.files[key][offset:]


class FakeBatchStore:
    def __init__(self) -> None:
        self.failed: dict[str, list[Any]] = {}

    async def fail(self, batch_id: str, errors: list[Any]) -> bool:
        self.failed[batch_id] = errors
        return True


async def test_a_batch_whose_input_is_gone_fails_alone_and_the_others_lines_go(clock: FakeClockValue) -> None:
    lines = b"".join(raw_line(f"l{n}") + b"\n" for n in range(3))
    producer = FakeProducer()
    d = dispatcher(clock)
    d.store = FakeStore({"fine-input": lines}, gone={"gone-input"})  # type: ignore[assignment]
    d.batch_store = FakeBatchStore()  # type: ignore[assignment]
    d.sender = LineSender(producer, KafkaSettings())  # type: ignore[arg-type]
    d.announcer = ControlAnnouncer(producer, KafkaSettings())  # type: ignore[arg-type]
    for name in ("gone", "fine"):
        state = batch()
        state.batch_id, state.model, state.object_key = f"batch-{name}", "m", f"{name}-input"
        d.batches[state.unit] = state

    assert await d._dispatch("m", clock.now) == 3
    assert list(d.batches) == ["batch-fine"]
    [error] = d.batch_store.failed["batch-gone"]  # type: ignore[attr-defined]
    assert error.code == "input_unreadable" and "ObjectNotFound" in error.message
    assert producer.controls == [("batch-gone", True)]
    assert producer.logs[0] + producer.logs[1] == 3
