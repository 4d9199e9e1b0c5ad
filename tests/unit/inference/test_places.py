"""EnginePlaces: a per-group priority semaphore over the engine's places (no engine involved)."""

from __future__ import annotations

import asyncio

import pytest

from services.inference.engine import RequestAborted
from services.inference.places import EnginePlaces


async def test_a_freed_place_goes_to_the_group_with_fewest_running_then_first_come() -> None:
    places = EnginePlaces(2)
    await places.take("a")
    await places.take("a")
    order: list[str] = []

    async def wait(group: str, name: str) -> None:
        await places.take(group)
        order.append(name)

    tasks = [
        asyncio.create_task(wait(group, name)) for group, name in (("a", "a3"), ("b", "b1"), ("b", "b2"))
    ]
    await asyncio.sleep(0)
    assert places.waiting() == 3 and places.holding("a") == 3 and order == []
    places.give_back("a")  # a runs 1, b none: b goes first though a3 came first
    await asyncio.sleep(0)
    assert order == ["b1"]
    places.give_back("a")  # a runs 0, b 1
    await asyncio.sleep(0)
    assert order == ["b1", "a3"]
    places.give_back("b")  # a 1, b 0
    await asyncio.sleep(0)
    assert order == ["b1", "a3", "b2"]
    await asyncio.gather(*tasks)
    assert places.used == 2 and places.running("a") == 1 and places.running("b") == 1


async def test_a_cancelled_waiter_holds_no_place_and_a_dropped_group_is_aborted() -> None:
    places = EnginePlaces(1)
    await places.take("a")
    gone = asyncio.create_task(places.take("b"))
    dropped = asyncio.create_task(places.take("c"))
    await asyncio.sleep(0)
    gone.cancel()
    places.drop("c")
    with pytest.raises(RequestAborted):
        await dropped
    await asyncio.gather(gone, return_exceptions=True)
    places.give_back("a")
    assert places.used == 0 and places.waiting() == 0
    assert places.try_take("d")  # a free place is taken at once
    assert places.used == 1


async def test_a_waiter_cancelled_after_its_grant_gives_the_place_back() -> None:
    places = EnginePlaces(1)
    await places.take("a")
    waiter = asyncio.create_task(places.take("b"))
    await asyncio.sleep(0)
    places.give_back("a")  # granted to the waiter, which has not run yet
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert places.used == 0 and places.running("b") == 0


async def test_no_places_means_no_limit() -> None:
    places = EnginePlaces(0)
    for _ in range(1000):
        await places.take("a")
    assert not places.full and places.used == 1000 and places.waiting() == 0
