"""The aggregator on the local stack: big batches, restarts, live counts, expiry and cancel.

A module-scoped stack of its own on the session's stand-in servers (its own topic prefix,
database and bucket): api, aggregator (fast sweep, short cancel timeout, quick rejoin) and one
inference worker on the instant fake engine. Batches for the ``ghost`` model (registered in
``models`` so validation accepts it, but no worker serves it) get their results published
straight to the results topic, the way workers publish them, so a test decides what arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import anthropic
import httpx
import psutil
import pytest
from aiokafka import AIOKafkaProducer
from anthropic.types.messages import MessageBatch
from openai import AsyncOpenAI
from openai.types import Batch

from deploy.local import ModelSpec, Stack
from shared.kafka import encode
from shared.mongo import Mongo
from shared.protocol.messages import LineError, ResponsePayload, ResultMessage
from shared.settings import MongoSettings
from shared.storage import ObjectStore, result_chunk_prefix
from shared.topics import results_topic
from tests.support.lines import chat_line, parse_jsonl, read_lines_async
from tests.support.stacks import FAKE_STACK_ENV, OwnStack
from tests.support.waiting import TERMINAL, eventually, wait_status_async, wait_until

pytestmark = pytest.mark.e2e
FAKE_MODEL = "fake-fast"
GHOST_MODEL = "ghost"
CANCEL_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def fast_stack(own_stack: OwnStack) -> Iterator[Stack]:
    model = ModelSpec("", FAKE_MODEL, engine="fake")
    with own_stack(
        "agg",
        ["api", "aggregator", model.component],
        models=[model],
        extra_env={**FAKE_STACK_ENV, "BATCHSTREAM_AGGREGATOR_CANCEL_TIMEOUT_S": str(CANCEL_TIMEOUT_S)},
    ) as stack:
        yield stack


@pytest.fixture
async def mongo(fast_stack: Stack) -> AsyncIterator[Mongo]:
    env = fast_stack.env()
    client = Mongo(
        MongoSettings(uri=env["BATCHSTREAM_MONGO_URI"], database=env["BATCHSTREAM_MONGO_DATABASE"])
    )
    now = time.time()
    await client.models.update_one(
        {"_id": GHOST_MODEL},
        {
            "$set": {
                "created": int(now),
                "max_context_length": 2048,
                "endpoints": ["/v1/chat/completions"],
                "last_seen": now + 3600,
            }
        },
        upsert=True,
    )
    yield client
    await client.close()


@pytest.fixture
async def client(fast_stack: Stack) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=fast_stack.base_url, api_key=fast_stack.api_key, max_retries=5) as c:
        yield c


@pytest.fixture
async def producer(fast_stack: Stack) -> AsyncIterator[AIOKafkaProducer]:
    kafka = fast_stack.kafka_settings()
    prod = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=5)
    await prod.start()
    yield prod
    await prod.stop()


# --- helpers


async def create_batch(client: AsyncOpenAI, model: str, lines: list[str]) -> Batch:
    upload = await client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    created = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    async def running() -> Batch | None:
        batch = await client.batches.retrieve(created.id)
        assert batch.status not in {"failed"}, batch.errors
        return batch if batch.status == "in_progress" else None

    return await eventually(running, 60, f"{created.id} in_progress")


async def wait_done(client: AsyncOpenAI, batch_id: str, done: int, timeout_s: float = 30) -> Batch:
    async def probe() -> Batch | None:
        batch = await client.batches.retrieve(batch_id)
        counts = batch.request_counts
        return batch if counts and counts.completed + counts.failed >= done else None

    return await eventually(probe, timeout_s, f"{batch_id} {done} lines counted")


def result(batch_id: str, line: int, custom_id: str, status: int = 200) -> ResultMessage:
    body: dict[str, Any] = (
        {
            "object": "chat.completion",
            "choices": [{"message": {"role": "assistant", "content": f"answer {line}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
        if status == 200
        else {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}}
    )
    return ResultMessage(
        request_id=f"batch_req_w{line:07d}",
        custom_id=custom_id,
        batch_id=batch_id,
        line=line,
        response=ResponsePayload(status_code=status, request_id=f"r{line}", body=body),
    )


async def publish(stack: Stack, producer: AIOKafkaProducer, results: list[ResultMessage]) -> None:
    topic = results_topic(stack.kafka_settings())
    futures = [await producer.send(topic, encode(r), key=(r.batch_id or "").encode()) for r in results]
    await asyncio.gather(*futures)


def metric(stack: Stack, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.ports.aggregator}/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


class RssSampler:
    """Samples a process's resident set size in a thread until stopped (MB)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self._process = psutil.Process(pid)
        self._interval = interval_s
        self._stop = threading.Event()
        self.samples: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._process.memory_info().rss / 2**20)
            except psutil.Error:
                return
            self._stop.wait(self._interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# --- tests


async def test_20000_lines_exact_counts_flat_memory_and_live_counts(
    fast_stack: Stack, client: AsyncOpenAI
) -> None:
    """(a) and (d): a 20,000-line batch through the fake-engine worker."""
    total = 20_000
    ids = [f"req-{n}" for n in range(1, total + 1)]
    pid = fast_stack.pid("aggregator")
    assert pid is not None
    with RssSampler(pid) as rss:
        baseline = rss.samples[0] if rss.samples else psutil.Process(pid).memory_info().rss / 2**20
        started = time.monotonic()
        upload = await client.files.create(
            file=("big.jsonl", "\n".join(chat_line(i, FAKE_MODEL) for i in ids).encode()),
            purpose="batch",
        )
        created = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        seen_completed: list[int] = []
        estimates: list[tuple[float, int, float]] = []  # (seen at, estimated end, its rate)
        while True:
            batch = await client.batches.retrieve(created.id)
            if batch.status in TERMINAL:
                break
            if batch.request_counts and batch.request_counts.completed not in seen_completed:
                seen_completed.append(batch.request_counts.completed)
            extra = batch.model_extra or {}
            if batch.status == "in_progress" and extra.get("estimated_completion_at") is not None:
                estimates.append(
                    (time.time(), extra["estimated_completion_at"], extra["estimated_rate_lines_per_s"])
                )
            assert time.monotonic() - started < 300, batch
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - started
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        total,
        total,
        0,
    )
    intermediate = [c for c in seen_completed if 0 < c < total]
    assert len(intermediate) >= 2, seen_completed
    assert seen_completed == sorted(seen_completed)  # never goes down
    # While it ran, the batch showed when it would end, at a rate it had shown; once ended, no more.
    assert estimates and all(rate > 0 and seen - 60 <= end <= seen + 3600 for seen, end, rate in estimates), (
        estimates
    )
    assert (batch.model_extra or {}).get("estimated_completion_at", "absent") is None
    output = await read_lines_async(client, batch.output_file_id)
    assert sorted(x["custom_id"] for x in output) == sorted(ids)
    usage = batch.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens == total
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    peak = max(rss.samples)
    print(
        f"\n20,000-line batch: {elapsed:.1f}s create-to-completed ({total / elapsed:,.0f} lines/s); "
        f"aggregator RSS baseline {baseline:.0f} MB, peak {peak:.0f} MB over {len(rss.samples)} samples; "
        f"{len(intermediate)} distinct intermediate completed counts: {intermediate[:8]}..."
    )
    assert peak < 400


