"""The dispatch policy's order, with a fake clock: priority, deadline, project share, round robin."""

from __future__ import annotations

from collections import Counter

from services.api.dispatch.policy import FairSharePolicy, Grant, QueuedBatch
from tests.support.fakes import FakeClock

DAY = 24 * 3600.0


def batch(batch_id: str, project: str = "p", remaining: int = 10_000, **kw: object) -> QueuedBatch:
    fields: dict[str, object] = {"started": True, "expires_at": 1000.0 + DAY, "order": 0}
    fields.update(kw)
    return QueuedBatch(batch_id, project, remaining, **fields)  # type: ignore[arg-type]


def shares(grants: list[Grant]) -> dict[str, int]:
    return {g.batch_id: g.lines for g in grants}


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
            )
            for b in queue
        ]
        for grant in policy.plan(current, budget, clock()):
            served[grant.batch_id] += grant.lines
        clock.advance(0.05)
    return served


def test_a_higher_priority_batch_takes_the_whole_round_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy()
    queue = [batch("low", order=1), batch("high", priority=5, order=2)]
    assert shares(policy.plan(queue, 256, clock())) == {"high": 256}


def test_the_earlier_deadline_goes_first_and_near_deadlines_share_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(deadline_resolution_s=600)
    late = batch("late", project="a", expires_at=clock() + DAY)
    soon = batch("soon", project="b", expires_at=clock() + 3600)
    assert shares(policy.plan([late, soon], 128, clock())) == {"soon": 128}
    # Within the resolution, deadlines are a tie: the projects share.
    almost = batch("almost", project="a", expires_at=clock() + 3600 + 60)
    assert shares(policy.plan([almost, soon], 128, clock())) == {"soon": 64, "almost": 64}


def test_an_expired_batch_gets_nothing_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy()
    queue = [batch("ending", expires_at=clock() + 1), batch("other", order=1)]
    clock.advance(2)
    assert shares(policy.plan(queue, 64, clock())) == {"other": 64}


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
    order = [g.batch_id for g in policy.plan(queue, 30, clock())]
    order += [g.batch_id for g in policy.plan(queue, 30, clock())]
    assert order == ["b0", "b1", "b2", "b0", "b1", "b2"]


def test_a_small_batch_starts_within_one_round_behind_a_big_one_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(start_lines=32)
    big = batch("big", project="p", remaining=50_000, priority=9, order=0)  # even a higher priority
    run_rounds(policy, [big], clock, rounds=3, budget=512)
    small = batch("small", project="p", remaining=10, started=False, order=1)
    grants = shares(policy.plan([big, small], 512, clock()))
    assert grants["small"] == 10  # all of it, in the first round it is queued
    assert grants["big"] == 502


def test_the_budget_and_the_remaining_lines_bound_the_grants_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy()
    grants = policy.plan([batch("a", remaining=5), batch("b", "q", remaining=1000)], 100, clock())
    assert shares(grants) == {"a": 5, "b": 95}
    assert policy.plan([batch("a", remaining=5)], 0, clock()) == []


def test_a_new_projects_first_batch_gets_its_start_lines_but_no_catch_up_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16, start_lines=32)
    run_rounds(policy, [batch("a1", "a")], clock, rounds=3, budget=512)  # "a" alone: 1,536 lines
    joining = batch("b1", "b", started=False, order=1)
    grants = shares(policy.plan([batch("a1", "a"), joining], 512, clock()))
    assert abs(grants["a1"] - grants["b1"]) <= 32  # its start lines ahead, then turns


def test_a_project_back_from_idle_banks_no_credit_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = FairSharePolicy(quantum=16)
    run_rounds(policy, [batch("a1", "a"), batch("b1", "b", order=1)], clock, rounds=2, budget=512)
    done = batch("b1", "b", remaining=0, order=1)  # "b" has nothing left for 20 rounds
    run_rounds(policy, [batch("a1", "a"), done], clock, rounds=20, budget=512)
    served = run_rounds(policy, [batch("a1", "a"), batch("b2", "b", order=2)], clock, 2, 512)
    assert abs(served["a1"] - served["b2"]) <= 16


def test_a_project_does_not_catch_up_on_a_higher_priority_tier_with_a_fake_clock() -> None:
    """What "p" was sent at priority 5 does not count against it once both share the normal tier,
    whether or not the other's batch got its start lines meanwhile."""
    for started in (True, False):
        clock = FakeClock()
        policy = FairSharePolicy(quantum=16, start_lines=32)
        normal = [batch("p-normal", "p", order=1), batch("q-normal", "q", order=2, started=started)]
        first = shares(policy.plan([batch("p-urgent", "p", 2048, priority=5), *normal], 512, clock()))
        assert first.get("q-normal", 0) == (0 if started else 32)  # start lines, or nothing
        urgent = batch("p-urgent", "p", remaining=2048 - first["p-urgent"], priority=5)
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
