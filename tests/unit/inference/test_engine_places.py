"""EnginePlaces: a per-group priority semaphore over the engine's places (no engine involved)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from services.inference.engine import RequestAborted
from services.inference.engine_places import EnginePlaces

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


# ------------------------------------------------------------------ places shared by project


async def take_for(places: EnginePlaces, project: str, group: str) -> str:
    """A place for a new run of the project's group, given at once."""
    run_id = next(_ids)
    await asyncio.wait_for(places.take(group, run_id, project=project), 1)
    return run_id


def waiting_for(places: EnginePlaces, project: str, group: str) -> asyncio.Task[str]:
    """A run of the project's group waiting for a place (its id once it has one)."""

    async def wait() -> str:
        run_id = next(_ids)
        await places.take(group, run_id, project=project)
        return run_id

    return asyncio.create_task(wait())


async def test_a_project_with_many_batches_gets_no_more_places_than_one_with_a_single_batch() -> None:
    """8 places: project "many" fills them with lines of four batches and has more of each waiting,
    project "one" waits with one batch. Each place "many" frees goes to "one" until both hold 4,
    and from then on a place freed by one project goes back to it."""
    places = EnginePlaces(8)
    many = [await take_for(places, "many", f"m{i % 4}") for i in range(8)]
    waiting = [waiting_for(places, "many", f"m{i % 4}") for i in range(8)]
    waiting += [waiting_for(places, "one", "single") for _ in range(8)]
    await asyncio.sleep(0)
    for n, run_id in enumerate(many[:4]):
        places.give_back(f"m{n % 4}", run_id)
        await asyncio.sleep(0)
    assert (places.project_running("many"), places.project_running("one")) == (4, 4)
    places.give_back("m0", many[4])  # "many" holds 3, "one" 4: the place is "many"'s again
    await asyncio.sleep(0)
    assert (places.project_running("many"), places.project_running("one")) == (4, 4)
    assert places.running("single") == 4  # per batch it would have had 8 / 5 of the places
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_stream_of_young_batches_keeps_another_project_at_its_share() -> None:
    """8 places, 2 projects: a share of 4 each. "big" fills the engine; "stream" sends one new
    (young) batch after another. Its first lines make "big" give up all but its share, beside
    young lines "big" keeps its share (not ``beside_young``), and once "stream" holds its share
    its new batches wait for places instead of making "big"'s lines make way."""
    places = EnginePlaces(8, young_lines=2, beside_young=1)
    big = [await take_for(places, "big", "b") for _ in range(8)]
    more_big = [waiting_for(places, "big", "b") for _ in range(4)]
    await take_for(places, "stream", "s0")  # young, below its share: "big" makes way
    victims = places.victims()
    assert victims == [big[7], big[6], big[5], big[4]]  # down to its share, not to 1
    for run_id in victims:
        places.give_back("b", run_id)
    for n in range(1, 4):  # more new batches fill the places "big" gave up
        await take_for(places, "stream", f"s{n}")
    assert places.victims() == []
    assert (places.project_running("big"), places.project_running("stream")) == (4, 4)
    late = waiting_for(places, "stream", "s4")  # at its share: this young batch waits
    await asyncio.sleep(0)
    assert places.used == 8 and places.victims() == [] and not late.done()
    places.give_back("b", big[0])  # "big" holds 3, below "stream": the place is "big"'s
    await asyncio.sleep(0)
    assert places.project_running("big") == 4 and not late.done()
    for task in [*more_big, late]:
        task.cancel()
    await asyncio.gather(*more_big, late, return_exceptions=True)


async def test_beside_young_lines_a_project_is_held_at_its_share_not_below_it() -> None:
    """The squeeze holds back only a project above its share: a line "big" finishes beside the
    other project's young line frees a place that goes back to "big", up to its share; the
    places beyond it stay free for the young batch."""
    places = EnginePlaces(8, young_lines=2, beside_young=1)
    big = [await take_for(places, "big", "b") for _ in range(8)]
    await take_for(places, "new", "n")
    for run_id in places.victims():
        places.give_back("b", run_id)
    again = [waiting_for(places, "big", "b") for _ in range(6)]
    await asyncio.sleep(0)
    assert places.project_running("big") == 4 and places.waiting() == 6
    places.give_back("b", big[0])  # "big" holds 3: below its share, so not held back
    await asyncio.sleep(0)
    assert places.project_running("big") == 4 and places.used == 5 and places.waiting() == 5
    for task in again:
        task.cancel()
    await asyncio.gather(*again, return_exceptions=True)


async def test_a_young_batch_of_a_project_at_its_share_makes_way_among_its_own_lines() -> None:
    """ "a" holds its share with a big batch and starts a new one: the new batch's line goes on at
    once, and the line that makes way is its own big batch's, not "b"'s."""
    places = EnginePlaces(4, young_lines=1, beside_young=1)
    a = [await take_for(places, "a", "a-big") for _ in range(2)]
    b = [await take_for(places, "b", "b-big") for _ in range(2)]
    await take_for(places, "a", "a-new")
    assert places.victims() == [a[1]]  # and the squeeze: "a"'s big batch keeps 1 beside it
    assert not any(places.preempted(run_id) for run_id in b)


async def test_a_young_batch_of_a_project_below_its_share_makes_the_project_above_it_make_way() -> None:
    places = EnginePlaces(4, young_lines=2)  # no squeeze: only the limit
    a = [await take_for(places, "a", "a-big") for _ in range(3)]
    await take_for(places, "b", "b-old")
    await take_for(places, "b", "b-new")  # "b" holds 1 of a share of 2; "a" holds 3
    assert places.victims() == [a[2]]


async def test_direct_requests_are_a_project_of_their_own_whatever_they_name() -> None:
    places = EnginePlaces(4)
    for _ in range(2):
        await places.take("", next(_ids), direct=True, project="a")
    await take_for(places, "a", "batch")
    assert places.project_running("a") == 1 and places.project_running(None) == 2


async def test_one_named_project_alone_shares_its_places_by_batch_as_before() -> None:
    """The scenario of ``test_beside_young_lines_the_others_keep_their_share...`` with the
    project named: the same victims, the same places held back."""
    places = EnginePlaces(4, young_lines=2, beside_young=1)
    big = [await take_for(places, "p", "big") for _ in range(4)]
    await take_for(places, "p", "new")
    victims = places.victims()
    assert victims == [big[3], big[2], big[1]]
    for run_id in victims:
        places.give_back("big", run_id)
    again = [waiting_for(places, "p", "big") for _ in victims]
    await asyncio.sleep(0)
    assert places.used == 2 and places.waiting() == 3
    for task in again:
        task.cancel()
    await asyncio.gather(*again, return_exceptions=True)


async def test_a_lines_turn_in_the_engines_queue_is_its_place_in_its_projects_round_of_batches() -> None:
    """vLLM starts the lines waiting inside it lowest priority first: a project's fifth line on
    the engine waits about as long whether its project runs one batch or four, so many small
    batches do not start ahead of another project's one big batch."""
    places = EnginePlaces(16)
    for n in range(4):
        await take_for(places, "many", f"m{n}")
    await take_for(places, "many", "m0")  # the 2nd line of one of four batches
    for _ in range(5):
        await take_for(places, "one", "single")  # the 5th line of its only batch
    assert places.turn("m0") == places.turn("single") == 4
    assert places.turn("m1") == 0  # a batch's first line goes first
