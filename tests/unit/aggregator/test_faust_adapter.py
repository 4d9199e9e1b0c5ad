"""The faust adapter, and one canary per workaround: each fails when faust changes what it works around.

Read with ``services/aggregator/faust_adapter.py``; on a faust upgrade, a failing canary names the
workaround to revisit (drop it if faust fixed the bug, move it if faust moved the internals).
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import faust
import mode
import pytest
from faust import streams
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from services.aggregator.app import app, config, create_app, kafka_settings
from services.aggregator.faust_adapter import ResultsPartitions, label
from services.aggregator.offset_gaps import PartitionOffsets

TP_UNDER_TEST = TP("adapter-test", 0)


@pytest.fixture
def consumer() -> Iterator[Any]:
    """The app's consumer with one partition's commit bookkeeping set by the test, then removed."""
    consumer = cast(Any, app.consumer)
    yield consumer
    for bookkeeping in (consumer._committed_offset, consumer._acked, consumer._acked_index, consumer._gap):
        bookkeeping.pop(TP_UNDER_TEST, None)


def acked_after(consumer: Any, committed: int, acked: list[int]) -> None:
    consumer._committed_offset[TP_UNDER_TEST] = committed
    consumer._acked[TP_UNDER_TEST] = list(acked)
    consumer._acked_index[TP_UNDER_TEST] = set(acked)


# --- 1. fetch wait


def test_the_app_uses_the_transport_with_the_configured_fetch_wait() -> None:
    consumer_class = cast(Any, app.transport).Consumer
    assert consumer_class.thread_class.fetch_max_wait_ms == config.fetch_max_wait_ms


async def test_the_worker_consumer_is_created_with_the_wait() -> None:
    thread = cast(Any, app.consumer)._new_consumer_thread()
    assert thread.fetch_max_wait_ms == config.fetch_max_wait_ms
    consumer = thread._create_worker_consumer(app.transport)
    # aiokafka reads this attribute into its fetcher at start(); an upgrade that renames it
    # must fail here rather than silently bring back faust's 1500 ms.
    assert consumer._fetch_max_wait_ms == config.fetch_max_wait_ms
    assert "_fetch_max_wait_ms" in inspect.getsource(type(consumer).start)
    # Canary: faust still hard-codes the wait it is given no setting for.
    assert "fetch_max_wait_ms=1500" in inspect.getsource(faust_aiokafka.AIOKafkaConsumerThread)


async def test_a_group_instance_id_reaches_the_worker_consumer_as_static_membership() -> None:
    """Static membership goes through faust's public ``consumer_group_instance_id`` setting; this
    checks that faust still hands it to aiokafka's consumer, which sends it on JoinGroup."""
    static = create_app(config.model_copy(update={"group_instance_id": "agg-0"}), kafka_settings)
    thread = cast(Any, static.consumer)._new_consumer_thread()
    consumer = thread._create_worker_consumer(static.transport)
    assert consumer._group_instance_id == "agg-0"
    dynamic = cast(Any, app.consumer)._new_consumer_thread()._create_worker_consumer(app.transport)
    assert dynamic._group_instance_id is None


# --- 2. commit guard


def test_faust_alone_commits_past_an_offset_that_was_never_acked(consumer: Any) -> None:
    """Canary: why the consumer overrides ``_new_offset`` (fails once faust fixes it)."""
    acked_after(consumer, 100, [101, 102])
    assert faust_aiokafka.Consumer._new_offset(consumer, TP_UNDER_TEST) == 103


def test_the_consumer_does_not_commit_past_an_offset_that_was_never_acked(consumer: Any) -> None:
    acked_after(consumer, 100, [101, 102])
    assert consumer._new_offset(TP_UNDER_TEST) is None
    consumer._acked[TP_UNDER_TEST].append(100)
    assert consumer._new_offset(TP_UNDER_TEST) == 103


