"""The aggregator worker against real-protocol stand-ins: Kafka (Tansu), SecantusDB, SeaweedFS.

A module-scoped stack of its own on the session's stand-in servers (its own topic prefix,
database, bucket and aggregator port) runs ``python -m services.aggregator``; the tests publish
result messages the way inference workers do (keyed by the raw batch id, at-least-once) and check
what lands in MongoDB and S3. The aggregator is killed and restarted through the stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
from aiokafka import AIOKafkaProducer

from deploy.local import REPO_ROOT, Stack
from services.aggregator.finalize import output_file_id
from shared.kafka import encode
from shared.mongo import Mongo
from shared.protocol.messages import LineError, ResponsePayload, ResultMessage
from shared.result_chunks import encode_chunk
from shared.settings import KafkaSettings, MongoSettings
from shared.storage import ObjectStore, file_key, result_chunk_prefix
from shared.topics import results_topic
from tests.support.metrics import metric_value
from tests.support.stacks import FAKE_STACK_ENV, OwnStack
from tests.support.waiting import eventually, wait_stored_status

# A stalled worker exits this long after reporting it: time for a test to read /health and the metric.
STALL_EXIT_DELAY_S = "6"
AGGREGATOR_ENV = {
    "BATCHSTREAM_LOG_LEVEL": os.environ.get("AGGREGATOR_TEST_LOG_LEVEL", "INFO"),
    **FAKE_STACK_ENV,
    "BATCHSTREAM_AGGREGATOR_CHUNK_LINES": "1000",
    # Short enough that a watchdog firing on a healthy worker shows up here (the worker exits).
    "BATCHSTREAM_AGGREGATOR_STALL_TIMEOUT_S": "15",
    "BATCHSTREAM_AGGREGATOR_STALL_UNASSIGNED_TIMEOUT_S": "30",
    "BATCHSTREAM_AGGREGATOR_STALL_CHECK_SECONDS": "0.5",
    # Results faust dropped after a restart are fetched again after 2 s (offset_gaps.py).
    "BATCHSTREAM_AGGREGATOR_GAP_REWIND_AFTER_S": "2",
    "BATCHSTREAM_AGGREGATOR_GAP_CHECK_SECONDS": "0.5",
}


@pytest.fixture(scope="module")
def agg_stack(own_stack: OwnStack) -> Iterator[Stack]:
    """Bucket and topics provisioned; the aggregator is started by the ``aggregator`` fixture."""
    with own_stack("aggw", [], extra_env=AGGREGATOR_ENV) as stack:
        yield stack


@pytest.fixture
def aggregator(agg_stack: Stack) -> int:
    """The aggregator's PID; started (again) if it is not running, left alone if it is."""
    agg_stack.start(["aggregator"])
    pid = agg_stack.pid("aggregator")
    assert pid is not None
    return pid


@dataclass
class Clients:
    kafka: KafkaSettings
    mongo: Mongo
    store: ObjectStore
    producer: AIOKafkaProducer


@pytest.fixture(scope="module")
async def clients(agg_stack: Stack) -> AsyncIterator[Clients]:
    kafka = agg_stack.kafka_settings()
    mongo = Mongo(
        MongoSettings(uri=agg_stack.env()["BATCHSTREAM_MONGO_URI"], database=agg_stack.mongo_database)
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=5)
    await producer.start()
    try:
        yield Clients(kafka, mongo, ObjectStore(agg_stack.storage_settings()), producer)
    finally:
        await producer.stop()
        await mongo.close()


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


# --- helpers


def health_url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.ports.aggregator}/health"


async def stalled_health(stack: Stack) -> dict[str, Any] | None:
    """The aggregator's /health body once it answers 503 ``stalled``; None before."""
    try:
        await asyncio.to_thread(http_get, health_url(stack))
    except urllib.error.HTTPError as error:
        body: dict[str, Any] = json.loads(error.read())
        return body if body["status"] == "stalled" else None
    except OSError:
        return None  # not listening yet
    return None


async def wait_drained(stack: Stack) -> None:
    """Idle again: every owned results partition's offsets are committed up to its high-water mark
    (the watchdog's backlog is 0), so a restart would not deliver a processed result again."""

    async def drained() -> dict[str, Any] | None:
        body = json.loads(await asyncio.to_thread(http_get, health_url(stack)))
        return body if body["backlog"] and not any(body["backlog"].values()) else None

    await eventually(drained, 30, "backlog 0 on every owned partition")


