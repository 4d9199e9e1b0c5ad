"""The dispatch policy's order, with a fake clock: tiers, deadline risk, project share, head starts,
priority and round robin within a project."""

from __future__ import annotations

from collections import Counter

import pytest

from services.api.dispatch.policy import FairSharePolicy, Grant, QueuedBatch, SendRate, at_risk
from tests.support.fakes import FakeClock

DAY = 24 * 3600.0


def batch(batch_id: str, project: str = "p", remaining: int = 10_000, **kw: object) -> QueuedBatch:
    fields: dict[str, object] = {"started": True, "expires_at": 1000.0 + DAY, "order": 0}
    fields.update(kw)
    return QueuedBatch(batch_id, project, remaining, **fields)  # type: ignore[arg-type]


def shares(grants: list[Grant]) -> dict[str, int]:
    return {g.batch_id: g.lines for g in grants}


def plan(policy: FairSharePolicy, queue: list[QueuedBatch], budget: int, now: float) -> list[Grant]:
    """One round's plan, as the loop makes it."""
    return policy.plan(policy.lineup(queue, now), budget)


def run_rounds(
    policy: FairSharePolicy, queue: list[QueuedBatch], clock: FakeClock, rounds: int, budget: int
) -> Counter[str]:
    """Dispatch ``rounds`` rounds as the loop would: served lines leave the queue."""
    served: Counter[str] = Counter()
    for _ in range(rounds):
        current = [
            QueuedBatch(
                b.batch_id,
                b.project,
                b.remaining - served[b.batch_id],
                b.priority,
                b.expires_at,
                True,
                b.order,
                b.at_risk,
            )
            for b in queue
        ]
        for grant in plan(policy, current, budget, clock()):
            served[grant.batch_id] += grant.lines
        clock.advance(0.05)
    return served


def test_a_higher_priority_batch_takes_its_projects_share_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy()
    queue = [batch("low", order=1), batch("high", priority=5, order=2)]
    assert shares(plan(policy, queue, 256, clock())) == {"high": 256}
    # Another project keeps its half: the priority orders only the first project's batches.
    other = batch("other", project="q", order=3)
    assert shares(plan(policy, [*queue, other], 256, clock())) == {"high": 128, "other": 128}


def test_another_projects_priority_100_does_not_take_a_share_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16)
    queue = [batch("a-96", "a", remaining=96, order=1), batch("b-300", "b", 300, priority=100, order=2)]
    served = run_rounds(policy, queue, clock, rounds=1, budget=128)
    assert served == {"a-96": 64, "b-300": 64}
    # So the smaller batch is all sent first (as it would be alone, at half the rate).
    served = run_rounds(policy, queue, clock, rounds=1, budget=192)
    assert served["a-96"] == 96 and served["b-300"] == 96


def test_a_granted_tier_goes_before_the_others_and_a_lower_one_after_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(tiers={"ops": 1, "bulk": -1})
    queue = [batch("bulk-1", "bulk", order=1), batch("p-1", "p", order=2), batch("ops-1", "ops", order=3)]
    assert shares(plan(policy, queue, 256, clock())) == {"ops-1": 256}
    queue[2] = batch("ops-1", "ops", remaining=100, order=3)
    assert shares(plan(policy, queue, 256, clock())) == {"ops-1": 100, "p-1": 156}
    assert shares(plan(policy, queue[:1], 256, clock())) == {"bulk-1": 256}


def test_projects_of_one_tier_share_by_weight_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(weights={"a": 3.0}, tiers={"a": 2, "b": 2}, quantum=8)
    queue = [batch("a1", "a"), batch("b1", "b", order=1), batch("c1", "c", order=2)]
    served = run_rounds(policy, queue, clock, rounds=4, budget=256)
    assert served["a1"] == 3 * served["b1"] and "c1" not in served


