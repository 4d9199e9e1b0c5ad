"""EnginePlaces: a per-group priority semaphore over the engine's places (no engine involved)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from services.inference.engine import RequestAborted
from services.inference.places import EnginePlaces

_ids = (f"run{n}" for n in itertools.count())


async def take(places: EnginePlaces, group: str) -> str:
    """A place for a new run of the group (waited for): the run's id."""
    run_id = next(_ids)
    await places.take(group, run_id)
    return run_id


async def take_now(places: EnginePlaces, group: str) -> str:
    """A place that must be given at once."""
    return await asyncio.wait_for(take(places, group), 1)


async def test_a_freed_place_goes_to_the_group_with_fewest_running_then_first_come() -> None:
    places = EnginePlaces(2)
    a1, a2 = await take(places, "a"), await take(places, "a")
    order: list[tuple[str, str]] = []

    async def wait(group: str) -> None:
        order.append((group, await take(places, group)))

    tasks = [asyncio.create_task(wait(group)) for group in ("a", "b", "b")]
    await asyncio.sleep(0)
    assert places.waiting() == 3 and places.holding("a") == 3 and order == []
    places.give_back("a", a1)  # a runs 1, b none: b goes first though a's waiter came first
    await asyncio.sleep(0)
    assert [g for g, _ in order] == ["b"]
    places.give_back("a", a2)  # a runs 0, b 1
    await asyncio.sleep(0)
    assert [g for g, _ in order] == ["b", "a"]
    places.give_back("b", order[0][1])  # a 1, b 0
    await asyncio.sleep(0)
    assert [g for g, _ in order] == ["b", "a", "b"]
    await asyncio.gather(*tasks)
    assert places.used == 2 and places.running("a") == 1 and places.running("b") == 1


async def test_a_cancelled_waiter_holds_no_place_and_a_dropped_group_is_aborted() -> None:
    places = EnginePlaces(1)
    a = await take(places, "a")
    gone = asyncio.create_task(take(places, "b"))
    dropped = asyncio.create_task(take(places, "c"))
    await asyncio.sleep(0)
    gone.cancel()
    places.drop("c")
    with pytest.raises(RequestAborted):
        await dropped
    await asyncio.gather(gone, return_exceptions=True)
    places.give_back("a", a)
    assert places.used == 0 and places.waiting() == 0
    await asyncio.wait_for(take(places, "d"), 1)  # a free place is taken at once
    assert places.used == 1


async def test_a_waiter_cancelled_after_its_grant_gives_the_place_back() -> None:
    places = EnginePlaces(1)
    a = await take(places, "a")
    waiter = asyncio.create_task(take(places, "b"))
    await asyncio.sleep(0)
    places.give_back("a", a)  # granted to the waiter, which has not run yet
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert places.used == 0 and places.running("b") == 0


async def test_no_places_means_no_limit_and_no_victims() -> None:
    places = EnginePlaces(0, young_lines=16, beside_young=0)
    for _ in range(1000):
        await take_now(places, "a")
    await take_now(places, "b")
    assert not places.full and places.used == 1001 and places.waiting() == 0
    assert places.victims() == []


async def test_a_young_line_goes_on_at_once_and_the_heaviest_groups_newest_line_makes_way() -> None:
    places = EnginePlaces(3, young_lines=1)
    a = [await take_now(places, "a") for _ in range(2)]  # holds 2: not young
    await take_now(places, "b")  # young, so it gives up nothing
    young = await take_now(places, "new")  # beyond the limit
    assert places.used == 4 and places.victims() == [a[1]]
    assert places.preempted(a[1]) and places.victims() == []  # already on its way out
    places.give_back("a", a[1])
    assert places.used == 3 and not places.preempted(a[1])
    again = asyncio.create_task(take(places, "a"))  # the victim waits for a place again
    await asyncio.sleep(0)
    assert places.waiting() == 1
    places.give_back("new", young)
    await asyncio.wait_for(again, 1)
    assert places.running("a") == 2 and places.running("b") == 1


async def test_beside_young_lines_the_others_keep_their_share_then_get_their_places_back() -> None:
    """4 places, at most 1 for the others while a young line runs: the big batch gives up two
    lines, the freed places stay empty for it, and they are its again when the young line ends."""
    places = EnginePlaces(4, young_lines=2, beside_young=1)
    big = [await take_now(places, "big") for _ in range(4)]
    young = await take_now(places, "new")
    victims = places.victims()
    assert victims == [big[3], big[2], big[1]]
    for run_id in victims:
        places.give_back("big", run_id)
    again = [asyncio.create_task(take(places, "big")) for _ in victims]
    await asyncio.sleep(0)
    assert places.used == 2 and places.waiting() == 3  # held back though two places are free
    more = await take_now(places, "new")  # the young batch may use them
    assert places.running("new") == 2
    places.give_back("new", young)
    places.give_back("new", more)
    await asyncio.wait_for(asyncio.gather(*again), 1)
    assert places.running("big") == 4 and places.victims() == []


async def test_a_young_line_waits_when_no_other_group_can_make_way() -> None:
    """A full engine of young groups only: nobody to abort, so the young line waits its turn."""
    places = EnginePlaces(2, young_lines=1, beside_young=0)
    first = await take_now(places, "x")
    await take_now(places, "y")
    waiting = asyncio.create_task(take(places, "z"))
    await asyncio.sleep(0)
    assert places.waiting() == 1 and places.used == 2 and places.victims() == []
    places.give_back("x", first)
    await asyncio.wait_for(waiting, 1)
    assert places.running("z") == 1


async def test_spared_victims_run_on() -> None:
    places = EnginePlaces(2, young_lines=1)
    old = [await take_now(places, "a") for _ in range(2)]
    await take_now(places, "b")
    victims = places.victims()
    assert victims == [old[1]]
    places.spare(victims)
    assert not places.preempted(old[1])


async def test_a_batch_is_young_for_its_first_lines_only_and_a_direct_request_never() -> None:
    places = EnginePlaces(0, young_lines=2)
    assert await places.take("a", "a1") and await places.take("a", "a2")
    assert not await places.take("a", "a3")  # holds 2
    places.give_back("a", "a1")
    places.give_back("a", "a2")
    places.give_back("a", "a3")
    assert not await places.take("a", "a4")  # it had its 2 young lines
    assert not await places.take("", "d1", direct=True)


async def test_a_shutdown_stops_the_waiters_and_leaves_the_running_lines() -> None:
    places = EnginePlaces(1)
    running = await take_now(places, "a")
    waiters = [asyncio.create_task(take(places, group)) for group in ("a", "b")]
    await asyncio.sleep(0)
    places.stop_waiting()
    places.drop("b")  # a cancel in the same step: the cancelled waiter is left to its task
    for result in await asyncio.gather(*waiters, return_exceptions=True):
        assert isinstance(result, asyncio.CancelledError)
    assert places.waiting() == 0 and places.used == 1 and places.run_ids("a") == [running]
    with pytest.raises(asyncio.CancelledError):  # a line read (or a victim back) after the stop
        await places.take("c", "late")
    assert places.used == 1
