"""The backlog target and allowance, from our send offsets and the group's commits (fake clock)."""

from __future__ import annotations

from services.api.dispatch.meter import Backlog
from tests.unit.aggregator.fake_clock import FakeClock


def backlog(**kw: float) -> Backlog:
    fields = {"worker_window": 100, "backlog_seconds": 1.0, "min_backlog": 50, "direct_weight": 1.0}
    fields.update(kw)
    return Backlog(**fields)  # type: ignore[arg-type]


def test_the_target_follows_members_and_the_measured_rate_with_a_fake_clock() -> None:
    clock = FakeClock()
    meter = backlog()
    meter.observe({0: 0, 1: 0}, members=1, now=clock())
    assert meter.target == 100  # one worker's window, no rate yet
    clock.advance(1.0)
    meter.observe({0: 500, 1: 500}, members=3, now=clock())  # 1,000 lines committed in 1 s
    assert meter.target == 3 * 100 + 1000
    clock.advance(1.0)
    meter.observe({0: 500, 1: 500}, members=1, now=clock())  # a worker left, nothing committed
    assert meter.target < 3 * 100 + 1000 and meter.members == 1


def test_the_allowance_fills_the_topic_up_to_the_target() -> None:
    meter = backlog()
    meter.observe({0: 10}, members=1, now=0.0)
    assert meter.allowance(ours_in_topic=0) == 100
    for offset in range(10, 70):  # we sent 60 lines the group has not committed
        meter.produced(0, offset)
    assert meter.lag == 60
    assert meter.allowance(ours_in_topic=60) == 40
    meter.observe({0: 70}, members=1, now=1.0)
    assert meter.lag == 0 and meter.allowance(ours_in_topic=0) >= 100


def test_direct_kafka_lines_neither_starve_nor_are_jumped() -> None:
    meter = backlog(direct_weight=1.0)
    meter.observe({0: 0}, members=1, now=0.0)
    meter.produced(0, 999)  # 1,000 lines in the topic, 10 of them ours: 990 from a pipeline
    assert meter.allowance(ours_in_topic=10) == 100 - 10  # our share up to the target, not zero
    heavier_direct = backlog(direct_weight=4.0)
    heavier_direct.observe({0: 0}, members=1, now=0.0)
    heavier_direct.produced(0, 399)  # 400 in the topic, none ours
    assert heavier_direct.allowance(ours_in_topic=0) == 100  # 400 / 4
