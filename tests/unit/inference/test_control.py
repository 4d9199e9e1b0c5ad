"""BatchControl (merging control facts) and the handler's cancellation: skipped and aborted lines."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY

from services.inference.control import FORGET_AFTER_S, BatchControl
from services.inference.engine import CHAT, Answer
from services.inference.fake_engine import FakeEngine
from services.inference.handler import RequestHandler
from services.inference.scheduler import EngineScheduler
from services.inference.settings import InferenceSettings
from shared.protocol.messages import ControlMessage, RequestMessage


def test_facts_merge_and_a_cancellation_is_final() -> None:
    control = BatchControl()
    assert not control.apply(ControlMessage(batch_id="b", total=3, expires_at=100.0))
    assert control.apply(ControlMessage(batch_id="b", cancelled=True))  # names no deadline
    assert control.cancelled("b") and control.expires_at("b") == 100.0
    assert not control.apply(ControlMessage(batch_id="b", cancelled=True))  # not newly
    control.apply(ControlMessage(batch_id="b", total=3))
    assert control.cancelled("b")
    assert not control.cancelled("other") and not control.cancelled(None)
    control.forget("b")
    assert not control.cancelled("b")


def test_prune_drops_long_expired_batches_only() -> None:
    now = 10 * FORGET_AFTER_S
    control = BatchControl(clock=lambda: now)
    control.apply(ControlMessage(batch_id="old", expires_at=now - FORGET_AFTER_S - 1))
    control.apply(ControlMessage(batch_id="recent", expires_at=now - 1))
    control.apply(ControlMessage(batch_id="cancelled", cancelled=True))
    assert control.prune() == 1
    assert control.expires_at("recent") and control.cancelled("cancelled") and len(control) == 2


class SlowFakeEngine(FakeEngine):
    """Runs until released or aborted; an abort raises RequestAborted out of ``run`` (the rule)."""

    def __init__(self, max_running: int = 0) -> None:
        super().__init__(model_id="m", max_running=max_running)
        self.started: dict[str, asyncio.Event] = {}
        self.priorities: list[int] = []
        self.release = asyncio.Event()
        self.aborted: list[str] = []
        self._changed = asyncio.Event()

    async def wait_started(self, count: int) -> None:
        while len(self.started) < count:
            await self._changed.wait()
            self._changed.clear()

    async def run(self, url, body, request_id, *, max_context_length=None, priority=0):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.priorities.append(priority)
        self.started.setdefault(request_id, asyncio.Event()).set()
        self._changed.set()
        return await self._runs.run(request_id, self._until_released())

    async def _until_released(self) -> Answer:
        await self.release.wait()
        return Answer.of(200, {"usage": {}})

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        await super().abort(request_id)


async def settled(condition: Callable[[], bool], steps: int = 100) -> bool:
    """Whether ``condition`` holds once the event loop has run the other tasks' ready steps."""
    for _ in range(steps):
        if condition():
            return True
        await asyncio.sleep(0)
    return condition()


def line(batch_id: str | None = "b", n: int = 1, **kw: Any) -> RequestMessage:
    return RequestMessage(
        request_id=f"batch_req_{n}",
        custom_id=f"c{n}",
        url=CHAT,
        body={"messages": [{"role": "user", "content": "hi"}]},
        batch_id=batch_id,
        line=n,
        **kw,
    )


def on_running_places(engine: SlowFakeEngine, young_batch_lines: int) -> RequestHandler:
    """A handler whose places are only the engine's running sequences (none waits inside it) and
    whose young lines leave the other batches every place that is left."""
    settings = InferenceSettings(
        engine="fake", young_batch_lines=young_batch_lines, engine_queue_lines=0, young_batch_others_share=1.0
    )
    scheduler = EngineScheduler(engine, settings)
    return RequestHandler(engine, scheduler=scheduler)


async def test_a_line_of_a_cancelled_batch_is_not_run() -> None:
    engine = FakeEngine()
    handler = RequestHandler(engine)
    handler.control.apply(ControlMessage(batch_id="b", cancelled=True))
    result = await handler.handle(line())
    assert result.response is None and result.error is not None
    assert result.error.code == "batch_cancelled" and (result.batch_id, result.line) == ("b", 1)
    assert engine.calls == 0
    assert (await handler.handle(line("other"))).succeeded


def test_the_handler_uses_the_control_it_is_given_even_when_empty() -> None:
    control = BatchControl()  # empty, so falsy: must still be the one the follower feeds
    assert RequestHandler(FakeEngine(), control=control).control is control


async def test_the_deadline_may_come_from_the_control_topic() -> None:
    handler = RequestHandler(FakeEngine(), clock=lambda: 50.0)
    handler.control.apply(ControlMessage(batch_id="b", expires_at=10.0))
    result = await handler.handle(line())
    assert result.error is not None and result.error.code == "batch_expired"


async def test_running_lines_of_a_cancelled_batch_are_aborted_and_answered() -> None:
    engine = SlowFakeEngine()
    handler = RequestHandler(engine)
    doomed = asyncio.create_task(handler.handle(line("b", 1)))
    kept = asyncio.create_task(handler.handle(line("keep", 2)))
    await engine.wait_started(2)
    assert handler.scheduler.running("b") == 1
    handler.control.apply(ControlMessage(batch_id="b", cancelled=True))
    await handler.cancel_batch("b")
    result = await doomed
    assert result.error is not None and result.error.code == "batch_cancelled"
    assert len(engine.aborted) == 1 and handler.scheduler.running("b") == 0
    engine.release.set()
    assert (await kept).succeeded


