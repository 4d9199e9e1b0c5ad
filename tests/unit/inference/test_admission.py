"""AdmissionLimit and AdmissionGate: how many lines go onto a shared server (a fake clock, no
server; the remote engine's tests run them against a real ``vllm serve``)."""

from __future__ import annotations

import asyncio

import pytest

from services.inference.admission import AdmissionGate, AdmissionLimit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fake_clock_limit_grows_while_used_and_the_server_has_no_queue() -> None:
    limit = AdmissionLimit(8, start=2, clock=FakeClock())
    limit.server_load(waiting=0, used=1)  # not using the whole limit: no need for more
    assert limit.allowed == 2
    for _ in range(10):
        limit.server_load(waiting=0, used=limit.allowed)
    assert limit.allowed == 8  # up to the ceiling, not beyond


def test_fake_clock_limit_halves_when_requests_wait_once_per_round_trip() -> None:
    limit = AdmissionLimit(16, start=16, clock=FakeClock())
    limit.server_load(waiting=3, used=16)
    assert limit.allowed == 8
    limit.server_load(waiting=3, used=16)  # the same burst, before any line came back
    assert limit.allowed == 8
    for _ in range(8):  # a round trip of the lines now allowed
        limit.answered(1.0, 10, used=8, by_latency=False)
    limit.server_load(waiting=2, used=8)
    assert limit.allowed == 4
    for _ in range(100):
        limit.answered(1.0, 10, used=1, by_latency=False)
        limit.server_load(waiting=5, used=1)
    assert limit.allowed == 1  # the floor: the batch always moves


def test_fake_clock_a_refusal_holds_every_line_until_retry_after() -> None:
    clock = FakeClock()
    limit = AdmissionLimit(8, start=8, clock=clock)
    limit.refused(retry_after_s=2.0)
    assert limit.allowed == 0
    clock.now += 1.9
    assert limit.allowed == 0
    clock.now += 0.2
    assert limit.allowed == 4  # then half of what it was


def test_fake_clock_latency_far_above_the_best_seen_lowers_the_limit() -> None:
    limit = AdmissionLimit(16, start=4, latency_tolerance=2.0, clock=FakeClock())
    for _ in range(40):  # 0.05 s per token while the limit is used: room, it grows
        limit.answered(0.5, 10, used=limit.allowed, by_latency=True)
    grown = limit.allowed
    assert grown > 4
    for _ in range(20):  # the server saturates: 0.3 s per token
        limit.answered(3.0, 10, used=limit.allowed, by_latency=True)
    assert limit.allowed < grown and limit.decreases >= 1
    # Answers without a latency signal change nothing.
    before = limit.limit
    limit.answered(30.0, 1, used=limit.allowed, by_latency=False)
    assert limit.limit == before


def test_limit_refuses_a_floor_above_the_ceiling() -> None:
    with pytest.raises(ValueError):
        AdmissionLimit(2, floor=3)


async def test_fake_clock_gate_lets_on_the_lowest_priority_first_within_the_limit() -> None:
    gate = AdmissionGate(AdmissionLimit(1, start=1, clock=FakeClock()))
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def line(name: str, priority: int, hold: asyncio.Event | None = None) -> None:
        async with gate.slot(priority):
            order.append(name)
            if hold is not None:
                first_in.set()
                await hold.wait()

    first = asyncio.create_task(line("first", 5, release_first))
    await first_in.wait()
    later = [asyncio.create_task(line(n, p)) for n, p in (("batch", 10), ("live-ish", 0), ("batch2", 10))]
    await asyncio.sleep(0)
    assert gate.waiting == 3 and gate.used == 1
    release_first.set()
    await asyncio.gather(first, *later)
    assert order == ["first", "live-ish", "batch", "batch2"]
    assert gate.used == 0


async def test_fake_clock_gate_holds_lines_through_retry_after_then_lets_them_on() -> None:
    clock = FakeClock()
    limit = AdmissionLimit(4, start=4, clock=clock)
    gate = AdmissionGate(limit)
    limit.refused(retry_after_s=0.05)
    clock.now += 0.0  # the fake clock stands still: the gate's timer wakes it, then it looks again
    entered = asyncio.Event()

    async def line() -> None:
        async with gate.slot():
            entered.set()

    task = asyncio.create_task(line())
    await asyncio.sleep(0)
    assert gate.waiting == 1 and not entered.is_set()
    clock.now += 0.05  # Retry-After has passed
    await asyncio.wait_for(task, 2)
    assert entered.is_set() and gate.used == 0
    gate.close()


async def test_fake_clock_gate_a_cancelled_waiter_leaves_no_place_taken() -> None:
    gate = AdmissionGate(AdmissionLimit(1, start=1, clock=FakeClock()))
    holding = asyncio.Event()
    done = asyncio.Event()

    async def hold() -> None:
        async with gate.slot():
            holding.set()
            await done.wait()

    async def wait() -> None:
        async with gate.slot():
            pass

    holder = asyncio.create_task(hold())
    await holding.wait()
    waiter = asyncio.create_task(wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    done.set()
    await holder
    assert gate.used == 0 and gate.waiting == 0
    async with gate.slot():  # the place is free again
        assert gate.used == 1