async def test_sigkill_mid_batch_duplicates_and_late_results(
    fast_stack: Stack, client: AsyncOpenAI, producer: AIOKafkaProducer, mongo: Mongo
) -> None:
    """(b) and (c): SIGKILL mid-batch, restart via the supervisor; duplicates change nothing."""
    total = 3000
    ids = [f"req-{n}" for n in range(1, total + 1)]
    batch = await create_batch(client, GHOST_MODEL, [chat_line(i, GHOST_MODEL) for i in ids])
    results = [result(batch.id, n, ids[n - 1], 400 if n % 100 == 0 else 200) for n in range(1, total + 1)]
    await publish(fast_stack, producer, results[:1800] + results[:200])  # with duplicates
    await wait_done(client, batch.id, 1)

    pid = fast_stack.pid("aggregator")
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    await eventually(
        lambda: asyncio.sleep(0, result=fast_stack.pid("aggregator") is None), 10, "aggregator gone"
    )
    await publish(fast_stack, producer, results[1500:] + results[:100] + results[-50:])
    restarted = time.monotonic()
    await asyncio.to_thread(fast_stack.start, ["aggregator"])
    done = await wait_status_async(client, batch.id, {"completed"}, 120)
    print(f"\nrestarted aggregator completed the batch {time.monotonic() - restarted:.1f}s after restart")

    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        total,
        2970,
        30,
    )
    output = await read_lines_async(client, done.output_file_id)
    assert [x["custom_id"] for x in output] == [i for n, i in enumerate(ids, 1) if n % 100]
    errors = await read_lines_async(client, done.error_file_id)
    assert [x["custom_id"] for x in errors] == [i for n, i in enumerate(ids, 1) if n % 100 == 0]
    assert done.usage is not None and done.usage.total_tokens == 5 * 2970

    # Results redelivered after the end are dropped and counted in a metric.
    late_before = await asyncio.to_thread(
        metric, fast_stack, "batchstream_aggregator_late_results_dropped_total"
    )
    await publish(fast_stack, producer, results[:20])

    async def late_counted() -> bool:
        now = await asyncio.to_thread(metric, fast_stack, "batchstream_aggregator_late_results_dropped_total")
        return now >= late_before + 20

    await eventually(late_counted, 20, "late results counted")
    again = await client.batches.retrieve(batch.id)
    assert again.request_counts == done.request_counts