def test_faust_alone_counts_a_recorded_gap_as_acked(consumer: Any) -> None:
    """Canary: why the consumer overrides ``_add_gap`` (fails once faust stops counting a gap it
    recorded as acked). Offsets 6-20 recorded as a gap while 5-10 were acked: 6-10 are counted
    twice, so a commit moves one offset at a time; with 6-20 never acked, it commits past them."""
    acked_after(consumer, 5, [5, 6, 7, 8, 9, 10])
    asyncio.run(faust_aiokafka.Consumer._add_gap(consumer, TP_UNDER_TEST, 6, 20))
    assert faust_aiokafka.Consumer._new_offset(consumer, TP_UNDER_TEST) == 7
    consumer._gap.pop(TP_UNDER_TEST)
    acked_after(consumer, 5, [5, 21, 22])
    asyncio.run(faust_aiokafka.Consumer._add_gap(consumer, TP_UNDER_TEST, 6, 20))
    assert faust_aiokafka.Consumer._new_offset(consumer, TP_UNDER_TEST) == 23


def test_offsets_the_fetch_loop_skips_stay_a_hole(consumer: Any) -> None:
    """Skipped offsets are neither counted as acked nor committed past: the commit takes every
    offset acked below the hole at once and then waits for the rewinder to fetch the hole."""
    acked_after(consumer, 5, [5, 6, 7, 8, 9, 10, 21, 22])
    asyncio.run(consumer._add_gap(TP_UNDER_TEST, 6, 20))
    assert not consumer._gap.get(TP_UNDER_TEST)
    assert consumer._new_offset(TP_UNDER_TEST) == 11
    consumer._committed_offset[TP_UNDER_TEST] = 11
    assert consumer._new_offset(TP_UNDER_TEST) is None  # 11-20 never acked


# --- 3. offsets view


