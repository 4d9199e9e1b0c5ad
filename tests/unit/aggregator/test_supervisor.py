"""The stall check in every phase (table recovery, rebalance, processing): fake clock, fake view."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.aggregator import metrics
from services.aggregator.supervisor import StallSupervisor
from services.aggregator.watchdog import StallWatchdog
from tests.support.fakes import FakeClock, FakeResultsView


@dataclass
class FakeExit:
    delays: list[float] = field(default_factory=list)

    def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)


def make(
    view: FakeResultsView, timeout_s: float = 120, unassigned_s: float = 300
) -> tuple[StallSupervisor, FakeClock, FakeExit]:
    clock, exits = FakeClock(), FakeExit()
    watchdog = StallWatchdog(timeout_s, unassigned_s, clock=clock)
    return StallSupervisor(watchdog, view, exit_delay_s=5, exit_after=exits), clock, exits


def stalls() -> float:
    return metrics.STALLS._value.get()


def test_a_table_recovery_that_reads_nothing_while_results_wait_is_a_stall_with_fake_clock() -> None:
    """The case seen after a broker restart: stuck in recovery 8+ minutes, /health 200."""
    view = FakeResultsView(waiting={"results[0]": None}, current_phase="recovering", position=500)
    supervisor, clock, exits = make(view)
    before = stalls()
    for _ in range(23):
        assert supervisor.tick() is None
        clock.advance(5)
    clock.advance(5)
    reason = supervisor.tick()
    assert reason is not None and "phase: recovering" in reason and "no fetch answer yet" in reason
    assert supervisor.reason == reason and exits.delays == [5]
    assert stalls() == before + 1
    assert supervisor.tick() == reason and exits.delays == [5]  # reported and exited once


def test_a_long_table_recovery_that_advances_is_not_a_stall_with_fake_clock() -> None:
    view = FakeResultsView(current_phase="recovering")
    supervisor, clock, exits = make(view)
    for _ in range(200):  # 1000 s of recovery, reading changelog records all along
        assert supervisor.tick() is None
        clock.advance(5)
        view.position += 100
    assert not exits.delays
    view.current_phase, view.waiting = "processing", {"results[0]": 0}
    assert supervisor.tick() is None and supervisor.phase == "processing"


def test_a_rebalance_that_never_assigns_a_partition_is_a_stall_with_fake_clock() -> None:
    view = FakeResultsView(waiting={}, current_phase="rebalancing")
    supervisor, clock, exits = make(view, unassigned_s=300)
    assert supervisor.tick() is None
    clock.advance(300)
    reason = supervisor.tick()
    assert reason is not None and "owned no results partition" in reason and "phase: rebalancing" in reason
    assert exits.delays == [5]


def test_processing_that_stops_while_results_wait_is_a_stall_with_fake_clock() -> None:
    view = FakeResultsView(waiting={"results[0]": 40}, current_phase="processing")
    supervisor, clock, exits = make(view, timeout_s=60)
    for _ in range(10):
        clock.advance(50)
        supervisor.progress()  # the agent got a chunk
        assert supervisor.tick() is None
    clock.advance(60)
    reason = supervisor.tick()
    assert reason is not None and "results[0]: 40 waiting" in reason and "phase: processing" in reason
    assert exits.delays == [5]


def test_an_idle_worker_in_any_phase_with_nothing_waiting_never_stalls_with_fake_clock() -> None:
    view = FakeResultsView(waiting={"results[0]": 0, "results[1]": 0}, current_phase="processing")
    supervisor, clock, exits = make(view)
    for _ in range(100):
        clock.advance(60)
        assert supervisor.tick() is None
    assert not exits.delays and supervisor.reason is None