async def test_batch_expires_with_no_worker_alive(
    fast_stack: Stack, client: AsyncOpenAI, mongo: Mongo
) -> None:
    """(e): nothing serves the model; the window passes; every line becomes batch_expired."""
    ids = [f"exp-{n}" for n in range(1, 41)]
    lines = [chat_line(i, GHOST_MODEL) for i in ids]
    lines.insert(5, "")  # a blank line: numbered, never emitted
    batch = await create_batch(client, GHOST_MODEL, lines)
    assert batch.request_counts is not None and batch.request_counts.total == 40
    await mongo.batches.update_one({"_id": batch.id}, {"$set": {"expires_at": int(time.time()) - 1}})

    expired = await wait_status_async(client, batch.id, {"expired"}, 30)
    assert expired.expired_at and expired.completed_at is None
    assert expired.request_counts is not None
    assert (
        expired.request_counts.total,
        expired.request_counts.completed,
        expired.request_counts.failed,
    ) == (
        40,
        0,
        40,
    )
    assert expired.output_file_id is None and expired.error_file_id
    errors = await read_lines_async(client, expired.error_file_id)
    assert [x["custom_id"] for x in errors] == ids
    assert all(x["response"] is None and x["error"]["code"] == "batch_expired" for x in errors)
    assert len({x["id"] for x in errors}) == 40


