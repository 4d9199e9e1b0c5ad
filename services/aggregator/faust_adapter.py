"""Everything the aggregator takes from faust beyond its public API, in one place.

faust-streaming stays the aggregator's framework; this module is where its private internals are
read or patched, so a faust upgrade means re-reading one file and re-running one test file
(``tests/unit/aggregator/test_faust_adapter.py``: one canary per workaround, each failing when
faust changes what it works around). Measured on faust-streaming 0.15.3 with aiokafka 0.14.

The workarounds:

1. **Fetch wait** (``ConsumerThread``): faust hard-codes ``fetch_max_wait_ms=1500``; a broker that
   holds a fetch for the full wait (Tansu) delivered results in bursts up to 1.5 s apart. Set from
   the settings.
2. **Commit guard and no recorded gaps** (``Consumer._new_offset``, ``Consumer._add_gap``): faust
   commits past an offset that was never acked, and records skipped offsets as broker gaps that
   it counts as acked.
3. **Offsets view** (``ResultsPartitions.offsets``): faust's commit bookkeeping (committed, acked,
   recorded gaps, messages in flight) is private; the gap rewinder (``offset_gaps.py``) and the
   stall watchdog (``watchdog.py``) read it without a call into faust's consumer thread, which is
   the part that can hang.
4. **Rewind** (``ResultsPartitions.rewind``): faust drops results during a rebalance and never
   fetches them again; the gap rewinder seeks the partition back (``offset_gaps.py`` says how).
5. **Phase and recovery progress** (``ResultsPartitions.phase``/``recovery_position``): which of
   owning nothing, rebalancing, table recovery or processing the worker is in, for the watchdog.
6. **A service that runs before table recovery ends** (``start_with_app``): faust starts
   ``@app.timer`` and ``@app.service`` only once the first table recovery is over, so a watchdog
   declared that way is silent while a recovery hangs (seen: 8+ minutes, /health 200).
7. **Eager delivery** (``Consumer.wait_first``): faust hands each fetched message to its
   stream through four new tasks; delivery starts at once here, and only a delivery that has to
   wait takes faust's way.

Only this module, ``app.py``, ``topics.py``, ``tables.py``, ``agents.py`` and ``worker.py``
import faust; the processing core never does (``tests/unit/aggregator/test_layering.py``).
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import AsyncIterator, Coroutine, Generator
from typing import Any, Literal, cast

import aiokafka
import faust
from faust import Stream
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, EventT, StreamT
from mode import ServiceT
from mode.services import WaitResults

from services.aggregator.offset_gaps import PartitionOffsets, describe, lowest_acked

__all__ = [
    "TP",
    "Consumer",
    "ConsumerThread",
    "Phase",
    "ResultsPartitions",
    "install_transport",
    "label",
    "noack_chunks",
    "start_with_app",
    "transport_class",
]

Phase = Literal["unassigned", "rebalancing", "recovering", "processing"]


# --- 1. fetch wait


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread, creating its aiokafka consumer with a configured fetch wait.

    faust 0.15 hard-codes ``fetch_max_wait_ms=1500`` for its worker consumer. Real Kafka answers a
    fetch as soon as ``fetch_min_bytes`` (1) are there, so the wait only bounds an idle poll; Tansu
    (the test and local broker) holds every fetch for the full wait even when records arrive
    meanwhile (measured: a record produced mid-fetch was delivered ~0.38 s later at 1500 ms,
    ~0.012 s at 100 ms), so results reached the aggregator in bursts up to 1.5 s apart. A short wait
    costs an idle consumer a few empty fetches a second on either broker. faust has no setting, so
    this sets aiokafka's attribute before ``start()`` reads it into the fetcher.
    Canary: ``test_the_worker_consumer_is_created_with_the_wait``.
    """

    fetch_max_wait_ms = 1500  # faust's; replaced by ``transport_class``

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms
        return consumer


