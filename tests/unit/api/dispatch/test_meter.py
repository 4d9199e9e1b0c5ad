"""The backlog target and allowance, from our send offsets and the group's commits (fake clock)."""

from __future__ import annotations

from services.api.dispatch.meter import Backlog, GroupReading, done_past
from shared.topics import CommitProgress
from tests.support.fakes import FakeClock


def backlog(**kw: float) -> Backlog:
    fields = {"worker_window": 100, "backlog_seconds": 0.5, "min_backlog": 50, "commit_lag_s": 0.5}
    fields.update(kw)
    return Backlog(**fields)  # type: ignore[arg-type]


def test_the_target_follows_members_and_the_measured_rate_with_a_fake_clock() -> None:
    clock = FakeClock()
    meter = backlog()
    meter.observe({0: 0, 1: 0}, members=1, now=clock(), waiting=False)
    assert meter.target == 100  # one worker's window, no rate yet
    clock.advance(1.0)
    meter.observe({0: 500, 1: 500}, members=3, now=clock(), waiting=False)  # 1,000 lines in 1 s
    assert meter.rate == 1000 and meter.target == 3 * 100 + 1000
    clock.advance(3.0)
    meter.observe({0: 500, 1: 500}, members=1, now=clock(), waiting=False)  # a worker left, idle
    assert meter.rate == 0 and meter.target < 3 * 100 + 1000 and meter.members == 1


def test_the_target_doubles_while_the_workers_run_dry_with_a_fake_clock() -> None:
    clock = FakeClock()
    meter = backlog(max_backlog=1000)
    targets = []
    for step in range(8):  # every line sent is committed by the next look: the topic ran dry
        meter.produced(0, step * 100)
        meter.observe({0: step * 100 + 1}, members=1, now=clock(), waiting=True)
        targets.append(meter.target)
        clock.advance(0.2)
    assert targets[0] >= 100 and targets[2] >= 2 * targets[0] and targets[-1] == 1000
    meter.produced(0, 5000)  # now lines wait in the topic: the target relaxes
    meter.observe({0: 801}, members=1, now=clock(), waiting=True)
    assert meter.target < 1000


def ramped_then_stalled(readings_per_s: int) -> list[int]:
    """A meter whose target ramped to 1,000, then one second of commits standing still while
    lines wait, read ``readings_per_s`` times (fake clock)."""
    clock = FakeClock()
    meter = backlog(max_backlog=1000)
    for step in range(8):
        meter.produced(0, step * 100)
        meter.observe({0: step * 100 + 1}, members=1, now=clock(), waiting=True)
        clock.advance(0.2)
    meter.produced(0, 5000)
    targets = []
    for _ in range(readings_per_s):
        clock.advance(1.0 / readings_per_s)
        meter.observe({0: 701}, members=1, now=clock(), waiting=True)  # the commit stands still
        targets.append(meter.target)
    return targets


def test_a_stalled_target_relaxes_per_second_not_per_reading_with_a_fake_clock() -> None:
    read_often, read_once = ramped_then_stalled(10), ramped_then_stalled(1)
    # 1,000 at the ramp's last reading, 1.2 s before: 0.8 ** 1.2 of it, however often it is read
    assert read_often[-1] == read_once[-1] == 766
    assert read_often[0] > 900  # a tenth of a second later it has barely moved


def test_the_allowance_fills_the_topic_up_to_the_target() -> None:
    meter = backlog()
    meter.observe({0: 10}, members=1, now=0.0, waiting=False)
    assert meter.allowance(ours_in_topic=0) == 100
    for offset in range(10, 70):  # we sent 60 lines the group has not committed
        meter.produced(0, offset)
    assert meter.lag == 60
    assert meter.allowance(ours_in_topic=60) == 40
    meter.observe({0: 70}, members=1, now=1.0, waiting=False)
    assert meter.lag == 0 and meter.allowance(ours_in_topic=0) >= 100


def test_direct_kafka_lines_neither_starve_nor_are_jumped() -> None:
    meter = backlog(direct_weight=1.0)
    meter.observe({0: 0}, members=1, now=0.0, waiting=False)
    meter.produced(0, 999)  # 1,000 lines in the topic, 10 of them ours: 990 from a pipeline
    assert meter.allowance(ours_in_topic=10) == 100 - 10  # our share up to the target, not zero
    heavier_direct = backlog(direct_weight=4.0)
    heavier_direct.observe({0: 0}, members=1, now=0.0, waiting=False)
    heavier_direct.produced(0, 399)  # 400 in the topic, none ours
    assert heavier_direct.allowance(ours_in_topic=0) == 100  # 400 / 4


def test_the_target_does_not_grow_while_older_lines_still_wait() -> None:
    clock = FakeClock()
    meter = backlog(max_backlog=5000, backlog_seconds=0.0, commit_lag_s=0.0)
    meter.produced(0, 999)
    for step in range(6):  # the group stays behind what was sent before each look
        meter.observe({0: 100 * step}, members=1, now=clock(), waiting=True)
        clock.advance(0.1)
    assert meter.target == 100  # one worker's window: no growth