def test_the_offsets_view_reads_faust_bookkeeping(consumer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Canary: the private attributes the view reads still exist with the shapes it expects."""
    assert isinstance(consumer._unacked_messages, weakref.WeakSet)
    assert consumer._committed_offset[TP("never-seen", 0)] is None
    consumer._committed_offset.pop(TP("never-seen", 0))
    acked_after(consumer, 100, [103, 104])
    asyncio.run(faust_aiokafka.Consumer._add_gap(consumer, TP_UNDER_TEST, 110, 111))  # faust's own record
    results = ResultsPartitions(app, TP_UNDER_TEST.topic)
    monkeypatch.setattr(results, "owned", lambda: [TP_UNDER_TEST])
    monkeypatch.setattr(consumer, "highwater", lambda tp: 120)
    view = results.offsets()
    assert view == {
        TP_UNDER_TEST: PartitionOffsets(
            committed=100, acked=(103, 104), gap_starts=(110,), highwater=120, in_flight=()
        )
    }
    assert results.backlog() == {label(TP_UNDER_TEST): 20}
    assert results.describe()[label(TP_UNDER_TEST)]["unaccounted"] == (100, 103)


def test_nothing_is_owned_before_the_consumer_starts() -> None:
    results = ResultsPartitions(app, "results")
    assert results.owned() == [] and results.backlog() == {} and not results.owns(0)


# --- 4. rewind


def test_faust_still_skips_events_while_flow_control_is_off() -> None:
    """Canary: the drop the gap rewinder repairs (offset_gaps.py): a message pulled while flow
    control is off, or from an older generation, is skipped without being tracked or acked."""
    sources = [inspect.getsource(streams.Stream._py_aiter)]
    pyx = Path(streams.__file__).parent / "_cython" / "streams.pyx"
    if pyx.exists():
        sources.append(pyx.read_text())
    for source in sources:
        assert "flow_control.is_active()" in source and "generation_id" in source
        skip = source.index("flow_control.is_active()")
        assert skip < source.index("add_unacked", skip)  # skipped before it is tracked
    assert inspect.iscoroutinefunction(faust_aiokafka.Consumer.seek_wait)


# --- 5. phase and recovery


def test_recovery_exposes_its_position_and_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Canary: the public-but-undocumented flags and counters the phase is read from."""
    recovery = cast(Any, app.tables).recovery
    assert recovery.in_recovery is False and app.in_recovery is False and app.rebalancing is False
    results = ResultsPartitions(app, "results")
    assert results.phase() == "unassigned"
    monkeypatch.setitem(recovery.active_offsets, TP_UNDER_TEST, 41)
    assert results.recovery_position() == 0  # not recovering
    monkeypatch.setattr(app, "rebalancing", True)
    assert results.phase() == "rebalancing"
    monkeypatch.setattr(app, "in_recovery", True)  # faust keeps ``rebalancing`` set during recovery
    assert results.phase() == "recovering" and results.recovery_position() == 41


# --- 6. a service that runs before table recovery ends


def test_app_timers_wait_for_table_recovery() -> None:
    """Canary: why the stall check is not an ``@app.timer`` (fails once faust starts timers early)."""
    source = inspect.getsource(faust.App.on_started)
    assert source.index("_wait_for_table_recovery_completed") < source.index("on_started_init_extra_tasks")
    assert source.index("_wait_for_table_recovery_completed") < source.index("on_started_init_extra_services")


async def test_a_dependency_starts_before_on_started() -> None:
    """Canary: mode starts a child service before the parent's ``on_started`` (where faust waits
    for table recovery), and stops it after the parent's ``on_stop``."""
    events: list[str] = []
    recovered, child_started = asyncio.Event(), asyncio.Event()

    class Child(mode.Service):
        async def on_start(self) -> None:
            events.append("child started")
            child_started.set()

        async def on_stop(self) -> None:
            events.append("child stopped")

    class Parent(mode.Service):
        async def on_started(self) -> None:
            await recovered.wait()  # a table recovery that has not ended

        async def on_stop(self) -> None:
            events.append("parent stopped")

    parent = Parent()
    parent.add_dependency(Child())
    starting = asyncio.create_task(parent.start())
    await asyncio.wait_for(child_started.wait(), 5)
    assert not starting.done()  # the parent is still in its "recovery"
    recovered.set()
    await starting
    await parent.stop()
    assert events == ["child started", "parent stopped", "child stopped"]


# --- 7. eager delivery


def test_faust_still_delivers_each_message_through_wait_first() -> None:
    """Canary: the per-message race the eager path shortcuts."""
    source = inspect.getsource(faust_aiokafka.Consumer._drain_messages)
    assert "self.wait_first(" in source and "callback(message), self.suspend_flow.wait()" in source


class Delivery:
    """A stand-in delivery callback: finishes at once, or waits until ``release`` is set."""

    def __init__(self, release: asyncio.Event | None = None) -> None:
        self.release = release
        self.delivered: list[int] = []

    async def __call__(self, message: int) -> int:
        if self.release is not None:
            await self.release.wait()
        self.delivered.append(message)
        return message


async def test_a_delivery_that_does_not_wait_is_done_when_wait_first_returns() -> None:
    consumer = cast(Any, app.consumer)
    deliver = Delivery()
    results = await consumer.wait_first(deliver(1), consumer.suspend_flow.wait())
    assert deliver.delivered == [1] and results.results == [1] and not results.stopped


async def test_a_delivery_that_waits_goes_on_from_where_it_stopped() -> None:
    consumer = cast(Any, app.consumer)
    release = asyncio.Event()
    deliver = Delivery(release)
    waiting = asyncio.ensure_future(consumer.wait_first(deliver(2), consumer.suspend_flow.wait()))
    await asyncio.sleep(0.01)
    assert not waiting.done() and deliver.delivered == []
    release.set()
    results = await asyncio.wait_for(waiting, 5)
    assert deliver.delivered == [2] and results.results == [2]


async def test_suspended_flow_still_wins_over_a_waiting_delivery() -> None:
    consumer = cast(Any, app.consumer)
    deliver = Delivery(asyncio.Event())
    consumer.suspend_flow.set()
    try:
        results = await asyncio.wait_for(consumer.wait_first(deliver(3), consumer.suspend_flow.wait()), 5)
    finally:
        consumer.suspend_flow.clear()
    assert deliver.delivered == [] and results.results == [True]  # the flow wait won