# --- 2. commit guard


class Consumer(faust_aiokafka.Consumer):
    thread_class: type[ConsumerThread] = ConsumerThread

    def _new_offset(self, tp: TP) -> int | None:
        """faust's, except that it never commits past an offset that was not acked.

        faust's committed offset is the next one to process, but its check for a hole below the
        acked offsets treats it as the last one processed: with offset ``c`` committed and
        ``c + 1`` the lowest acked, it commits past ``c`` although ``c`` was never acked. When
        faust has dropped ``c`` (offset_gaps.py) that result would never be counted. Here any
        hole makes it wait, and the gap rewinder fetches the hole again. The results topics have
        no broker offset gaps of their own (no transactions, no compaction), so a hole is a drop.
        Canary: ``test_faust_alone_commits_past_an_offset_that_was_never_acked``.
        """
        committed = self._committed_offset.get(tp)
        gaps = (gap.begin for gap in self._gap.get(tp) or ())
        lowest = lowest_acked(self._acked.get(tp) or (), gaps)
        if committed is not None and lowest is not None and lowest > committed:
            return None
        return super()._new_offset(tp)

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        """Record nothing: on the results topic an offset the fetch loop skips was dropped.

        faust records a "broker offset gap" whenever its fetch loop hands out an offset more than
        one past the last one it read (``_drain_messages``), and ``_new_offset`` later counts the
        gap as acked. Real gaps come from transactions and compaction, which the results topics
        never have (this app's only acking topic). The jumps seen here came from the seek to the
        committed offsets at the end of table recovery (and from the rewind), while the fetch
        loop still handed out what it fetched before the seek. Measured in
        ``tests/integration/test_aggregator.py`` under CPU load, after a SIGKILL and restart:

        - offsets that were delivered again after the seek were then in ``_acked`` twice, and
          faust's run of consecutive offsets stops at a repeat, so each commit moved one offset
          (one per ``broker_commit_interval``: 5 to 19 in 7 s). Meanwhile the lowest acked offset
          sat below the committed one, so the gap rewinder saw no hole above it until the
          commit crawled up to it. With more repeats than that, the 15 s stall watchdog of that
          test fires first (CI: the rewind came 15 s late, /health answered 503);
        - offsets never delivered at all were committed past as if processed: the committed
          offset jumped from 19 to 1713 and the batch's missing lines never came (it completed
          only when a fresh consumer group read the topic again).

        Without the record a skipped offset is a hole: the commit guard above waits on it and
        the gap rewinder fetches it again (offset_gaps.py).
        Canary: ``test_faust_alone_counts_a_recorded_gap_as_acked``.
        """
        self.log.dev("offsets %r-%r of %r skipped by the fetch loop: a hole", offset_from, offset_to, tp)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return self.thread_class(self, loop=self.loop, beacon=self.beacon)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> Any:  # noqa: ASYNC109 - mode's signature
        """mode's, except that a coroutine that finishes without suspending wins at once.

        faust's consumer delivers every fetched message as ``wait_first(callback(message),
        suspend_flow.wait())``: mode wraps the delivery, that wait and the consumer's stopped and
        crashed waits in four tasks, waits for the first, and cancels the other three. Delivery
        (putting the event in the stream's queue) almost never suspends, so that was ~12 event
        loop callbacks per result and the largest share of the aggregator's CPU (cProfile,
        docs/benchmarks.md). Here the first coroutine runs at once when the consumer
        is neither stopping nor suspending flow; if it suspends (the stream's buffer is full) it
        goes on, from where it stopped, through mode's ``wait_first`` as before. The message
        then is delivered exactly as faust would deliver it.
        Canary: ``test_faust_still_delivers_each_message_through_wait_first``.
        """
        first = coros[0] if coros else None
        if not (
            inspect.iscoroutine(first)
            and timeout is None
            and not (self.suspend_flow.is_set() or self._stopped.is_set() or self._crashed.is_set())
        ):
            return await super().wait_first(*coros, timeout=timeout)
        try:
            suspended_on = first.send(None)
        except StopIteration as done:
            for other in coros[1:]:
                if inspect.iscoroutine(other):
                    other.close()  # never started
            return WaitResults([first], [done.value], False)
        return await super().wait_first(_Resumed(first, suspended_on), *coros[1:])


