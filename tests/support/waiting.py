"""Polling helpers: wait on a condition, never sleep a fixed time and hope.

``wait_until`` (blocking) and ``eventually`` (async) call a check every ``interval_s`` until it
returns something truthy and return that value; once ``timeout_s`` has passed (the check always
runs once more at the deadline) they fail with ``TimeoutError``. An exception from the check
propagates at once: a check that finds the thing it waits for gone can assert or raise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

from openai import OpenAI
from openai.types import Batch

T = TypeVar("T")

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


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


def wait_status(client: OpenAI, batch_id: str, statuses: Collection[str], timeout_s: float = 60.0) -> Batch:
    """The batch once its status is one of ``statuses`` (polled through the api)."""

    def reached() -> Batch | None:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in statuses else None

    found: Batch | None = wait_until(
        reached,
        timeout_s,
        f"batch {batch_id} to be {' or '.join(sorted(statuses))}",
        interval_s=0.2,
    )
    assert found is not None
    return found


def wait_terminal(client: OpenAI, batch_id: str, timeout_s: float = 240.0) -> Batch:
    """The batch once it has ended, whatever the outcome."""
    return wait_status(client, batch_id, TERMINAL, timeout_s)
