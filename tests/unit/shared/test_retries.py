"""The first try runs bare; a retried outcome goes through the tenacity loop as its attempt 1."""

from __future__ import annotations

import pytest
from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt, wait_none

from shared.retries import RetryRule, first_then_retrying

CONNECTION_ERRORS: RetryRule[str] = RetryRule(errors=(ConnectionError,))


class Flaky:
    """Fails ``failures`` times with ``error``, then answers ``"ok"``; counts its calls."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or ConnectionError("down")
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def loop(attempts: int, tries_seen: list[int], built: list[bool]) -> AsyncRetrying:
    built.append(True)

    def before_sleep(state: RetryCallState) -> None:
        tries_seen.append(state.attempt_number)

    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_none(),
        before_sleep=before_sleep,
        reraise=True,
    )


async def test_a_first_success_never_builds_the_loop() -> None:
    flaky = Flaky(0)
    tries: list[int] = []
    built: list[bool] = []
    answer = await first_then_retrying(flaky, CONNECTION_ERRORS, lambda: loop(3, tries, built))
    assert (answer, flaky.calls, built) == ("ok", 1, [])


async def test_a_failed_first_try_counts_as_attempt_one_of_the_loop() -> None:
    flaky = Flaky(2)
    tries: list[int] = []
    built: list[bool] = []
    answer = await first_then_retrying(flaky, CONNECTION_ERRORS, lambda: loop(3, tries, built))
    assert (answer, flaky.calls, tries) == ("ok", 3, [1, 2])  # three tries in all, as the loop alone


async def test_the_last_failure_propagates_after_every_attempt() -> None:
    flaky = Flaky(5)
    tries: list[int] = []
    built: list[bool] = []
    with pytest.raises(ConnectionError):
        await first_then_retrying(flaky, CONNECTION_ERRORS, lambda: loop(3, tries, built))
    assert (flaky.calls, tries) == (3, [1, 2])


async def test_an_error_the_policy_does_not_retry_propagates_at_once() -> None:
    flaky = Flaky(1, ValueError("bad"))
    tries: list[int] = []
    built: list[bool] = []
    with pytest.raises(ValueError):
        await first_then_retrying(flaky, CONNECTION_ERRORS, lambda: loop(3, tries, built))
    assert (flaky.calls, built) == (1, [])


async def test_a_retried_result_is_replayed_into_the_loop() -> None:
    answers = iter([503, 503, 200])
    calls: list[int] = []

    async def attempt() -> int:
        calls.append(1)
        return next(answers)

    def retry_loop() -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(2),
            wait=wait_none(),
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
        )

    server_errors: RetryRule[int] = RetryRule(result=lambda s: s >= 500)
    status = await first_then_retrying(attempt, server_errors, retry_loop)
    assert (status, len(calls)) == (503, 2)  # two attempts in all: the first, replayed, and one more


async def test_an_excepted_error_is_not_retried_though_its_base_is() -> None:
    flaky = Flaky(1, ConnectionRefusedError("refused"))
    tries: list[int] = []
    built: list[bool] = []
    rule: RetryRule[str] = RetryRule(errors=(OSError,), except_errors=(ConnectionRefusedError,))
    with pytest.raises(ConnectionRefusedError):
        await first_then_retrying(flaky, rule, lambda: loop(3, tries, built))
    assert (flaky.calls, built) == (1, [])


async def test_the_loop_retries_by_the_rule_after_the_first_try() -> None:
    answers = [ConnectionResetError("reset"), ValueError("bad")]  # the rule retries only the first

    async def attempt() -> str:
        raise answers.pop(0)

    tries: list[int] = []
    built: list[bool] = []
    with pytest.raises(ValueError):
        await first_then_retrying(attempt, CONNECTION_ERRORS, lambda: loop(5, tries, built))
    assert (tries, answers) == ([1], [])  # the loop stopped at the error its rule does not retry