class _Resumed:
    """The rest of a coroutine that was started by hand and suspended on ``suspended_on``:
    awaiting this hands that future to the awaiting task, then drives the coroutine as
    ``await coro`` would have (what the task sends or throws in is passed on)."""

    def __init__(self, coro: Coroutine[Any, Any, Any], suspended_on: Any) -> None:
        self._coro = coro
        self._suspended_on = suspended_on

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self._coro, self._suspended_on
        while True:
            try:
                sent = yield pending
            except BaseException as exc:  # passed on, as ``await`` does
                try:
                    pending = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as done:
                    return done.value


def transport_class(fetch_max_wait_ms: int) -> type[faust_aiokafka.Transport]:
    """An aiokafka transport class with the commit guard and a ``fetch_max_wait_ms`` fetch wait."""
    thread = type("ConsumerThread", (ConsumerThread,), {"fetch_max_wait_ms": fetch_max_wait_ms})
    consumer = type("Consumer", (Consumer,), {"thread_class": thread})
    return type("Transport", (faust_aiokafka.Transport,), {"Consumer": consumer})


def install_transport(app: faust.App, fetch_max_wait_ms: int) -> None:
    """Give ``app`` the patched transport; call it before anything touches ``app.transport``
    (declaring a topic does, so right after building the app)."""
    app.transport = transport_class(fetch_max_wait_ms)(app.conf.broker_consumer, app)


# --- 3-5. the results partitions as faust sees them


def label(tp: TP) -> str:
    """``topic[partition]``, as logs, /health and the watchdog name a partition."""
    return f"{tp.topic}[{tp.partition}]"


