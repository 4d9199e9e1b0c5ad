"""The api's dispatcher on the local stack: head of line, kills, lost results, replicas, cancel.

A module-scoped stack of its own on the session's stand-in servers: api (short dispatch grace
periods and lease), aggregator (fast flushes, short cancel timeout) and one inference worker on the
instant fake engine. Lines of the ``ghost`` model (known to validation, served by no worker) stay
where the dispatcher puts them, so a test can count what was sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from openai import AsyncOpenAI
from openai.types import Batch
from pymongo import MongoClient

from deploy.local import ModelSpec, Stack, free_ports
from shared.topics import requests_topic
from tests.support.lines import chat_line
from tests.support.request_recorder import RequestRecorder, Sent
from tests.support.stacks import FAKE_STACK_ENV, OwnStack
from tests.support.waiting import TERMINAL, eventually, wait_terminal_async

pytestmark = pytest.mark.e2e
FAKE_MODEL = "fake-dispatch"
GHOST_MODEL = "ghost-dispatch"
FAKE = ModelSpec("", FAKE_MODEL, engine="fake")
OPS_PROJECT = "ops-team"  # the operator grants it tier 1 (the others are in tier 0)


@pytest.fixture(scope="module")
def dispatch_stack(own_stack: OwnStack) -> Iterator[Stack]:
    with own_stack(
        "disp",
        ["api", "aggregator", FAKE.component],
        models=[FAKE],
        extra_env={
            "BATCHSTREAM_DISPATCH_GRACE_S": "2",
            "BATCHSTREAM_DISPATCH_TAKEOVER_GRACE_S": "4",
            "BATCHSTREAM_DISPATCH_JOURNEY_CHECK_SECONDS": "0.5",
            "BATCHSTREAM_DISPATCH_LEASE_TTL_S": "3",
            "BATCHSTREAM_DISPATCH_LEASE_RENEW_S": "0.5",
            "BATCHSTREAM_DISPATCH_POSITION_FLUSH_S": "0.2",
            "BATCHSTREAM_DISPATCH_WORKER_WINDOW": "64",
            "BATCHSTREAM_DISPATCH_PROJECT_TIERS": f"{OPS_PROJECT}=1",
            **FAKE_STACK_ENV,
            "BATCHSTREAM_AGGREGATOR_CANCEL_TIMEOUT_S": "300",  # the dispatcher settles cancels
            # A group name in the worker's own settings would split it from the dispatcher's
            # meter; the group follows from the shared Kafka settings alone (test below).
            "BATCHSTREAM_INFERENCE_GROUP_ID": "a-group-of-its-own",
        },
    ) as stack:
        # The ghost model's topic exists before a RequestRecorder subscribes to it: a broker that
        # creates a topic a consumer asks for makes it with its own partition count (1 on noida-db
        # and on Apache Kafka by default), and a one-partition topic routes nothing.
        stack.provision([GHOST_MODEL])
        yield stack


@pytest.fixture(scope="module")
def db(dispatch_stack: Stack) -> Iterator[Any]:
    env = dispatch_stack.env()
    client: MongoClient[dict[str, Any]] = MongoClient(env["BATCHSTREAM_MONGO_URI"])
    database = client[env["BATCHSTREAM_MONGO_DATABASE"]]
    database.models.update_one(
        {"_id": GHOST_MODEL},
        {"$set": {"created": 1, "max_context_length": 2048, "endpoints": ["/v1/chat/completions"]}},
        upsert=True,
    )
    yield database
    client.close()


@pytest.fixture
async def client(dispatch_stack: Stack) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=dispatch_stack.base_url, api_key=dispatch_stack.api_key, max_retries=8
    ) as c:
        yield c


# --- helpers


async def create_batch(
    client: AsyncOpenAI, model: str, count: int, prefix: str = "req", priority: int = 0
) -> Batch:
    data = "\n".join(chat_line(f"{prefix}-{n}", model) for n in range(1, count + 1)).encode()
    upload = await client.files.create(file=("in.jsonl", data), purpose="batch")
    return await client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"priority": priority},
    )


def shared_prefix_lines(model: str, documents: int, questions: int, seed: int = 5) -> list[dict[str, Any]]:
    """Chat lines asking ``questions`` questions about each of ``documents`` long documents
    (~1,500 characters each), shuffled: the custom_id names the document (``doc<d>-q<q>``)."""
    lines = [
        {
            "custom_id": f"doc{d}-q{q}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [
                    {"role": "system", "content": "Answer from the document."},
                    {
                        "role": "user",
                        "content": f"Document {d}: " + " ".join(f"w{d}.{i}" for i in range(250)),
                    },
                    {"role": "user", "content": f"Question {q}: what does word {q} say?"},
                ],
            },
        }
        for d in range(documents)
        for q in range(questions)
    ]
    random.Random(seed).shuffle(lines)
    return lines


async def create_from_lines(client: AsyncOpenAI, lines: list[dict[str, Any]], **extra: Any) -> Batch:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    upload = await client.files.create(file=("in.jsonl", data), purpose="batch")
    return await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra
    )


async def output_ids(client: AsyncOpenAI, batch: Batch) -> list[str]:
    ids: list[str] = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            text = (await client.files.content(file_id)).text
            ids += [json.loads(line)["custom_id"] for line in text.splitlines() if line]
    return ids


async def _dispatchable(db: Any, batch_id: str) -> bool:
    doc = await asyncio.to_thread(db.batches.find_one, {"_id": batch_id}, {"dispatchable": 1})
    return bool((doc or {}).get("dispatchable"))


async def sent_lines(db: Any, batch_id: str) -> int:
    doc = await asyncio.to_thread(db.dispatch_positions.find_one, {"_id": batch_id})
    return int((doc or {}).get("sent", 0))


def every_line_once(ids: list[str], count: int, prefix: str = "req") -> bool:
    return sorted(ids) == sorted(f"{prefix}-{n}" for n in range(1, count + 1))


def start_api(stack: Stack) -> tuple[subprocess.Popen[bytes], str, str]:
    """Another api replica on the same stack (its own ports); its base URL and its metrics'."""
    ports = free_ports()
    port = ports.api
    env = {
        **os.environ,
        **stack.env(),
        "BATCHSTREAM_API_PORT": str(port),
        "BATCHSTREAM_API_METRICS_PORT": str(ports.api_metrics),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "services.api.app:create_app", "--factory", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ports.api_metrics}/metrics"