async def test_cancelled_batch_keeps_partial_output(
    fast_stack: Stack, client: AsyncOpenAI, producer: AIOKafkaProducer, mongo: Mongo
) -> None:
    """(f) and the partial-output extension: some results, a cancel, the cancel timeout."""
    ids = [f"can-{n}" for n in range(1, 41)]
    lines = [chat_line(i, GHOST_MODEL) for i in ids]
    lines.insert(10, "   ")  # lines 11.. are numbered one past their index
    batch = await create_batch(client, GHOST_MODEL, lines)

    def number(index: int) -> int:  # 0-based request index -> 1-based file line
        return index + 1 if index < 10 else index + 2

    done = [result(batch.id, number(i), ids[i], 400 if i == 3 else 200) for i in range(15)]
    await publish(fast_stack, producer, done)
    await wait_done(client, batch.id, 15)

    # Partial output while the batch runs: batchstream's extension of the api.
    headers = {"Authorization": f"Bearer {fast_stack.api_key}"}
    async with httpx.AsyncClient(base_url=fast_stack.base_url, headers=headers) as http:
        so_far = await http.get(f"/batches/{batch.id}/partial_output")
        failed_so_far = await http.get(f"/batches/{batch.id}/partial_output?kind=error")
        missing = await http.get("/batches/batch_nope/partial_output")
    assert so_far.status_code == 200
    assert sorted(x["custom_id"] for x in parse_jsonl(so_far.text)) == sorted(
        ids[i] for i in range(15) if i != 3
    )
    assert [x["custom_id"] for x in parse_jsonl(failed_so_far.text)] == [ids[3]]
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "batch_id"

    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    # Workers answer some not-yet-run lines with batch_cancelled; the rest never come.
    answered = [
        ResultMessage(
            request_id=f"batch_req_c{i}",
            custom_id=ids[i],
            batch_id=batch.id,
            line=number(i),
            error=LineError(code="batch_cancelled", message="cancelled by the worker"),
        )
        for i in range(15, 20)
    ]
    await publish(fast_stack, producer, answered)
    cancelled = await wait_status_async(client, batch.id, {"cancelled"}, CANCEL_TIMEOUT_S + 30)
    assert cancelled.cancelled_at and cancelled.cancelling_at
    assert cancelled.cancelled_at >= cancelled.cancelling_at + CANCEL_TIMEOUT_S - 1
    assert cancelled.request_counts is not None
    assert (
        cancelled.request_counts.total,
        cancelled.request_counts.completed,
        cancelled.request_counts.failed,
    ) == (40, 14, 26)
    output = await read_lines_async(client, cancelled.output_file_id)
    assert [x["custom_id"] for x in output] == [ids[i] for i in range(15) if i != 3]
    errors = await read_lines_async(client, cancelled.error_file_id)
    assert [x["custom_id"] for x in errors] == [ids[3], *ids[15:]]
    assert errors[0]["response"]["status_code"] == 400
    assert [x["error"]["message"] for x in errors[1:6]] == ["cancelled by the worker"] * 5
    assert all(x["error"]["code"] == "batch_cancelled" and x["response"] is None for x in errors[1:])
    # Chunks are deleted after the batch turns terminal (a crash in between finalizes again).
    store = ObjectStore(fast_stack.storage_settings())

    async def chunks_deleted() -> bool:
        return not await store.list_keys(result_chunk_prefix(batch.id))

    await eventually(chunks_deleted, 30, "the batch's result chunks deleted")


# --- message batches (Anthropic's API) through the unmodified ``anthropic`` SDK on this stack


@pytest.fixture
def claude(fast_stack: Stack) -> Iterator[anthropic.Anthropic]:
    base = fast_stack.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key=fast_stack.api_key, max_retries=5) as c:
        yield c


def message_request(custom_id: str, model: str = FAKE_MODEL, **params: Any) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": f"Hi {custom_id}"}]}
    return {"custom_id": custom_id, "params": {**body, **params}}


def wait_ended(claude: anthropic.Anthropic, batch_id: str, timeout_s: float = 30) -> MessageBatch:
    def ended() -> MessageBatch | None:
        batch = claude.messages.batches.retrieve(batch_id)
        return batch if batch.processing_status == "ended" else None

    return wait_until(ended, timeout_s, f"message batch {batch_id} ended", interval_s=0.2)


async def test_a_message_batch_runs_with_the_anthropic_sdk(claude: anthropic.Anthropic) -> None:
    ids = [f"msg-{n}" for n in range(5)]
    created = claude.messages.batches.create(requests=[message_request(i) for i in ids])  # type: ignore[misc]
    assert created.type == "message_batch" and created.processing_status == "in_progress"
    assert created.results_url is None and created.ended_at is None
    assert sum(created.request_counts.model_dump().values()) == 5  # they sum to the requests
    assert created.expires_at - created.created_at == timedelta(hours=24)

    done = wait_ended(claude, created.id)
    assert done.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": 5,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    assert done.ended_at is not None and done.ended_at >= done.created_at
    assert done.results_url and done.results_url.endswith(f"/v1/messages/batches/{done.id}/results")
    results = list(claude.messages.batches.results(done.id))
    assert sorted(r.custom_id for r in results) == ids
    for r in results:
        assert r.result.type == "succeeded"
        message = r.result.message
        assert message.type == "message" and message.role == "assistant"
        assert message.model == FAKE_MODEL and message.content[0].type == "text"
        assert message.usage.input_tokens > 0 and message.usage.output_tokens == 1


