"""Retries that cost nothing while the first try succeeds.

tenacity's async loop is dear on a per-message hot path: each call builds futures with locks and
inspects every hook to see whether it is a coroutine function. Profiled (cProfile, 2026-12-01,
10,000 lines through the fake-engine worker, which retried the engine call and the result
publish per line), tenacity and the ``inspect`` calls it makes were ~30% of the worker's busy CPU.

``first_then_retrying`` runs the first try bare. Only when its outcome is one the policy would
retry does it build the tenacity loop, which then sees that first outcome as its attempt 1
(replayed, not run again): the numbering, waits, logs and the give-up callback are exactly those
of running the loop from the start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying

T = TypeVar("T")


def _never(_: object) -> bool:
    return False


async def first_then_retrying(
    attempt: Callable[[], Awaitable[T]],
    retrying: Callable[[], AsyncRetrying],
    *,
    retry_exception: Callable[[Exception], bool],
    retry_result: Callable[[T], bool] = _never,
) -> T:
    """``attempt()`` once; if ``retry_exception``/``retry_result`` say the outcome is retried,
    hand it to the loop ``retrying()`` builds (whose policy must agree with those predicates)."""
    failure: Exception | None = None
    try:
        first = await attempt()
    except Exception as exc:  # BaseException (a cancellation) always propagates
        if not retry_exception(exc):
            raise
        failure = exc
    else:
        if not retry_result(first):
            return first
    replayed = False

    async def again() -> T:
        nonlocal replayed
        if replayed:
            return await attempt()
        replayed = True
        if failure is not None:
            raise failure
        return first

    return await retrying()(again)  # type: ignore[no-any-return]
