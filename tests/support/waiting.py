"""Polling helpers: wait on a condition, never sleep a fixed time and hope.

``wait_until`` (blocking) and ``eventually`` (async) call a check every ``interval_s`` until it
returns something truthy and return that value; once ``timeout_s`` has passed (the check always
runs once more at the deadline) they fail with ``TimeoutError``. An exception from the check
propagates at once: a check that finds the thing it waits for gone can assert or raise.

``wait_status`` / ``wait_terminal`` poll a batch through the api (``*_async`` with an async
client), ``wait_stored_status`` its document in MongoDB; a batch that ends in a status not waited
for fails the wait at once. ``http_batches.wait_http_terminal`` polls over plain HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

from openai import AsyncOpenAI, OpenAI
from openai.types import Batch

if TYPE_CHECKING:
    from shared.mongo import Mongo

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


def reached(batch_id: str, status: str, statuses: Collection[str]) -> bool:
    """Whether ``status`` is one of ``statuses``; an end outside them fails at once (no status
    follows a terminal one, so waiting on would only time out)."""
    if status in TERMINAL and status not in statuses:
        raise AssertionError(f"batch {batch_id} ended {status}, expected {' or '.join(sorted(statuses))}")
    return status in statuses


def _what(batch_id: str, statuses: Collection[str]) -> str:
    return f"batch {batch_id} to be {' or '.join(sorted(statuses))}"


def wait_status(
    client: OpenAI, batch_id: str, statuses: Collection[str], timeout_s: float = 60.0, interval_s: float = 0.2
) -> Batch:
    """The batch once its status is one of ``statuses`` (polled through the api)."""

    def poll() -> Batch | None:
        batch = client.batches.retrieve(batch_id)
        return batch if reached(batch_id, batch.status, statuses) else None

    found: Batch | None = wait_until(poll, timeout_s, _what(batch_id, statuses), interval_s)
    assert found is not None
    return found


def wait_terminal(client: OpenAI, batch_id: str, timeout_s: float = 240.0) -> Batch:
    """The batch once it has ended, whatever the outcome."""
    return wait_status(client, batch_id, TERMINAL, timeout_s)


async def wait_status_async(
    client: AsyncOpenAI,
    batch_id: str,
    statuses: Collection[str],
    timeout_s: float = 60.0,
    interval_s: float = 0.1,
) -> Batch:
    """``wait_status`` with an async client."""

    async def poll() -> Batch | None:
        batch = await client.batches.retrieve(batch_id)
        return batch if reached(batch_id, batch.status, statuses) else None

    return await eventually(poll, timeout_s, _what(batch_id, statuses), interval_s)


async def wait_terminal_async(client: AsyncOpenAI, batch_id: str, timeout_s: float = 120.0) -> Batch:
    """``wait_terminal`` with an async client."""
    return await wait_status_async(client, batch_id, TERMINAL, timeout_s)


async def wait_stored_status(
    mongo: Mongo, batch_id: str, statuses: Collection[str], timeout_s: float = 60.0
) -> dict[str, Any]:
    """The batch's document in MongoDB once its status is one of ``statuses`` (behind the api)."""

    async def poll() -> dict[str, Any] | None:
        doc: dict[str, Any] | None = await mongo.batches.find_one({"_id": batch_id})
        return doc if doc and reached(batch_id, doc["status"], statuses) else None

    return await eventually(poll, timeout_s, _what(batch_id, statuses))