async def test_message_batches_list_in_pages_both_ways(claude: anthropic.Anthropic) -> None:
    made = [claude.messages.batches.create(requests=[message_request("p")]).id for _ in range(3)]  # type: ignore[misc]
    first = claude.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    assert first.first_id == made[2] and first.last_id == made[1]
    listed = [b.id for b in claude.messages.batches.list(limit=2)]  # the SDK follows after_id
    assert listed[:3] == made[::-1]
    assert len(listed) == len(set(listed))
    newer = claude.messages.batches.list(before_id=made[0], limit=1)
    assert [b.id for b in newer.data] == [made[1]] and newer.has_more
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.batches.list(after_id="batch_nope")
    assert missing.value.body["type"] == "error"  # type: ignore[index]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


async def test_a_canceled_message_batch_keeps_its_results_and_can_be_deleted(
    claude: anthropic.Anthropic, mongo: Mongo
) -> None:
    """Two models in one batch: the served one answers, the ghost's requests never run."""
    requests = [message_request(f"run-{n}") for n in range(3)]
    requests += [message_request(f"wait-{n}", GHOST_MODEL) for n in range(2)]
    batch = claude.messages.batches.create(requests=requests)  # type: ignore[arg-type]

    def three_answered() -> bool:
        return claude.messages.batches.retrieve(batch.id).request_counts.succeeded == 3

    wait_until(three_answered, 30, "the served model's three answers")
    with pytest.raises(anthropic.BadRequestError, match="cancel it before deleting"):
        claude.messages.batches.delete(batch.id)
    canceling = claude.messages.batches.cancel(batch.id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    assert canceling.request_counts.processing == 2

    done = wait_ended(claude, batch.id, CANCEL_TIMEOUT_S + 30)
    counts = done.request_counts
    assert (counts.succeeded, counts.canceled, counts.errored, counts.processing) == (3, 2, 0, 0)
    stored = await mongo.batches.find_one({"_id": batch.id})  # counted once, at finalize
    assert stored is not None and stored["not_run_counts"] == {"batch_cancelled": 2, "batch_expired": 0}
    results = {r.custom_id: r.result.type for r in claude.messages.batches.results(batch.id)}
    assert results == {
        **dict.fromkeys([f"run-{n}" for n in range(3)], "succeeded"),
        "wait-0": "canceled",
        "wait-1": "canceled",
    }

    # Between its end and the recording of its end event a delete touches nothing.
    await mongo.batches.update_one({"_id": batch.id}, {"$set": {"end_recorded": False}})
    with pytest.raises(anthropic.BadRequestError, match="end is being recorded"):
        claude.messages.batches.delete(batch.id)
    assert len(list(claude.messages.batches.results(batch.id))) == 5  # its files are all there
    await mongo.batches.update_one({"_id": batch.id}, {"$set": {"end_recorded": True}})
    deleted = claude.messages.batches.delete(batch.id)
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.batches.retrieve(batch.id)
    assert batch.id not in [b.id for b in claude.messages.batches.list(limit=100)]


async def test_bad_message_batch_requests_are_each_named(
    claude: anthropic.Anthropic, fast_stack: Stack
) -> None:
    requests = [
        message_request("fine"),
        message_request("unknown-model", "no-such-model"),
        message_request("too-long", max_tokens=10**6),
        {"custom_id": "no-messages", "params": {"model": FAKE_MODEL, "max_tokens": 8}},
        {
            "custom_id": "no-max-tokens",
            "params": {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "x"}]},
        },
        message_request("bad id!"),
        message_request("fine"),
    ]
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    message = error["message"]
    assert message.startswith("6 invalid requests")
    for named in ("'unknown-model'", "'too-long'", "'no-messages'", "'no-max-tokens'", "'bad id!'"):
        assert f"(custom_id {named})" in message
    assert "no-such-model" in message and "exceeds the model's context length" in message
    assert "requests[6] (custom_id 'fine'): custom_id is not unique" in message
    assert "(custom_id 'fine'): " not in message.split("requests[6]")[0]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.batches.create(requests=[])
    wrong_key = anthropic.Anthropic(base_url=fast_stack.base_url.removesuffix("/v1"), api_key="nope")
    with pytest.raises(anthropic.AuthenticationError) as unauthorized:
        wrong_key.messages.batches.list()
    assert unauthorized.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