async def test_an_abort_for_shutdown_raises_and_publishes_nothing() -> None:
    engine = SlowFakeEngine()
    handler = RequestHandler(engine)
    handler.control.apply(ControlMessage(batch_id="b", cancelled=False, total=1))
    task = asyncio.create_task(handler.handle(line()))
    await engine.wait_started(1)
    task.cancel()  # a drain timeout cancels the consumer's task
    done = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert handler.scheduler.running("b") == 0


async def test_a_batch_with_fewer_lines_on_the_engine_is_queued_first() -> None:
    """The engine's queue order: a batch that just arrived goes before the lines a running batch
    already has on the engine; direct requests count as one group; a finished line frees its rank."""
    engine = SlowFakeEngine()
    handler = RequestHandler(engine)

    def line(batch_id: str | None, n: int) -> RequestMessage:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        return RequestMessage(
            request_id=f"r-{batch_id}-{n}", custom_id=f"{n}", url=CHAT, body=body, batch_id=batch_id
        )

    async def admit(*messages: RequestMessage) -> list[asyncio.Task[Any]]:
        tasks = []
        for msg in messages:
            tasks.append(asyncio.create_task(handler.handle(msg)))
            await engine.wait_started(len(engine.started))  # started in this order
            await asyncio.sleep(0)
        return tasks

    big = await admit(*(line("big", n) for n in range(3)))
    small = await admit(line("small", 0), line("small", 1), line(None, 0), line(None, 1))
    assert engine.priorities == [0, 1, 2, 0, 1, 0, 1]
    engine.release.set()
    await asyncio.gather(*big, *small)
    engine.release.clear()
    later = await admit(line("big", 9))
    assert engine.priorities[-1] == 0  # nothing of it left on the engine
    engine.release.set()
    await asyncio.gather(*later)


async def test_a_young_batch_takes_the_places_of_the_heaviest_batchs_newest_lines() -> None:
    """Places and preemption: 3 places, 4 lines of a big batch (3 run, 1 waits). Each of a new
    batch's first two lines runs at once and aborts the big batch's newest running line, which
    waits again; the third waits. Every line is answered once."""
    engine = SlowFakeEngine(max_running=3)
    handler = on_running_places(engine, young_batch_lines=2)
    before = REGISTRY.get_sample_value("batchstream_inference_preempted_total") or 0.0
    big = [asyncio.create_task(handler.handle(line("big", n))) for n in range(4)]
    await engine.wait_started(3)
    big_runs = list(engine.started)
    small = [asyncio.create_task(handler.handle(line("small", 10 + n))) for n in range(3)]
    await engine.wait_started(5)
    assert await settled(lambda: handler.scheduler.places.waiting() == 4)  # big 3, the aborted two, small 12
    assert engine.aborted == [big_runs[2], big_runs[1]]
    assert handler.scheduler.running("small") == 2 and handler.scheduler.running("big") == 1
    assert (REGISTRY.get_sample_value("batchstream_inference_preempted_total") or 0.0) - before == 2
    engine.release.set()
    results = await asyncio.gather(*big, *small)
    assert all(r.succeeded for r in results)
    assert [r.line for r in results] == [0, 1, 2, 3, 10, 11, 12]
    assert engine.calls == 9 and handler.scheduler.places.used == 0


async def test_no_preemption_for_a_direct_request_or_beside_a_young_batch() -> None:
    engine = SlowFakeEngine(max_running=3)
    handler = on_running_places(engine, young_batch_lines=3)
    tasks = [asyncio.create_task(handler.handle(line("big", n))) for n in range(2)]
    tasks.append(asyncio.create_task(handler.handle(line("new", 5))))  # the third place: free
    await engine.wait_started(3)
    tasks.append(asyncio.create_task(handler.handle(line(None, 6))))  # a pipeline's: never jumps
    tasks.append(asyncio.create_task(handler.handle(line("newer", 7))))  # the heaviest is young
    assert await settled(lambda: handler.scheduler.places.waiting() == 2)
    assert engine.aborted == [] and len(engine.started) == 3
    engine.release.set()
    assert all(r.succeeded for r in await asyncio.gather(*tasks))


async def test_a_cancelled_batchs_lines_waiting_for_a_place_are_answered_without_running() -> None:
    engine = SlowFakeEngine(max_running=1)
    handler = on_running_places(engine, young_batch_lines=0)
    running, waiting = (asyncio.create_task(handler.handle(line("b", n))) for n in range(2))
    await engine.wait_started(1)
    assert await settled(lambda: handler.scheduler.places.waiting() == 1)
    handler.control.apply(ControlMessage(batch_id="b", cancelled=True))
    await handler.cancel_batch("b")
    for result in await asyncio.gather(running, waiting):
        assert result.error is not None and result.error.code == "batch_cancelled"
    assert engine.calls == 1 and handler.scheduler.places.used == 0