def test_deadlines_not_at_risk_do_not_order_batches_with_a_fake_clock() -> None:
    """A 24 h window each, eleven minutes apart: the later batch is not held behind the earlier."""
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16)
    first = batch("big-first", "a", remaining=50_001, expires_at=clock() + DAY)
    later = batch("later", "b", remaining=200, expires_at=clock() + DAY + 660, order=1)
    served = run_rounds(policy, [first, later], clock, rounds=1, budget=256)
    assert served == {"big-first": 128, "later": 128}


def test_a_batch_at_risk_goes_first_earliest_deadline_first_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(tiers={"ops": 1})
    calm = batch("calm", "a", expires_at=clock() + 100)  # the earliest deadline, but not at risk
    risky = batch("risky", "b", remaining=300, expires_at=clock() + 900, at_risk=True, order=1)
    riskier = batch("riskier", "c", remaining=100, expires_at=clock() + 600, at_risk=True, order=2)
    grants = plan(policy, [calm, risky, riskier], 512, clock())
    assert [(g.batch_id, g.lines) for g in grants] == [("riskier", 100), ("risky", 300), ("calm", 112)]
    # Within its tier only: a granted tier still goes first.
    ops = batch("ops-1", "ops", remaining=200, order=3)
    assert shares(plan(policy, [calm, risky, ops], 256, clock())) == {"ops-1": 200, "risky": 56}


def test_lines_sent_at_risk_count_in_the_projects_share_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16)
    a = batch("a1", "a", at_risk=True)
    run_rounds(policy, [a, batch("b1", "b", order=1)], clock, rounds=1, budget=512)
    # No longer at risk: "b" gets the round back, then the two share.
    served = run_rounds(policy, [batch("a1", "a"), batch("b1", "b", order=1)], clock, rounds=2, budget=512)
    assert served["b1"] >= 512 + 256 - 16


def test_many_new_small_batches_of_one_project_do_not_take_a_round_with_a_fake_clock() -> None:
    """Thirty new 32-line batches every round (960 head-start lines against a 512-line round):
    the project's head starts are start_lines per round, charged to it, so the other project
    keeps half of every round."""
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16, start_lines=32)
    big = batch("big", "b", remaining=1_000_000)
    small: dict[str, QueuedBatch] = {}
    for round_no in range(10):
        for i in range(30):
            name = f"s{round_no}-{i}"
            small[name] = batch(name, "a", remaining=32, started=False, order=100 * round_no + i)
        grants = shares(plan(policy, [big, *small.values()], 512, clock()))
        assert grants["big"] >= 256 - 16, (round_no, grants["big"])
        assert sum(n for name, n in grants.items() if name != "big") <= 256 + 16
        for name, lines in grants.items():
            if name != "big":
                was = small[name]
                small[name] = batch(name, "a", remaining=was.remaining - lines, order=was.order)
        clock.advance(0.05)


def test_new_batches_every_round_do_not_outrun_the_share_when_the_backlog_is_full_with_a_fake_clock() -> None:
    """The loop's budget covers head starts whatever the backlog: with the topic full (16 lines of
    room a round), a project creating a new 100-line batch every round still gets only about
    half of what is sent, the other project's started batch the rest."""
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16, start_lines=32)
    big = batch("big", "b", remaining=1_000_000)
    new: dict[str, QueuedBatch] = {}
    sent: Counter[str] = Counter()
    for round_no in range(200):
        name = f"n{round_no}"
        new[name] = batch(name, "a", remaining=100, started=False, order=round_no + 1)
        queue = [big, *new.values()]
        lineup = policy.lineup(queue, clock())
        budget = max(16, lineup.head_start_lines)  # as the loop: allowance 16
        for grant in policy.plan(lineup, budget):
            project = "b" if grant.batch_id == "big" else "a"
            sent[project] += grant.lines
            if grant.batch_id != "big":
                was = new[grant.batch_id]
                new[grant.batch_id] = batch(
                    grant.batch_id, "a", remaining=was.remaining - grant.lines, order=was.order
                )
        clock.advance(0.05)
    assert sent["b"] >= 0.45 * (sent["a"] + sent["b"]), sent