async def insert_batch(mongo: Mongo, total: int, status: str = "in_progress") -> str:
    batch_id = f"batch_{uuid.uuid4().hex[:24]}"
    now = int(time.time())
    await mongo.batches.insert_one(
        {
            "_id": batch_id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "model": "m",
            "input_file_id": "file-in",
            "completion_window": "24h",
            "status": status,
            "created_at": now,
            "in_progress_at": now,
            "expires_at": now + 86400,
            "request_counts": {"total": total, "completed": 0, "failed": 0},
            "project": "proj-a",
            "defaults": {},
            "emitted": True,
        }
    )
    return batch_id


def make_result(batch_id: str, line: int, status: int = 200) -> ResultMessage:
    body: dict[str, Any]
    if status == 200:
        body = {
            "object": "chat.completion",
            "choices": [{"message": {"content": f"answer {line}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
    else:
        body = {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}}
    return ResultMessage(
        request_id=f"batch_req_{line:06d}",
        custom_id=f"req-{line}",
        batch_id=batch_id,
        line=line,
        response=ResponsePayload(status_code=status, request_id=f"r{line}", body=body),
    )


async def publish(clients: Clients, results: list[ResultMessage]) -> None:
    topic = results_topic(clients.kafka)
    futures = [
        await clients.producer.send(topic, encode(r), key=(r.batch_id or "").encode()) for r in results
    ]
    await asyncio.gather(*futures)


async def read_lines(store: ObjectStore, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) async for line in store.iter_lines(file_key(file_id))]


def spawn_aggregator(stack: Stack, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The stack's aggregator command with ``env`` on top, not waited for (it may never be healthy)."""
    comp = stack.components()["aggregator"]
    if comp.prepare is not None:
        comp.prepare()
    log_path = stack.log_file("aggregator")
    log_path.parent.mkdir(parents=True, exist_ok=True)  # a test run alone starts no component first
    with log_path.open("ab") as log:
        return subprocess.Popen(
            comp.argv,
            env={**comp.env, **env},
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


# --- tests


async def test_health_and_metrics(agg_stack: Stack, aggregator: int) -> None:
    port = agg_stack.ports.aggregator
    health = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/health")
    assert json.loads(health)["status"] == "healthy"
    live = json.loads(await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/livez"))
    assert live["status"] == "alive"

    async def processing() -> dict[str, Any] | None:
        ready = json.loads(await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/readyz"))
        return ready if ready["phase"] == "processing" else None

    ready = await eventually(processing, 30, "/readyz phase processing")
    health = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/health")  # the same page
    assert ready["status"] == json.loads(health)["status"] == "healthy"
    assert set(ready["backlog"]) == set(json.loads(health)["backlog"]) and ready["backlog"]
    metrics = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
    assert b"batchstream_aggregator_results_processed_total" in metrics
    assert b"batchstream_aggregator_stalls_total 0.0" in metrics
    assert b'batchstream_aggregator_phase{batchstream_aggregator_phase="processing"} 1.0' in metrics
    for view in ("/table/", "/router/", "/graph/", "/stats/"):  # faust's own views: off
        with pytest.raises(urllib.error.HTTPError) as absent:
            await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}{view}")
        assert absent.value.code == 404, view


@pytest.mark.second_broker
async def test_batch_completes_with_exact_counts_and_files(
    agg_stack: Stack, clients: Clients, aggregator: int
) -> None:
    total = 300
    failing = {line for line in range(1, total + 1) if line % 25 == 0}  # 12 lines get a 400
    batch_id = await insert_batch(clients.mongo, total)
    results = [make_result(batch_id, n, 400 if n in failing else 200) for n in range(1, total + 1)]

    await publish(clients, results[:150] + results[:40])  # first half, with redeliveries

    async def live_counts() -> dict[str, Any] | None:
        doc = await clients.mongo.batches.find_one({"_id": batch_id})
        counts = doc["request_counts"] if doc else {}
        done = counts.get("completed", 0) + counts.get("failed", 0)
        return doc if done == 150 else None

    doc = await eventually(live_counts, 30, "live counts")
    assert doc["status"] == "in_progress"
    assert doc["request_counts"] == {"total": total, "completed": 144, "failed": 6}

    await publish(clients, results[150:] + results[100:200] + results[-5:])
    doc = await wait_stored_status(clients.mongo, batch_id, {"completed"}, 60)

    ok = total - len(failing)
    assert doc["request_counts"] == {"total": total, "completed": ok, "failed": len(failing)}
    assert doc["usage"]["input_tokens"] == 3 * ok and doc["usage"]["output_tokens"] == 2 * ok
    assert doc["usage"]["total_tokens"] == 5 * ok
    assert doc["finalizing_at"] and doc["completed_at"] >= doc["finalizing_at"]
    assert doc["output_file_id"] == output_file_id(batch_id, "output")
    assert doc["error_file_id"] == output_file_id(batch_id, "error")

    output = await read_lines(clients.store, doc["output_file_id"])
    assert [x["custom_id"] for x in output] == [f"req-{n}" for n in range(1, total + 1) if n not in failing]
    assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in output)
    errors = await read_lines(clients.store, doc["error_file_id"])
    assert [x["custom_id"] for x in errors] == [f"req-{n}" for n in sorted(failing)]
    assert errors[0] == results[24].output_line()

    for kind, name in (("output", doc["output_file_id"]), ("error", doc["error_file_id"])):
        file_doc = await clients.mongo.files.find_one({"_id": name})
        assert file_doc is not None
        assert file_doc["purpose"] == "batch_output" and file_doc["status"] == "processed"
        assert file_doc["filename"] == f"{batch_id}_{kind}.jsonl"
        assert file_doc["project"] == "proj-a" and file_doc["object_key"] == file_key(name)
        assert file_doc["bytes"] == await clients.store.size(file_key(name))

    async def chunks_deleted() -> bool:
        return not await clients.store.list_keys(result_chunk_prefix(batch_id))

    await eventually(chunks_deleted, 10, "chunk objects deleted")

    # A late redelivery after completion changes nothing: once the aggregator has dropped it (its
    # dropped-results counters are the witness), the batch is as it was.
    metrics_url = f"http://127.0.0.1:{agg_stack.ports.aggregator}/metrics"

    def dropped_total() -> float:
        return sum(
            metric_value(metrics_url, f"batchstream_aggregator_{name}_dropped_total")
            for name in ("late_results", "duplicates")
        )

    dropped_before = await asyncio.to_thread(dropped_total)
    await publish(clients, results[:10])

    async def redelivery_dropped() -> bool:
        return await asyncio.to_thread(dropped_total) >= dropped_before + 10

    await eventually(redelivery_dropped, 30, "the late redelivery dropped")
    again = await clients.mongo.batches.find_one({"_id": batch_id})
    assert again is not None and again["request_counts"] == doc["request_counts"]


async def test_all_failed_batch_has_no_output_file(clients: Clients, aggregator: int) -> None:
    batch_id = await insert_batch(clients.mongo, 3)
    never_ran = ResultMessage(
        request_id="batch_req_3",
        custom_id="req-3",
        batch_id=batch_id,
        line=3,
        error=LineError(code="batch_expired", message="not run"),
    )
    await publish(clients, [make_result(batch_id, 1, 500), make_result(batch_id, 2, 429), never_ran])
    doc = await wait_stored_status(clients.mongo, batch_id, {"completed"}, 30)
    assert doc["output_file_id"] is None and doc["error_file_id"]
    assert doc["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    errors = await read_lines(clients.store, doc["error_file_id"])
    assert errors[2]["response"] is None and errors[2]["error"]["code"] == "batch_expired"


async def test_cancelling_batch_ends_cancelled(clients: Clients, aggregator: int) -> None:
    batch_id = await insert_batch(clients.mongo, 4, status="cancelling")
    cancelled = [
        ResultMessage(
            request_id=f"batch_req_{n}",
            custom_id=f"req-{n}",
            batch_id=batch_id,
            line=n,
            error=LineError(code="batch_cancelled", message="cancelled"),
        )
        for n in (3, 4)
    ]
    await publish(clients, [make_result(batch_id, 1), make_result(batch_id, 2), *cancelled])
    doc = await wait_stored_status(clients.mongo, batch_id, {"cancelled"}, 30)
    assert doc["cancelled_at"] and doc.get("completed_at") is None
    assert doc["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    assert len(await read_lines(clients.store, doc["output_file_id"])) == 2


async def test_a_batch_left_finalizing_without_state_ends_from_its_chunks(
    clients: Clients, aggregator: int
) -> None:
    """The local stack empties the aggregator's table when its broker lost the changelog; a batch
    whose finalize died then (every result in its chunks, ``finalizing``) still ends, not at expiry."""
    batch_id = await insert_batch(clients.mongo, 5, status="finalizing")
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 8,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 20,
    }  # what the last live counts flush wrote
    results = [make_result(batch_id, n, 400 if n == 4 else 200) for n in range(1, 6)]
    chunk = f"{result_chunk_prefix(batch_id)}{time.time_ns():020d}-test.chunk"
    await clients.store.put_bytes(chunk, encode_chunk(results))
    # Overdue only now, with its chunk in place: the sweep (every second) may find it at once.
    started = {"finalizing_at": int(time.time()) - 3600, "usage": usage}
    await clients.mongo.batches.update_one({"_id": batch_id}, {"$set": started})

    doc = await wait_stored_status(clients.mongo, batch_id, {"completed"}, 30)
    assert doc["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    assert doc["usage"] == usage
    output = await read_lines(clients.store, doc["output_file_id"])
    assert [line["custom_id"] for line in output] == ["req-1", "req-2", "req-3", "req-5"]

    async def chunks_deleted() -> bool:  # deleted after the batch ends (finalize.py), so waited for
        return not await clients.store.list_keys(result_chunk_prefix(batch_id))

    await eventually(chunks_deleted, 10, "chunk objects deleted")


@pytest.mark.second_broker
async def test_restart_mid_batch_keeps_counts_exact(
    agg_stack: Stack, clients: Clients, aggregator: int
) -> None:
    """SIGKILL the worker mid-batch, restart it, redeliver: every line counted and written once."""
    total = 2000
    batch_id = await insert_batch(clients.mongo, total)
    results = [make_result(batch_id, n, 404 if n % 100 == 0 else 200) for n in range(1, total + 1)]
    await publish(clients, results[:1200])

    async def some_counted() -> bool:
        doc = await clients.mongo.batches.find_one({"_id": batch_id})
        return bool(doc and doc["request_counts"]["completed"] > 0)

    await eventually(some_counted, 30, "some lines counted")
    os.killpg(aggregator, signal.SIGKILL)

    async def killed() -> bool:
        return agg_stack.pid("aggregator") is None

    await eventually(killed, 10, "the aggregator gone")
    await publish(clients, results[1000:] + results[:50])
    await asyncio.to_thread(agg_stack.start, ["aggregator"])
    assert agg_stack.pid("aggregator") not in {None, aggregator}
    doc = await wait_stored_status(clients.mongo, batch_id, {"completed"}, 120)
    assert doc["request_counts"] == {"total": total, "completed": 1980, "failed": 20}
    output = await read_lines(clients.store, doc["output_file_id"])
    assert [x["custom_id"] for x in output] == [f"req-{n}" for n in range(1, total + 1) if n % 100]
    await wait_drained(agg_stack)


async def test_throughput_20000_lines(agg_stack: Stack, clients: Clients, aggregator: int) -> None:
    """Not a benchmark gate: records how long 20,000 results take to aggregate end to end."""
    warm_up = await insert_batch(clients.mongo, 1)  # time steady state, not the first fetch
    await publish(clients, [make_result(warm_up, 1)])
    await wait_stored_status(clients.mongo, warm_up, {"completed"}, 60)
    total = 20_000
    batch_id = await insert_batch(clients.mongo, total)
    results = [make_result(batch_id, n, 400 if n % 50 == 0 else 200) for n in range(1, total + 1)]
    started = time.monotonic()
    await publish(clients, results)
    published = time.monotonic() - started
    counted_at = 0.0

    async def completed() -> dict[str, Any] | None:
        nonlocal counted_at
        doc = await clients.mongo.batches.find_one({"_id": batch_id})
        if doc and not counted_at and doc["status"] != "in_progress":
            counted_at = time.monotonic() - started
        return doc if doc and doc["status"] == "completed" else None

    doc = await eventually(completed, 180, "20,000-line batch completed")
    elapsed = time.monotonic() - started
    assert doc["request_counts"] == {"total": total, "completed": 19_600, "failed": 400}
    print(
        f"\n20,000 results: published in {published:.1f}s, all counted after "
        f"{counted_at:.1f}s, completed after {elapsed:.1f}s ({total / elapsed:,.0f} lines/s)"
    )

    await wait_drained(agg_stack)
    # A clean, prompt shutdown: SIGTERM, exit status 0 within 30 s (psutil reaps our child).
    process = psutil.Process(aggregator)
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 30) == 0
    assert agg_stack.pid("aggregator") is None


async def test_stall_watchdog_reports_and_exits(agg_stack: Stack, clients: Clients) -> None:
    """With a zero stall timeout, results seen waiting at a check are a stall: 503, metric, exit 70.

    A real stall (faust's consumer thread stuck) cannot be provoked from outside; zero tolerance
    runs the same wiring (backlog from the live consumer, timer, page, metric, exit). The batch
    then completes exactly on a normal worker: the restart loses and doubles nothing.
    """
    await asyncio.to_thread(agg_stack.stop, ["aggregator"])
    total = 2000
    batch_id = await insert_batch(clients.mongo, total)
    results = [make_result(batch_id, n) for n in range(1, total + 1)]
    await publish(clients, results)

    async def trickle() -> None:
        """Redeliveries (the bitmap drops them) keep results waiting at every check."""
        for n in range(10_000):
            await publish(clients, results[(n * 20) % total :][:20])
            await asyncio.sleep(0.05)

    proc = await asyncio.to_thread(
        spawn_aggregator,
        agg_stack,
        {
            "BATCHSTREAM_AGGREGATOR_STALL_TIMEOUT_S": "0",
            "BATCHSTREAM_AGGREGATOR_STALL_EXIT_DELAY_S": STALL_EXIT_DELAY_S,
        },
    )
    publisher = asyncio.create_task(trickle())
    try:
        body = await eventually(lambda: stalled_health(agg_stack), 60, "/health 503 stalled")
        assert "results wait" in body["reason"]
        metrics = await asyncio.to_thread(http_get, f"http://127.0.0.1:{agg_stack.ports.aggregator}/metrics")
        assert b"batchstream_aggregator_stalls_total 1.0" in metrics
        assert await asyncio.to_thread(proc.wait, 60) == 70
    finally:
        publisher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publisher
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    restarts = 0

    async def completed() -> dict[str, Any] | None:
        nonlocal restarts
        if agg_stack.pid("aggregator") is None:  # what a supervisor does after an exit
            restarts += 1
            await asyncio.to_thread(agg_stack.start, ["aggregator"])
        doc = await clients.mongo.batches.find_one({"_id": batch_id})
        return doc if doc and doc["status"] == "completed" else None

    doc = await eventually(completed, 180, f"{batch_id} completed")
    assert doc["request_counts"] == {"total": total, "completed": total, "failed": 0}
    print(f"\nbatch completed after the stall; aggregator started {restarts} time(s)")


async def test_stall_during_table_recovery_is_reported_and_exits(agg_stack: Stack, clients: Clients) -> None:
    """The watchdog runs before the first table recovery ends (faust starts app timers only after).

    A worker of a fresh group recovers a changelog of 20,000 records; with a zero stall timeout
    the results waiting meanwhile (no fetch answer yet: faust pauses them during recovery) are a
    stall found in the rebalance or recovery phase: 503 with that phase, the metric, exit 70. The
    old wiring (an ``@app.timer``) could only have found it once recovery was over.
    """
    await asyncio.to_thread(agg_stack.stop, ["aggregator"])
    app_id = f"agg-recovery-{uuid.uuid4().hex[:8]}"
    changelog = f"{clients.kafka.topic_prefix}{app_id}-batch-state-changelog"
    state = json.dumps({"completed": 0, "failed": 0, "usage": {}, "seen": ""}).encode()
    futures = [
        await clients.producer.send(changelog, state, key=f"batch_recovery_{n:06d}".encode())
        for n in range(20_000)
    ]
    await asyncio.gather(*futures)
    await publish(clients, [make_result(await insert_batch(clients.mongo, 1), 1)])  # results waiting

    proc = await asyncio.to_thread(
        spawn_aggregator,
        agg_stack,
        {
            "BATCHSTREAM_AGGREGATOR_APP_ID": app_id,
            "BATCHSTREAM_AGGREGATOR_STALL_TIMEOUT_S": "0",
            "BATCHSTREAM_AGGREGATOR_STALL_EXIT_DELAY_S": STALL_EXIT_DELAY_S,
        },
    )
    try:
        body = await eventually(lambda: stalled_health(agg_stack), 90, "/health 503 stalled")
        print(f"\nstalled while {body['phase']}: {body['reason']}")
        assert body["phase"] in {"rebalancing", "recovering"}, body
        assert f"phase: {body['phase']}" in body["reason"]
        ready = urllib.request.Request(f"http://127.0.0.1:{agg_stack.ports.aggregator}/readyz")
        with pytest.raises(urllib.error.HTTPError) as refused:
            await asyncio.to_thread(urllib.request.urlopen, ready, None, 5)
        assert refused.value.code == 503
        metrics = await asyncio.to_thread(http_get, f"http://127.0.0.1:{agg_stack.ports.aggregator}/metrics")
        assert b"batchstream_aggregator_stalls_total 1.0" in metrics
        assert await asyncio.to_thread(proc.wait, 60) == 70
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