def test_the_offsets_are_read_as_an_eighth_of_the_backlog_drains() -> None:
    meter = backlog()  # needs one window (100) plus 1 s of the rate
    assert meter.reading_interval(0.1, 1.0) == 0.1  # no rate known yet: read often
    meter.produced(0, 16 + 115)  # 116 lines in the topic: an eighth of them drain in ~0.9 s
    meter.observe({0: 0}, members=1, now=0.0, waiting=True)
    meter.observe({0: 16}, members=1, now=1.0, waiting=True)  # a slow engine: 16 lines/s
    assert meter.rate == 16 and abs(meter.reading_interval(0.1, 1.0) - 0.906) < 0.01
    assert meter.reading_interval(0.1, 0.5) == 0.5  # at most the slowest
    meter.produced(0, 2016 + 599)  # 600 lines in the topic: an eighth drains in 0.0375 s
    meter.observe({0: 2016}, members=1, now=2.0, waiting=True)  # a fast one: 2,000 lines/s
    assert meter.reading_interval(0.1, 1.0) == 0.1  # at least the fastest
    meter.produced(0, 2016 + 2099)  # 2,100 lines, what the rate needs: an eighth in 0.13 s
    assert abs(meter.reading_interval(0.1, 1.0) - 0.131) < 0.01
    meter.produced(0, 2016 + 9999)  # a slow start's surplus beyond that does not stretch it
    assert abs(meter.reading_interval(0.1, 1.0) - 0.131) < 0.01
    meter.observe({0: 2016 + 10000}, members=1, now=3.0, waiting=True)  # all drained: read often
    assert meter.lag == 0 and meter.reading_interval(0.1, 1.0) == 0.1


def test_a_rate_measured_while_the_topic_ran_dry_does_not_delay_the_next_reading() -> None:
    meter = backlog()
    meter.produced(0, 9)  # a small batch: 10 lines, all committed within the second
    meter.observe({0: 0}, members=1, now=0.0, waiting=True)
    meter.observe({0: 10}, members=1, now=1.0, waiting=True)
    meter.produced(0, 10 + 511)  # then a big batch's first round
    # 10 lines/s is what the group was given, not what it can do: read again at once, not in 1 s.
    assert meter.rate == 10 and meter.reading_interval(0.1, 1.0) == 0.1
    meter.observe({0: 10 + 16}, members=1, now=2.0, waiting=True)  # lines wait now: the rate counts
    assert meter.lag == 496 and meter.reading_interval(0.1, 1.0) > 0.5  # 16 lines/s


def test_head_starts_may_fill_the_topic_up_to_a_second_target_with_a_fake_clock() -> None:
    clock = FakeClock()
    meter = backlog()
    meter.observe({0: 0}, members=1, now=clock(), waiting=False)
    assert meter.target == 100
    meter.produced(0, 149)  # 150 lines in the topic: over the target, no allowance
    assert meter.allowance(150) == 0 and meter.head_room() == 50
    meter.produced(0, 249)  # two targets in the topic: head starts wait for it to drain too
    assert meter.head_room() == 0
    clock.advance(0.2)
    meter.observe({0: 200}, members=1, now=clock(), waiting=False)
    assert meter.head_room() > 0


def test_lines_answered_past_the_commit_leave_the_backlog() -> None:
    # One long line holds the commit at offset 0; the 99 sent after it have their results.
    meter = backlog()
    for offset in range(100):
        meter.produced(0, offset)
    meter.observe({0: 0}, members=1, now=0.0, waiting=True)
    assert meter.lag == 100 and meter.allowance(ours_in_topic=100) == 0  # the workers held dry
    meter.observe({0: 0}, members=1, now=1.0, waiting=True, answered={0: 99})
    assert meter.lag == 1 and meter.allowance(ours_in_topic=1) == meter.target - 1


def test_the_workers_count_past_the_commit_and_our_answered_lines_combine() -> None:
    # The worker counts 40 lines done past its commit of partition 0, the aggregator has 55 of
    # ours (read later, or the worker's commit is older): the larger stands; partition 1's worker
    # sent no metadata (a broker that keeps none), so the aggregator's count stands alone there.
    reading = GroupReading(committed={0: 0, 1: 0}, progress={0: CommitProgress(40, 100)}, members=1)
    done, read_to = done_past(reading, {0: 55, 1: 7})
    assert done == {0: 55, 1: 7} and read_to == {0: 100}
    assert done_past(reading, {})[0] == {0: 40}


def test_lines_a_pipeline_wrote_after_our_last_send_count_from_the_workers_read_position() -> None:
    # We sent offsets 0-99; a pipeline wrote 100-149, and the worker has read them all. One line
    # (offset 0) runs and 139 are done past it, some of them the pipeline's: 10 are not done.
    meter = backlog()
    for offset in range(100):
        meter.produced(0, offset)
    meter.observe({0: 0}, members=1, now=0.0, waiting=True, answered={0: 139}, read_to={0: 150})
    assert meter.lag == 11  # not 100 - 139 (below zero: "ran dry", the target doubled)