def test_a_projects_new_batches_share_its_head_start_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(start_lines=32)
    news = [batch(f"n{i}", "p", remaining=100, started=False, order=i) for i in range(3)]
    other = batch("o", "q", remaining=10, started=False, order=5)
    assert policy.lineup([*news, other], clock()).head_start_lines == 42
    grants = shares(plan(policy, [*news, other], 64, clock()))
    # Head starts: "p"'s three share 32 (11, 11, 10), "q"'s one takes its 10; then the share
    # (only "p" has lines left) goes on round robin from "p"'s last batch.
    assert grants == {"n0": 11 + 16, "n1": 11 + 6, "n2": 10, "o": 10}
    # "p" is now 44 lines ahead of "q", more than one head start: its new batches get none.
    assert policy.lineup([*news, other], clock()).head_start_lines == 10
    clock.advance(DAY)  # expired batches start no more
    assert policy.lineup([*news, other], clock()).head_start_lines == 0


def test_at_risk_reads_the_remaining_lines_at_the_rate_it_can_count_on() -> None:
    # 1,000 lines at 1 line/s need 1,000 s: at risk with 1,500 s left and a 600 s margin.
    assert at_risk(1000, 1.0, capacity=10.0, queued=10, time_left=1500, margin_s=600)
    assert not at_risk(1000, 1.0, capacity=10.0, queued=10, time_left=1700, margin_s=600)
    # A batch waiting its turn (no lines sent lately) counts on an equal share of the model's rate.
    assert not at_risk(1000, 0.0, capacity=10.0, queued=2, time_left=1500, margin_s=600)
    assert at_risk(1000, 0.0, capacity=10.0, queued=20, time_left=1500, margin_s=600)
    # No rate known: only the margin counts.
    assert not at_risk(1000, 0.0, capacity=0.0, queued=1, time_left=1500, margin_s=600)
    assert at_risk(1, 0.0, capacity=0.0, queued=1, time_left=500, margin_s=600)
    # The model's whole rate could not finish it: going first would only hold the others up.
    assert not at_risk(100_000, 1.0, capacity=10.0, queued=1, time_left=5000, margin_s=600)
    assert not at_risk(0, 1.0, capacity=10.0, queued=1, time_left=10, margin_s=600)


def test_send_rate_measures_the_recent_window_with_a_fake_clock() -> None:
    clock = FakeClock()
    rate = SendRate(window_s=60)
    assert rate.per_second(clock(), 0) == 0.0
    for sent in range(0, 1200, 20):  # 20 lines/s for a minute
        rate.mark(clock(), sent)
        clock.advance(1)
    assert rate.per_second(clock(), 1200) == pytest.approx(20, rel=0.1)
    clock.advance(120)  # then nothing for two minutes
    rate.mark(clock(), 1200)
    assert rate.per_second(clock(), 1200) < 2


def test_an_expired_batch_gets_nothing_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy()
    queue = [batch("ending", expires_at=clock() + 1), batch("other", order=1)]
    clock.advance(2)
    assert shares(plan(policy, queue, 64, clock())) == {"other": 64}


def test_projects_share_by_weight_whatever_their_batch_counts_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(weights={"heavy": 3.0}, quantum=8)
    queue = [batch(f"light-{i}", project="light", order=i) for i in range(5)]
    queue.append(batch("heavy-0", project="heavy", order=10))
    served = run_rounds(policy, queue, clock, rounds=20, budget=256)
    light = sum(n for b, n in served.items() if b.startswith("light"))
    assert served["heavy-0"] == 3 * light  # 3:1 by weight, though "light" has 5 batches


def test_equal_projects_get_equal_shares_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16)
    served = run_rounds(policy, [batch("a1", "a"), batch("b1", "b", order=1)], clock, 10, 500)
    assert abs(served["a1"] - served["b1"]) <= 16


def test_an_idle_project_banks_no_credit_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16)
    run_rounds(policy, [batch("a1", "a")], clock, rounds=50, budget=512)  # "a" alone for a while
    served = run_rounds(policy, [batch("a2", "a", order=1), batch("b1", "b", order=2)], clock, 4, 512)
    assert abs(served["a2"] - served["b1"]) <= 16  # "b" does not get 50 rounds of catch-up