def metrics_url(stack: Stack) -> str:
    """The api's Prometheus page: on a port of its own, not the api's."""
    return f"http://127.0.0.1:{stack.ports.api_metrics}/metrics"


def leader_metric(metrics: str, model: str) -> float:
    try:
        text = httpx.get(metrics, timeout=5).text
    except httpx.HTTPError:
        return -1.0
    for line in text.splitlines():
        if line.startswith(f'batchstream_dispatch_leader{{model="{model}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def request_messages(stack: Stack, model: str, batch_id: str) -> list[tuple[int, int]]:
    """``(line, partition)`` of every request message of ``batch_id`` in the model's topic (read
    from the start, no group)."""
    consumer = AIOKafkaConsumer(
        requests_topic(stack.kafka_settings(), model),
        bootstrap_servers=stack.kafka_settings().bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    found: list[tuple[int, int]] = []
    try:
        while batch := await consumer.getmany(timeout_ms=1500):
            for tp, records in batch.items():
                for record in records:
                    message = json.loads(record.value or b"{}")
                    if message.get("batch_id") == batch_id:
                        found.append((int(message["line"]), tp.partition))
    finally:
        await consumer.stop()
    return found


async def partitions_of(stack: Stack, model: str, batch_id: str) -> dict[int, set[int]]:
    """Per line of ``batch_id``, the partitions its request messages went to."""
    found: dict[int, set[int]] = {}
    for line, partition in await request_messages(stack, model, batch_id):
        found.setdefault(line, set()).add(partition)
    return found


async def count_requests(stack: Stack, model: str, batch_id: str) -> int:
    """Request messages of ``batch_id`` in the model's topic."""
    return len(await request_messages(stack, model, batch_id))


# --- tests


async def test_a_small_batch_created_behind_a_big_one_completes_first(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    big = await create_batch(client, FAKE_MODEL, 15_000, prefix="big")
    await eventually(lambda: sent_lines(db, big.id), 60, "the big batch dispatching")
    metrics = await _metrics(dispatch_stack)
    queued = f'batchstream_dispatch_queued_lines{{model="{FAKE_MODEL}",project="default"}}'
    assert any(line.startswith(queued) and float(line.split()[-1]) > 0 for line in metrics), metrics
    for name in ("batchstream_dispatch_lines_total", "batchstream_dispatch_topic_backlog"):
        assert any(line.startswith(f'{name}{{model="{FAKE_MODEL}"}}') for line in metrics), name
    started = time.monotonic()
    small = await create_batch(client, FAKE_MODEL, 10, prefix="small")
    small_done = await wait_terminal_async(client, small.id, 60)
    small_s = time.monotonic() - started
    big_then = await client.batches.retrieve(big.id)

    assert small_done.status == "completed"
    assert big_then.status not in TERMINAL, f"the big batch ended first ({small_s:.1f}s)"
    assert big_then.request_counts is not None and big_then.request_counts.completed < 15_000
    print(f"\nsmall batch behind a 15,000-line batch: {small_s:.2f}s")
    big_done = await wait_terminal_async(client, big.id, 300)
    assert big_done.status == "completed"
    assert every_line_once(await output_ids(client, big_done), 15_000, prefix="big")


async def test_an_idle_dispatcher_rests_between_rounds(dispatch_stack: Stack, client: AsyncOpenAI) -> None:
    """Once its batches have ended, the dispatcher wakes a few times a second (each refresh, and
    this stack's position and lease timers: 0.2-0.5 s), not in a loop that never rests (an api
    burning a core while nothing is queued)."""
    done = await wait_terminal_async(
        client, (await create_batch(client, FAKE_MODEL, 10, prefix="idle")).id, 60
    )
    assert done.status == "completed"
    queued = [m for m in await _metrics(dispatch_stack) if m.startswith("batchstream_dispatch_queued_lines{")]
    assert all(float(m.split()[-1]) == 0 for m in queued), f"an earlier test left lines queued: {queued}"
    await asyncio.sleep(1.0)  # the refresh that forgets the ended batch, and a reading after it
    before = _metric(await _metrics(dispatch_stack), "batchstream_dispatch_rounds_total")
    window_s = 2.0
    await asyncio.sleep(window_s)  # a rate is counted over a window: nothing to wait on
    rounds = _metric(await _metrics(dispatch_stack), "batchstream_dispatch_rounds_total") - before
    assert 0 < rounds <= 15 * window_s, f"{rounds:.0f} rounds in {window_s} s"


@pytest.mark.second_broker
async def test_the_dispatcher_meters_the_group_its_workers_joined(client: AsyncOpenAI) -> None:
    """The stack has a topic prefix (which names the workers' group) and a worker-side group
    setting (which must name nothing). A dispatcher that meters a group no worker joined sees no
    commit and no member: once the smallest backlog target (64 lines here) is sent, the rest of
    the batch never goes."""
    batch = await create_batch(client, FAKE_MODEL, 1_000, prefix="group")
    done = await wait_terminal_async(client, batch.id, 120)
    assert done.status == "completed"
    assert every_line_once(await output_ids(client, done), 1_000, prefix="group")


async def test_lines_sharing_a_prefix_are_sent_together_to_one_partition(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    """A shuffled file of 8 documents x 4 questions: each document's lines leave together, in one
    partition (one worker's cache), and the batch says it is sent in prefix order."""
    lines = shared_prefix_lines(GHOST_MODEL, documents=8, questions=4)
    async with RequestRecorder(dispatch_stack.kafka_settings(), GHOST_MODEL) as recorder:
        batch = await create_from_lines(client, lines)
        assert await recorder.until(lambda: recorder.count(batch.id) >= len(lines), 60), "not all sent"
    try:
        shown = await client.batches.retrieve(batch.id)
        assert (shown.model_extra or {}).get("prefix_order") is True
        doc_of = {n: line["custom_id"].split("-")[0] for n, line in enumerate(lines, 1)}
        mine = sorted(
            (s for s in recorder.order() if s.batch_id == batch.id), key=lambda s: (s.partition, s.offset)
        )
        partitions = {
            doc: {s.partition for s in mine if doc_of[s.line] == doc} for doc in set(doc_of.values())
        }
        assert all(len(p) == 1 for p in partitions.values()), partitions
        sequence = [doc_of[s.line] for s in mine]
        runs = [d for i, d in enumerate(sequence) if i == 0 or sequence[i - 1] != d]
        assert sorted(runs) == sorted(set(doc_of.values())), sequence  # one run per document
        assert len({p for ps in partitions.values() for p in ps}) > 1, "every document on one partition"
    finally:
        await client.batches.cancel(batch.id)


async def test_a_prefix_ordered_batch_keeps_the_input_order_and_may_opt_out(client: AsyncOpenAI) -> None:
    lines = shared_prefix_lines(FAKE_MODEL, documents=6, questions=5, seed=11)
    for n, line in enumerate(lines):  # lengths that differ: the order goes longest first too
        line["body"]["max_tokens"] = 1 + n * 7 % 5
    ordered = await create_from_lines(client, lines)
    plain = await create_from_lines(client, lines, prefix_order=False)
    for batch, expected in ((ordered, True), (plain, False)):
        done = await wait_terminal_async(client, batch.id, 120)
        assert done.status == "completed"
        assert (done.model_extra or {}).get("prefix_order") is expected
        assert done.output_file_id is not None
        text = (await client.files.content(done.output_file_id)).text
        assert [json.loads(row)["custom_id"] for row in text.splitlines()] == [x["custom_id"] for x in lines]


async def test_a_prefix_keeps_its_partition_across_batches_and_a_worker_restart(
    dispatch_stack: Stack, client: AsyncOpenAI
) -> None:
    """The same documents in a later batch, after the worker was restarted: each document's lines
    go to the partition they went to before (the worker that holds that partition has the
    prefix cached), and both batches complete."""
    lines = shared_prefix_lines(FAKE_MODEL, documents=6, questions=4, seed=21)
    doc_of = {n: line["custom_id"].split("-")[0] for n, line in enumerate(lines, 1)}

    async def placed(batch: Batch) -> dict[str, set[int]]:
        done = await wait_terminal_async(client, batch.id, 120)
        assert done.status == "completed"
        by_line = await partitions_of(dispatch_stack, FAKE_MODEL, batch.id)
        assert set(by_line) == set(doc_of)
        return {
            doc: set().union(*(p for n, p in by_line.items() if doc_of[n] == doc))
            for doc in set(doc_of.values())
        }

    before = await placed(await create_from_lines(client, lines))
    assert all(len(p) == 1 for p in before.values()), before
    dispatch_stack.stop([FAKE.component])
    await asyncio.to_thread(dispatch_stack.start, [FAKE.component])
    random.Random(3).shuffle(lines)  # another file, the same prefixes
    doc_of = {n: line["custom_id"].split("-")[0] for n, line in enumerate(lines, 1)}
    after = await placed(await create_from_lines(client, lines))
    assert after == before


async def test_a_dispatcher_killed_mid_batch_resumes_with_every_line_once(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    total = 15_000
    batch = await create_batch(client, FAKE_MODEL, total)
    await eventually(lambda: _at_least(sent_lines(db, batch.id), 2000), 120, "2,000 lines dispatched")
    pid = dispatch_stack.pid("api")
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    killed_at = await sent_lines(db, batch.id)
    assert killed_at < total, "the batch was wholly dispatched before the kill"
    await asyncio.to_thread(dispatch_stack.start, ["api"])

    done = await wait_terminal_async(client, batch.id, 300)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (total, 0)
    assert every_line_once(await output_ids(client, done), total)
    # It resumed from the persisted position rather than from the start of the file (lines the
    # restarted dispatcher sent again on purpose, as lost, are counted apart).
    resent = _metric(
        await _metrics(dispatch_stack), f'batchstream_dispatch_lines_resent_total{{model="{FAKE_MODEL}"}}'
    )
    assert await count_requests(dispatch_stack, FAKE_MODEL, batch.id) - resent < total + killed_at


async def test_a_dispatcher_killed_mid_batch_resumes_a_prefix_ordered_batch(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    """The same for a batch in prefix order: the position counts entries of its order, and a
    takeover's check reads the order's first entries."""
    lines = shared_prefix_lines(FAKE_MODEL, documents=200, questions=30, seed=13)
    batch = await create_from_lines(client, lines)
    await eventually(lambda: _at_least(sent_lines(db, batch.id), 1000), 120, "1,000 lines dispatched")
    pid = dispatch_stack.pid("api")
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    killed_at = await sent_lines(db, batch.id)
    assert killed_at < len(lines), "the batch was wholly dispatched before the kill"
    await asyncio.to_thread(dispatch_stack.start, ["api"])

    done = await wait_terminal_async(client, batch.id, 300)
    assert done.status == "completed" and (done.model_extra or {}).get("prefix_order") is True
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (len(lines), 0)
    assert done.output_file_id is not None
    text = (await client.files.content(done.output_file_id)).text
    assert [json.loads(row)["custom_id"] for row in text.splitlines()] == [x["custom_id"] for x in lines]
    resent = _metric(
        await _metrics(dispatch_stack), f'batchstream_dispatch_lines_resent_total{{model="{FAKE_MODEL}"}}'
    )
    assert await count_requests(dispatch_stack, FAKE_MODEL, batch.id) - resent < len(lines) + killed_at


async def test_results_dropped_between_worker_and_aggregator_are_sent_again(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    """A member of the workers' group consumes requests and commits past them with no result."""
    dispatch_stack.stop([FAKE.component])
    total = 40
    async with RequestRecorder(dispatch_stack.kafka_settings(), FAKE_MODEL) as black_hole:
        batch = await create_batch(client, FAKE_MODEL, total, prefix="drop")
        swallowed = await black_hole.until(lambda: black_hole.count(batch.id) >= total, 60)
    assert swallowed, "the black hole did not swallow the batch"
    await asyncio.to_thread(dispatch_stack.start, [FAKE.component])

    done = await wait_terminal_async(client, batch.id, 120)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (total, 0)
    assert every_line_once(await output_ids(client, done), total, prefix="drop")
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(metrics_url(dispatch_stack))).text
    assert f'batchstream_dispatch_lines_resent_total{{model="{FAKE_MODEL}"}}' in metrics


async def test_two_api_replicas_dispatch_through_one_and_hand_over(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    total = 15_000
    proc, other, other_metrics = start_api(dispatch_stack)
    main, main_metrics = dispatch_stack.base_url.removesuffix("/v1"), metrics_url(dispatch_stack)
    try:
        await eventually(lambda: asyncio.to_thread(_health, other), 60, "the second api")
        batch = await create_batch(client, FAKE_MODEL, total, prefix="rep")
        await eventually(lambda: _at_least(sent_lines(db, batch.id), 1000), 120, "dispatching")
        leaders = [leader_metric(m, FAKE_MODEL) for m in (main_metrics, other_metrics)]
        assert sorted(leaders) == [0.0, 1.0], leaders
        lease = db.dispatch_leases.find_one({"_id": FAKE_MODEL})
        assert lease is not None and lease["expires_at"] > time.time()
        # Kill the replica dispatching; the other takes over once the lease lapses.
        if leaders[1] == 1.0:
            os.killpg(proc.pid, signal.SIGKILL)
            survivor, survivor_metrics = main, main_metrics
        else:
            pid = dispatch_stack.pid("api")
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)
            survivor, survivor_metrics = other, other_metrics
        await eventually(
            lambda: asyncio.to_thread(lambda: leader_metric(survivor_metrics, FAKE_MODEL) == 1.0),
            30,
            "the takeover",
        )
        survivor_client = AsyncOpenAI(
            base_url=f"{survivor}/v1", api_key=dispatch_stack.api_key, max_retries=8
        )
        done = await wait_terminal_async(survivor_client, batch.id, 300)
        assert done.status == "completed"
        assert every_line_once(await output_ids(survivor_client, done), total, prefix="rep")
        await survivor_client.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
        await asyncio.to_thread(dispatch_stack.start, ["api"])


async def test_a_cancel_sends_no_further_lines(dispatch_stack: Stack, client: AsyncOpenAI, db: Any) -> None:
    total = 15_000
    batch = await create_batch(client, FAKE_MODEL, total, prefix="cancel")
    await eventually(lambda: _at_least(sent_lines(db, batch.id), 1000), 120, "lines dispatched")
    await client.batches.cancel(batch.id)
    at_cancel = await count_requests(dispatch_stack, FAKE_MODEL, batch.id)

    done = await wait_terminal_async(client, batch.id, 60)
    assert done.status == "cancelled"
    final = await count_requests(dispatch_stack, FAKE_MODEL, batch.id)
    # At most the round under way when the cancel was read; the rest never left object storage.
    assert final - at_cancel <= 512 and final < total
    assert done.request_counts is not None
    assert done.request_counts.completed <= final
    assert done.request_counts.completed + done.request_counts.failed == total
    assert done.error_file_id
    lines = (await client.files.content(done.error_file_id)).text.splitlines()
    codes = [json.loads(line)["error"]["code"] for line in lines]
    assert codes.count("batch_cancelled") >= total - final


def mixed_lines(total: int, prefix: str) -> list[dict[str, Any]]:
    """Chat lines of a mixed batch: two of every three for the served model, one for a model
    nobody serves (answered ``model_not_found`` by the dispatcher)."""
    return [
        json.loads(chat_line(f"{prefix}-{n}", FAKE_MODEL if n % 3 else "nobody-serves-it"))
        for n in range(1, total + 1)
    ]


async def test_a_mixed_batch_survives_a_dispatcher_killed_mid_batch_with_every_line_once(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    total = 12_000
    batch = await create_from_lines(client, mixed_lines(total, "mix"), mixed_models=True)
    # The served model's part is the batch's first (its first line names it).
    await eventually(lambda: _at_least(sent_lines(db, f"{batch.id}#0"), 2000), 120, "2,000 lines dispatched")
    pid = dispatch_stack.pid("api")
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    await asyncio.to_thread(dispatch_stack.start, ["api"])

    done = await wait_terminal_async(client, batch.id, 300)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (total - total // 3, total // 3)
    assert every_line_once(await output_ids(client, done), total, "mix")
    text = (await client.files.content(done.error_file_id or "")).text
    assert {json.loads(line)["error"]["code"] for line in text.splitlines()} == {"model_not_found"}


async def test_a_cancelled_mixed_batch_ends_once_every_part_settled(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    total = 15_000
    batch = await create_from_lines(client, mixed_lines(total, "mixc"), mixed_models=True)
    await eventually(lambda: _at_least(sent_lines(db, f"{batch.id}#0"), 1000), 120, "lines dispatched")
    await client.batches.cancel(batch.id)
    # The aggregator's cancel timeout is 300 s here: only the parts' settling ends it sooner.
    done = await wait_terminal_async(client, batch.id, 60)
    assert done.status == "cancelled"
    stored = await asyncio.to_thread(db.batches.find_one, {"_id": batch.id}, {"settled_parts": 1})
    assert sorted(stored["settled_parts"]) == [0, 1]
    assert done.request_counts is not None
    assert done.request_counts.completed + done.request_counts.failed == total
    assert every_line_once(await output_ids(client, done), total, "mixc")


async def test_projects_share_and_a_priority_orders_only_its_own_projects_batches(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    """The test is the workers' group (it consumes, commits, answers nothing) and reads the order.

    The default project queues three batches, "other-team" one later (deadlines seconds apart,
    none at risk): shared by project, each project gets half of the lines; shared by batch (a
    policy blind to projects), the default project would get three quarters, and ordered by
    deadline the later one would wait for all of them. Then the default project's priority-100
    batch takes its own project's share and no more: "other-team" keeps half.
    """
    key = await asyncio.to_thread(dispatch_stack.create_key, "other-team")
    other = AsyncOpenAI(base_url=dispatch_stack.base_url, api_key=key, max_retries=8)
    dispatch_stack.stop([FAKE.component])
    try:
        async with RequestRecorder(dispatch_stack.kafka_settings(), FAKE_MODEL) as recorder:
            mine = [await create_batch(client, FAKE_MODEL, 6000, prefix=f"mine{n}") for n in range(3)]
            # The other team comes while the default project has the workers to itself: it must
            # get its share from then on, not first catch up on what was sent before it came.
            started = await recorder.until(lambda: recorder.count(*(b.id for b in mine)) >= 3000, 60)
            assert started, "the default project's batches were not dispatched"
            theirs = await create_batch(other, FAKE_MODEL, 8000, prefix="theirs")
            shared = await recorder.until(lambda: recorder.count(theirs.id) >= 2000, 60)
            assert shared, "the other project's batch was not dispatched"
            # The workers pause (nothing is consumed, so the dispatcher only tops the topic's backlog
            # up) until the urgent batch may be dispatched: however slow its upload and validation,
            # the others still have lines queued when it goes.
            urgent = await create_batch(client, FAKE_MODEL, 600, prefix="urgent", priority=100)
            await eventually(lambda: _dispatchable(db, urgent.id), 60, "the urgent batch validated")
            sent_all = await recorder.until(lambda: recorder.count(urgent.id) >= 600, 60)
            assert sent_all, f"{recorder.count(urgent.id)} of the urgent batch's 600 lines were sent"
            # Each project still had lines queued when the urgent batch's last line went.
            last_urgent = max(s.timestamp_ms for s in recorder.order() if s.batch_id == urgent.id)
            project_of = {theirs.id: "other-team", **{b.id: "default" for b in mine}}
            await recorder.until(lambda: len(_sent_after(recorder, last_urgent, project_of)) == 2, 60)
            assert _sent_after(recorder, last_urgent, project_of) == {"default", "other-team"}
    finally:
        await asyncio.to_thread(dispatch_stack.start, [FAKE.component])
    order = recorder.order()  # each line's first send (a line sent again counts once)
    sizes = {**{b.id: 6000 for b in mine}, theirs.id: 8000}
    first_urgent = next(s.timestamp_ms for s in order if s.batch_id == urgent.id)
    # Fair share, over the rounds in which every one of the four batches had lines queued.
    contended = _contended(order, sizes, first_urgent)
    assert len(contended) >= 3000, f"only {len(contended)} lines sent while all four were queued"
    share = sum(b != theirs.id for b in contended) / len(contended)
    assert 0.35 <= share <= 0.65, f"project shares {share:.2f} / {1 - share:.2f} (3 batches / 1)"
    # Priority, within the default project only: while the urgent batch's 600 lines went, the
    # default project's other batches waited, and the other team kept about half of the lines
    # (with a priority across projects it would have had none of them): about 600, and at least
    # half that whatever the rounds' boundaries (the urgent batch's head start goes first).
    urgent_at = [i for i, s in enumerate(order) if s.batch_id == urgent.id]
    during = Counter(project_of.get(s.batch_id, "urgent") for s in order[urgent_at[0] : urgent_at[-1]])
    assert during["default"] <= 50, f"{during['default']} lines of the default project's other batches"
    assert 300 <= during["other-team"] <= 900, f"the other team got {during['other-team']} beside 600"
    for owner, batch in ((client, urgent), *((client, b) for b in mine), (other, theirs)):
        await owner.batches.cancel(batch.id)
    await other.close()


async def test_a_project_the_operator_granted_a_tier_goes_first(
    dispatch_stack: Stack, client: AsyncOpenAI, db: Any
) -> None:
    """The stack grants ``OPS_PROJECT`` tier 1: its batch, created while the default project's runs,
    has every round until its last line went (in a fair share the other would have had half).
    The test is the ghost model's workers' group (it consumes, commits, answers nothing)."""
    key = await asyncio.to_thread(dispatch_stack.create_key, OPS_PROJECT)
    ops = AsyncOpenAI(base_url=dispatch_stack.base_url, api_key=key, max_retries=8)
    async with RequestRecorder(dispatch_stack.kafka_settings(), GHOST_MODEL) as recorder:
        plain = await create_batch(client, GHOST_MODEL, 2000, prefix="plain")
        started = await recorder.until(lambda: recorder.count(plain.id) >= 200, 60)
        assert started, "the default project's batch was not dispatched"
        # Nothing is consumed meanwhile: the dispatcher only tops the topic's backlog up.
        granted = await create_batch(ops, GHOST_MODEL, 500, prefix="ops")
        await eventually(lambda: _dispatchable(db, granted.id), 60, "the ops batch validated")
        sent_all = await recorder.until(lambda: recorder.count(granted.id) >= 500, 60)
        assert sent_all, f"{recorder.count(granted.id)} of the ops batch's 500 lines were sent"
    order = recorder.order()
    at = [i for i, s in enumerate(order) if s.batch_id == granted.id]
    beside = sum(s.batch_id == plain.id for s in order[at[0] : at[-1]])
    assert beside <= 50, f"{beside} lines of the tier-0 batch went while the tier-1 batch's 500 did"
    assert recorder.count(plain.id) < 2000  # it still had lines queued
    await client.batches.cancel(plain.id)
    await ops.batches.cancel(granted.id)
    await ops.close()


def _sent_after(recorder: RequestRecorder, after_ms: int, project_of: dict[str, str]) -> set[str]:
    """The projects (``project_of`` maps their batches) with a line first sent after ``after_ms``."""
    return {
        project_of[s.batch_id]
        for s in recorder.order()
        if s.batch_id in project_of and s.timestamp_ms > after_ms
    }


def _contended(order: list[Sent], sizes: dict[str, int], before_ms: int) -> list[str]:
    """The batch of each line of ``sizes``' batches first sent while all of them had lines queued.

    From the millisecond the last of them started (its first line leads that round) up to, not
    including, ``before_ms`` or the millisecond the first of them sent its last line. Lines are
    ordered by their record's send time in milliseconds: the window's ends are cut at whole
    milliseconds, as the order within one is unknown.
    """
    lines: dict[str, list[int]] = {batch_id: [] for batch_id in sizes}
    for sent in order:
        if sent.batch_id in lines:
            lines[sent.batch_id].append(sent.timestamp_ms)
    start = max(times[0] for times in lines.values())
    ran_out = [times[-1] for batch_id, times in lines.items() if len(times) >= sizes[batch_id]]
    end = min([before_ms, *ran_out])
    return [s.batch_id for s in order if s.batch_id in sizes and start <= s.timestamp_ms < end]


async def test_priority_is_echoed_and_checked(dispatch_stack: Stack, client: AsyncOpenAI) -> None:
    upload = await client.files.create(
        file=("p.jsonl", chat_line("p-1", GHOST_MODEL).encode()), purpose="batch"
    )
    body = {"input_file_id": upload.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    headers = {"Authorization": f"Bearer {dispatch_stack.api_key}"}
    async with httpx.AsyncClient(base_url=dispatch_stack.base_url, headers=headers) as http:
        created = await http.post("/batches", json={**body, "priority": 7})
        assert created.status_code == 200 and created.json()["priority"] == 7
        default = await http.post("/batches", json={**body, "metadata": {"n": "2"}})
        assert default.json()["priority"] == 0
        for bad in ("high", 1.5, 1000):
            wrong = await http.post("/batches", json={**body, "priority": bad})
            assert wrong.status_code == 400, wrong.text
            assert wrong.json()["error"]["param"] == "priority"
        for answer in (created, default):
            await http.post(f"/batches/{answer.json()['id']}/cancel")


async def _metrics(stack: Stack) -> list[str]:
    async with httpx.AsyncClient() as http:
        return (await http.get(metrics_url(stack))).text.splitlines()


def _metric(lines: list[str], name: str) -> float:
    return sum(float(line.split()[-1]) for line in lines if line.startswith(name + " "))


async def _at_least(count: Any, minimum: int) -> bool:
    return bool(await count >= minimum)


def _health(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
