"""Retries that cost nothing while the first try succeeds.

tenacity's async loop is dear on a per-message hot path: each call builds futures with locks and
inspects every hook to see whether it is a coroutine function. Profiled (cProfile,
10,000 lines through the fake-engine worker, which retried the engine call and the result
publish per line), tenacity and the ``inspect`` calls it makes were ~30% of the worker's busy CPU.

``first_then_retrying`` runs the first try bare. Only when its outcome is one the rule retries
does it build the tenacity loop, which then sees that first outcome as its attempt 1 (replayed,
not run again): the numbering, waits, logs and the give-up callback are exactly those of running
the loop from the start. What is retried is stated once, in a ``RetryRule``: the bare first try
and the loop both read it, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from tenacity import AsyncRetrying, retry_base, retry_if_exception, retry_if_result

T = TypeVar("T")


@dataclass(frozen=True)
class RetryRule(Generic[T]):
    """Which outcomes of a try are tried again: an exception of one of ``errors`` (unless it is
    one of ``except_errors``), and a result ``result`` says is worth another try. A cancellation
    (``BaseException``, not ``Exception``) is never retried."""

    errors: tuple[type[Exception], ...] = ()
    except_errors: tuple[type[Exception], ...] = ()
    result: Callable[[T], bool] | None = None

    def retries_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self.errors) and not isinstance(exc, self.except_errors)

    def retries_result(self, value: T) -> bool:
        return self.result is not None and self.result(value)

    def policy(self) -> retry_base:
        """The rule as tenacity's ``retry`` argument."""
        return retry_if_exception(self.retries_error) | retry_if_result(self.retries_result)


async def first_then_retrying(
    attempt: Callable[[], Awaitable[T]],
    rule: RetryRule[T],
    retrying: Callable[[], AsyncRetrying],
) -> T:
    """``attempt()`` once; if ``rule`` retries the outcome, hand it to the loop ``retrying()``
    builds (its stop, wait and hooks; its ``retry`` is replaced by ``rule``'s)."""
    failure: Exception | None = None
    try:
        first = await attempt()
    except Exception as exc:  # BaseException (a cancellation) always propagates
        if not rule.retries_error(exc):
            raise
        failure = exc
    else:
        if not rule.retries_result(first):
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

    return await retrying().copy(retry=rule.policy())(again)  # type: ignore[no-any-return]