async def test_a_message_batch_beside_an_openai_batch_on_one_model(
    claude: anthropic.Anthropic, client: AsyncOpenAI
) -> None:
    """Both APIs on one model's queue, with exact counts; an OpenAI batch may carry Messages lines."""
    total = 300
    message_batch = claude.messages.batches.create(requests=[message_request(f"m{n}") for n in range(total)])  # type: ignore[misc]
    openai_batch = await create_batch(
        client, FAKE_MODEL, [chat_line(f"c{n}", FAKE_MODEL) for n in range(total)]
    )
    messages = [message_request(f"o{n}") for n in range(3)]
    lines = [
        json.dumps(
            {"custom_id": m["custom_id"], "method": "POST", "url": "/v1/messages", "body": m["params"]}
        )
        for m in messages
    ]
    upload = await client.files.create(file=("m.jsonl", "\n".join(lines).encode()), purpose="batch")
    messages_lines = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/messages", completion_window="24h"
    )

    done = wait_ended(claude, message_batch.id, 60)
    assert done.request_counts.succeeded == total and done.request_counts.errored == 0
    assert len({r.custom_id for r in claude.messages.batches.results(done.id)}) == total
    finished = await wait_status_async(client, openai_batch.id, TERMINAL, 60)
    assert finished.status == "completed" and finished.request_counts is not None
    assert (finished.request_counts.completed, finished.request_counts.failed) == (total, 0)
    # The message batch is a batch on the OpenAI side too, its lines' url /v1/messages.
    as_batch = await client.batches.retrieve(message_batch.id)
    assert as_batch.endpoint == "/v1/messages" and as_batch.status == "completed"
    with pytest.raises(anthropic.NotFoundError):  # an OpenAI batch is no message batch
        claude.messages.batches.retrieve(openai_batch.id)

    carried = await wait_status_async(client, messages_lines.id, TERMINAL, 60)
    assert carried.status == "completed"
    output = await read_lines_async(client, carried.output_file_id)
    assert [x["response"]["body"]["type"] for x in output] == ["message"] * 3


async def test_a_message_batch_survives_sigkills_of_the_worker_and_the_aggregator(
    fast_stack: Stack, claude: anthropic.Anthropic
) -> None:
    """Every request exactly once in the results, whatever the kills redeliver."""
    total = 10_000
    ids = [f"k{n}" for n in range(total)]
    batch = claude.messages.batches.create(requests=[message_request(i) for i in ids])  # type: ignore[misc]

    def succeeded_at_least(count: int) -> int | None:
        counts = claude.messages.batches.retrieve(batch.id).request_counts
        return counts.succeeded if counts.succeeded >= count else None

    def kill(component: str) -> None:
        pid = fast_stack.pid(component)
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: fast_stack.pid(component) is None, 10, f"{component} gone")

    worker = fast_stack.models[0].component
    wait_until(lambda: succeeded_at_least(1000), 60, "1,000 requests answered")
    kill(worker)
    assert claude.messages.batches.retrieve(batch.id).request_counts.processing > 0  # mid-batch
    fast_stack.start([worker])  # it rejoins its group while the aggregator is down
    kill("aggregator")
    fast_stack.start(["aggregator"])

    done = wait_ended(claude, batch.id, 180)
    assert done.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": total,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    answered = [r.custom_id for r in claude.messages.batches.results(batch.id)]
    assert len(answered) == total and set(answered) == set(ids)
