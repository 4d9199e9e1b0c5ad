"""Polling helpers shared by the integration tests.

``wait_until`` (blocking) and ``eventually`` (async) call a check every ``interval_s`` until it
returns something truthy and return that value; once ``timeout_s`` has passed (the check always
runs once more at the deadline) they fail with ``TimeoutError``. An exception from the check
propagates at once: a check that finds the thing it waits for gone can assert or raise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T], timeout_s: float = 30.0, what: str = "condition", interval_s: float = 0.1
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(interval_s)


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    timeout_s: float = 30.0,
    what: str = "condition",
    interval_s: float = 0.1,
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(interval_s)
