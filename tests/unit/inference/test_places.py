"""EnginePlaces: a priority semaphore over the engine's places (no engine involved)."""

from __future__ import annotations

import asyncio

import pytest

from services.inference.engine import RequestAborted
from services.inference.places import EnginePlaces


async def test_waiters_get_places_lowest_rank_first_then_in_arrival_order() -> None:
    places = EnginePlaces(1)
    await places.take(0, "a")
    order: list[str] = []

    async def wait(rank: int, name: str) -> None:
        await places.take(rank, name)
        order.append(name)

    tasks = [asyncio.create_task(wait(rank, name)) for rank, name in ((5, "late"), (1, "x"), (1, "y"))]
    await asyncio.sleep(0)
    assert places.waiting() == 3 and order == []
    for expected in (["x"], ["x", "y"], ["x", "y", "late"]):
        places.give_back()
        await asyncio.sleep(0)
        assert order == expected
    await asyncio.gather(*tasks)
    assert places.used == 1


async def test_a_cancelled_waiter_holds_no_place_and_a_dropped_group_is_aborted() -> None:
    places = EnginePlaces(1)
    await places.take(0, "a")
    gone = asyncio.create_task(places.take(0, "b"))
    dropped = asyncio.create_task(places.take(0, "c"))
    await asyncio.sleep(0)
    gone.cancel()
    places.drop("c")
    with pytest.raises(RequestAborted):
        await dropped
    await asyncio.gather(gone, return_exceptions=True)
    places.give_back()
    assert places.used == 0 and places.waiting() == 0
    await places.take(0, "d")  # a free place is taken at once
    assert places.used == 1


async def test_a_waiter_cancelled_after_its_grant_gives_the_place_back() -> None:
    places = EnginePlaces(1)
    await places.take(0, "a")
    waiter = asyncio.create_task(places.take(0, "b"))
    await asyncio.sleep(0)
    places.give_back()  # granted to the waiter, which has not run yet
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert places.used == 0


async def test_no_places_means_no_limit() -> None:
    places = EnginePlaces(0)
    for _ in range(1000):
        await places.take(0, "a")
    assert not places.full and places.used == 1000
