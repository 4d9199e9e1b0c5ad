"""Batches at risk of missing their deadline, on the local stack: the one due first goes first.

Every batch's deadline is its ``expires_at`` (created_at + the 24 h window). A batch is at risk when
at its rate it would not be done ``BATCHSTREAM_DISPATCH_DEADLINE_MARGIN_S`` before it; batches at
risk go ahead of the fair share, earliest deadline first. This module's api (on the session's
stand-ins, with no worker and no aggregator) takes a margin longer than the window, so every batch
is at risk from the start. (Deadlines not at risk order nothing: test_dispatcher.py's projects
share though their batches' deadlines lie seconds apart.) The test is the model's consumer group:
it consumes and commits the requests (so the dispatcher keeps sending) and reads the order the
lines were sent in.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types import Batch
from pymongo import MongoClient

from deploy.local.stack import Stack
from tests.support.request_recorder import RequestRecorder
from tests.support.stacks import OwnStack
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e
MODEL = "deadline-ghost"  # known to validation, served by no worker: the test consumes its topic
LINES = 800


@pytest.fixture(scope="module")
def deadline_stack(own_stack: OwnStack) -> Iterator[Stack]:
    with own_stack(
        "deadline",
        ["api"],
        extra_env={
            "BATCHSTREAM_DISPATCH_DEADLINE_MARGIN_S": str(25 * 3600),  # past the window: at risk
            "BATCHSTREAM_DISPATCH_WORKER_WINDOW": "64",
        },
    ) as stack:
        env = stack.env()
        with MongoClient(env["BATCHSTREAM_MONGO_URI"]) as mongo:
            mongo[env["BATCHSTREAM_MONGO_DATABASE"]].models.update_one(
                {"_id": MODEL},
                {"$set": {"created": 1, "max_context_length": 2048, "endpoints": ["/v1/chat/completions"]}},
                upsert=True,
            )
        yield stack


@pytest.fixture
async def client(deadline_stack: Stack) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=deadline_stack.base_url, api_key=deadline_stack.api_key, max_retries=8
    ) as c:
        yield c


async def create_batch(client: AsyncOpenAI, prefix: str) -> Batch:
    lines = (
        json.dumps(
            {
                "custom_id": f"{prefix}-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"say {n}"}]},
            }
        )
        for n in range(LINES)
    )
    upload = await client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    return await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


async def test_the_batch_at_risk_due_first_is_sent_first_across_projects(
    deadline_stack: Stack, client: AsyncOpenAI
) -> None:
    # Two projects: without the risk, they would share. created_at is whole seconds, so two
    # seconds apart the later deadline lies strictly later.
    key = await asyncio.to_thread(deadline_stack.create_key, "later-team")
    later_client = AsyncOpenAI(base_url=deadline_stack.base_url, api_key=key, max_retries=8)
    due_first = await create_batch(client, "first")
    await eventually(_after(due_first.created_at + 2), 10, "two seconds to pass", interval_s=0.05)
    due_later = await create_batch(later_client, "later")
    assert (due_later.expires_at or 0) - (due_first.expires_at or 0) >= 2
    batches = (due_first.id, due_later.id)
    try:
        async with RequestRecorder(deadline_stack.kafka_settings(), MODEL) as recorder:
            await recorder.until(lambda: recorder.count(*batches) >= 2 * LINES, 120)
    finally:
        await client.batches.cancel(due_first.id)
        await later_client.batches.cancel(due_later.id)
        await later_client.close()
    sent = recorder.count(*batches)
    assert sent == 2 * LINES, f"{sent} of {2 * LINES} lines sent in 120 s"
    # Only the later batch's head start (its first round, ``start_lines``) may go before the
    # earlier batch is all sent; a fair share between the two would have sent about half of them.
    later_before = sum(
        _count_before_last(order, due_later.id, due_first.id) for order in recorder.by_partition().values()
    )
    assert later_before <= 64, f"{later_before} lines of the later batch went before the earlier's last"


def _count_before_last(order: list[str], counted: str, last_of: str) -> int:
    """How many ``counted`` entries come before the last ``last_of`` entry of one partition."""
    positions = [i for i, batch_id in enumerate(order) if batch_id == last_of]
    return order[: positions[-1]].count(counted) if positions else 0


def _after(moment: float) -> Any:
    async def passed() -> bool:
        return time.time() >= moment

    return passed