class ResultsPartitions:
    """The results partitions this worker owns, read from faust's bookkeeping.

    Every read is of state in the event loop's thread, never a call into faust's consumer thread
    (which is what hangs when faust is stuck), so /health and the watchdog answer even then.
    """

    def __init__(self, app: faust.App, topic: str) -> None:
        self._app = app
        self._topic = topic

    def owns(self, partition: int) -> bool:
        """True when this worker is the active owner of that results partition."""
        return any(
            tp.topic == self._topic and tp.partition == partition
            for tp in self._app.assignor.assigned_actives()
        )

    def owned(self) -> list[TP]:
        """Actively owned results partitions that the consumer has assigned too."""
        try:
            assigned = self._app.consumer.assignment()
        except Exception:  # ConsumerNotStarted: no partitions yet
            return []
        return [
            tp for tp in self._app.assignor.assigned_actives() if tp.topic == self._topic and tp in assigned
        ]

    def offsets(self) -> dict[TP, PartitionOffsets]:
        """faust's commit bookkeeping of each owned partition (private attributes, faust 0.15.3).

        ``_committed_offset`` is the next offset faust committed or found committed on
        assignment; ``_acked`` the offsets acked since; ``_gap`` the broker offset gaps it
        recorded (it counts them as acked; none here, see ``Consumer._add_gap``);
        ``_unacked_messages`` a weak set of the messages handed to agents (acked ones linger in
        it). ``highwater`` is aiokafka's last fetch answer (``None`` before the first one; every
        broker gets the fetch's mark right, while Tansu answers ListOffsets LATEST wrongly).
        Canary: ``test_the_offsets_view_reads_faust_bookkeeping``.
        """
        consumer = cast(Any, self._app.consumer)
        in_flight: dict[TP, list[int]] = collections.defaultdict(list)
        for message in list(consumer._unacked_messages):
            if not message.acked:
                in_flight[message.tp].append(message.offset)
        view: dict[TP, PartitionOffsets] = {}
        for tp in self.owned():
            try:
                highwater = consumer.highwater(tp)
            except AssertionError:  # aiokafka: revoked since ``assignment()``
                continue
            view[tp] = PartitionOffsets(
                committed=consumer._committed_offset.get(tp),
                acked=tuple(consumer._acked.get(tp) or ()),
                gap_starts=tuple(gap.begin for gap in consumer._gap.get(tp) or ()),
                highwater=highwater,
                in_flight=tuple(in_flight.get(tp, ())),
            )
        return view

    def backlog(self) -> dict[str, int | None]:
        """Results waiting per owned partition: fetch high-water mark minus committed offset.

        ``None`` when the consumer has had no fetch answer for it yet (paused partitions during a
        table recovery get none): unknown, which the watchdog counts as waiting.
        """
        return {
            label(tp): None
            if offsets.highwater is None
            else max(offsets.highwater - (offsets.committed or 0), 0)
            for tp, offsets in self.offsets().items()
        }

    def describe(self, view: dict[TP, PartitionOffsets] | None = None) -> dict[str, dict[str, Any]]:
        """A short account of ``offsets()`` (or of ``view``) for the log."""
        return {label(tp): describe(offsets) for tp, offsets in (view or self.offsets()).items()}

    async def rewind(self, tp: TP, offset: int) -> None:
        """Fetch ``tp`` again from ``offset``: the only way to get back what faust dropped.

        Canary: ``test_faust_still_skips_events_while_flow_control_is_off``.
        """
        await self._app.consumer.seek_wait({tp: offset})

    def phase(self) -> Phase:
        """What the worker is doing, from faust's public flags.

        faust sets ``rebalancing`` when partitions are revoked and clears it only at the end of
        the table recovery that follows, so ``in_recovery`` is read first.
        """
        app = self._app
        if app.in_recovery:
            return "recovering"
        if app.rebalancing:
            return "rebalancing"
        if not self.owned():
            return "unassigned"
        return "processing"

    def recovery_position(self) -> int:
        """Changelog records table recovery has read so far (grows while recovery progresses).

        ``Recovery.active_offsets`` is public but undocumented; 0 outside a recovery (the recovery
        service is created lazily: reading it earlier would create it before faust does). Canary:
        ``test_recovery_exposes_its_position_and_flag``.
        """
        if not self._app.in_recovery:
            return 0
        offsets = cast(Any, self._app.tables).recovery.active_offsets
        return sum(offset for offset in offsets.values() if isinstance(offset, int))


# --- the agent's stream


async def noack_chunks(
    stream: StreamT[bytes], max_: int, within_s: float
) -> AsyncIterator[list[EventT[bytes]]]:
    """Short polls of events the agent acks itself (``Stream.ack``) once a chunk is stored.

    faust types ``noack_take``'s items as values; they are the events.
    """
    async for items in cast(Stream[bytes], stream).noack_take(max_, within=within_s):
        yield cast(list[EventT[bytes]], items)


# --- 6. a service that runs in every phase


def start_with_app(app: faust.App, service: ServiceT) -> None:
    """Start ``service`` with the app, before table recovery, and stop it after the app's own.

    ``@app.timer``, ``@app.task`` and ``@app.service`` start from ``App.on_started``, which first
    waits for the first table recovery to complete: a recovery that never completes (seen after a
    broker restart: "No event received for active tp ... since recovery start" for 8+ minutes)
    leaves them never started, while the web server (a boot service) answers. A dependency added
    before the app starts is a child service: mode starts it before ``on_started`` and stops it
    after the app's ``on_stop`` (which sends ``on_before_shutdown``). Canary:
    ``test_app_timers_wait_for_table_recovery`` and ``test_a_dependency_starts_before_on_started``.
    """
    app.add_dependency(service)