def test_batches_of_one_project_take_turns_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=10)
    queue = [batch(f"b{i}", order=i) for i in range(3)]
    order = [g.batch_id for g in plan(policy, queue, 30, clock())]
    order += [g.batch_id for g in plan(policy, queue, 30, clock())]
    assert order == ["b0", "b1", "b2", "b0", "b1", "b2"]


def test_a_small_batch_starts_within_one_round_behind_a_big_one_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(start_lines=32)
    big = batch("big", project="p", remaining=50_000, priority=9, order=0)  # even a higher priority
    run_rounds(policy, [big], clock, rounds=3, budget=512)
    small = batch("small", project="p", remaining=10, started=False, order=1)
    grants = shares(plan(policy, [big, small], 512, clock()))
    assert grants["small"] == 10  # all of it, in the first round it is queued
    assert grants["big"] == 502


def test_the_budget_and_the_remaining_lines_bound_the_grants_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy()
    grants = plan(policy, [batch("a", remaining=5), batch("b", "q", remaining=1000)], 100, clock())
    assert shares(grants) == {"a": 5, "b": 95}
    assert plan(policy, [batch("a", remaining=5)], 0, clock()) == []


def test_a_new_projects_first_batch_gets_its_start_lines_but_no_catch_up_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16, start_lines=32)
    run_rounds(policy, [batch("a1", "a")], clock, rounds=3, budget=512)  # "a" alone: 1,536 lines
    joining = batch("b1", "b", started=False, order=1)
    grants = shares(plan(policy, [batch("a1", "a"), joining], 512, clock()))
    assert abs(grants["a1"] - grants["b1"]) <= 32  # its start lines ahead, then turns


def test_a_project_back_from_idle_banks_no_credit_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16)
    run_rounds(policy, [batch("a1", "a"), batch("b1", "b", order=1)], clock, rounds=2, budget=512)
    done = batch("b1", "b", remaining=0, order=1)  # "b" has nothing left for 20 rounds
    run_rounds(policy, [batch("a1", "a"), done], clock, rounds=20, budget=512)
    served = run_rounds(policy, [batch("a1", "a"), batch("b2", "b", order=2)], clock, 2, 512)
    assert abs(served["a1"] - served["b2"]) <= 16


def test_a_project_does_not_catch_up_on_a_higher_tier_with_a_fake_clock() -> None:
    """What "p" was sent while "ops" (a higher tier) had the rounds does not count against it once
    "ops" is done, whether or not "q"'s batch got its head start meanwhile."""
    for started in (True, False):
        clock = FakeClock()
        policy = FairSharePolicy(tiers={"ops": 1}, quantum=16, start_lines=32)
        run_rounds(policy, [batch("p-normal", "p", order=1)], clock, rounds=4, budget=512)
        normal = [batch("p-normal", "p", order=1), batch("q-normal", "q", order=2, started=started)]
        first = shares(plan(policy, [batch("ops-1", "ops", 2048), *normal], 512, clock()))
        assert first.get("q-normal", 0) == (0 if started else 32)  # its head start, or nothing
        urgent = batch("ops-1", "ops", remaining=2048 - first["ops-1"])
        run_rounds(policy, [urgent, *normal], clock, rounds=4, budget=512)  # the rest of it, and more
        after = [batch("p-normal", "p", order=1), batch("q-normal", "q", order=2)]
        served = run_rounds(policy, after, clock, rounds=2, budget=512)
        assert abs(served["p-normal"] - served["q-normal"]) <= 32, (started, served)


def test_equal_projects_alternate_when_each_round_serves_only_one_with_a_fake_clock() -> None:
    """A round too small for both still leaves the other project in the share: no starvation."""
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16)
    served = run_rounds(policy, [batch("a1", "a"), batch("b1", "b", order=1)], clock, rounds=40, budget=16)
    assert served["a1"] == served["b1"] == 320
