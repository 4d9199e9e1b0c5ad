"""Publishing straight to Kafka with a reply topic, through the documented helper and its example,
and what the workers do with messages they must not trust: a reply topic that is bad, missing or
the services' own, and a batch line the api did not send.

Runs on the whole stack (the worker that serves ``model_id`` answers).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from openai import AsyncOpenAI

from deploy.local.stack import Stack
from shared.kafka import encode, make_producer
from shared.kafka_client import KafkaRequestClient
from shared.protocol.messages import RequestMessage
from shared.request_signing import SIGNATURE_HEADER
from shared.settings import KafkaSettings
from shared.topics import control_topic, dead_letters_topic, requests_topic, results_topic
from tests.support.lines import chat_body, chat_line, chat_request
from tests.support.metrics import metric_value
from tests.support.waiting import wait_terminal_async

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "kafka_direct.py"


def reply_topic(stack: Stack) -> str:
    return f"{stack.topic_prefix}replies-{uuid.uuid4().hex[:8]}"


def test_the_example_publishes_a_file_and_prints_each_result(
    stack: Stack, model_id: str, tmp_path: Path
) -> None:
    ids = ["k1", "k2", "k3"]
    source = tmp_path / "requests.jsonl"
    source.write_text("".join(chat_line(i, model_id, i, max_tokens=3) + "\n" for i in ids))

    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(source), "--model", model_id, "--reply-topic", reply_topic(stack)],
        env={**os.environ, **stack.env(), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ids
    for line in lines:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["model"] == model_id


async def test_the_helper_answers_each_request_once_including_late_ones(stack: Stack, model_id: str) -> None:
    async with KafkaRequestClient(model_id, reply_topic(stack), stack.kafka_settings()) as kafka:
        on_time = await kafka.publish(chat_request("on-time", model_id, "on-time", max_tokens=3))
        late = await kafka.publish(chat_request("late", model_id, "late", max_tokens=3), expires_at=1.0)
        results = {r.request_id: r async for r in kafka.results(timeout_s=120)}

    assert set(results) == {on_time.request_id, late.request_id} and not kafka.pending
    assert results[on_time.request_id].succeeded
    assert results[on_time.request_id].output_line()["custom_id"] == "on-time"
    expired = results[late.request_id]
    assert expired.response is None and expired.error is not None
    assert expired.error.code == "batch_expired"


# ------------------------------------------------------------------- messages not to be trusted


def forged(request_id: str, model_id: str, **fields: Any) -> bytes:
    """A request message as anyone may publish it (no signature of the api's)."""
    body = chat_body(model_id, f"say {request_id}", max_tokens=1)
    return encode(RequestMessage(request_id=request_id, custom_id=request_id, url=CHAT, body=body, **fields))


async def publish(kafka: KafkaSettings, topic: str, values: list[bytes], **send: Any) -> list[int]:
    """Publish each value to ``topic``; their offsets."""
    producer = make_producer(kafka)
    await producer.start()
    try:
        return [(await producer.send_and_wait(topic, value, **send)).offset for value in values]
    finally:
        await producer.stop()


async def read_topic(kafka: KafkaSettings, topic: str, wanted: set[str], field: str) -> dict[str, Any]:
    """The messages of ``topic`` whose ``field`` is one of ``wanted``, by it, once all arrived."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    found: dict[str, Any] = {}
    try:
        async with asyncio.timeout(60):
            while not wanted <= found.keys():
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for record in records:
                        value = json.loads(record.value)
                        if value.get(field) in wanted:
                            found[value[field]] = value
    finally:
        await consumer.stop()
    return found


def worker_metrics(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.ports.inference}/metrics"


def dead_lettered(stack: Stack, reason: str) -> float:
    return metric_value(worker_metrics(stack), "batchstream_inference_dead_letters_total", reason=reason)


CHAT = "/v1/chat/completions"


async def test_a_bad_missing_or_internal_reply_topic_is_dead_lettered_and_the_worker_goes_on(
    stack: Stack, model_id: str
) -> None:
    kafka = stack.kafka_settings()
    worker = stack.models[0].component
    pid = stack.pid(worker)
    run = uuid.uuid4().hex[:8]
    replies = {
        f"bad-{run}": "bad topic name!",
        f"missing-{run}": None,
        f"results-{run}": results_topic(kafka),
        f"control-{run}": control_topic(kafka),
        f"requests-{run}": requests_topic(kafka, model_id),
        f"dead-{run}": dead_letters_topic(kafka),
    }
    before = {
        r: dead_lettered(stack, r)
        for r in ("reply_topic_invalid", "reply_topic_missing", "reply_topic_internal")
    }
    topic = requests_topic(kafka, model_id)
    offsets = await publish(kafka, topic, [forged(i, model_id, reply_topic=t) for i, t in replies.items()])

    letters = await read_topic(kafka, dead_letters_topic(kafka), set(replies), "request_id")

    reasons = {i: letters[i]["reason"] for i in replies}
    assert reasons == {
        f"bad-{run}": "reply_topic_invalid",
        f"missing-{run}": "reply_topic_missing",
        **{f"{kind}-{run}": "reply_topic_internal" for kind in ("results", "control", "requests", "dead")},
    }
    first = letters[f"bad-{run}"]
    assert (
        first["topic"] == topic
        and first["offset"] == offsets[0]
        and first["reply_topic"] == "bad topic name!"
    )
    assert json.loads(first["value"])["request_id"] == f"bad-{run}"
    assert dead_lettered(stack, "reply_topic_internal") - before["reply_topic_internal"] == 4
    assert dead_lettered(stack, "reply_topic_invalid") - before["reply_topic_invalid"] == 1
    # The worker neither stopped nor stalled: it answers the next pipeline request at once.
    async with KafkaRequestClient(model_id, reply_topic(stack), kafka) as client:
        sent = await client.publish(chat_request(f"after-{run}", model_id, max_tokens=2))
        answered = [r async for r in client.results(timeout_s=60)]
    assert [r.request_id for r in answered] == [sent.request_id] and answered[0].succeeded
    assert stack.pid(worker) == pid


async def test_a_batch_line_the_api_did_not_send_never_reaches_the_batch(stack: Stack, model_id: str) -> None:
    """A pipeline names another project's batch and its lines: the worker does not run them for
    it, and the batch's output holds its own lines only, counts exact."""
    kafka = stack.kafka_settings()
    worker = stack.models[0].component
    pid = stack.pid(worker)
    own = [chat_line(f"own-{n}", model_id, max_tokens=8) for n in range(1, 6)]
    async with AsyncOpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5) as client:
        upload = await client.files.create(file=("in.jsonl", "\n".join(own).encode()), purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
        # Published while the batch validates, so they are on the topic before its own lines.
        reply = reply_topic(stack)
        topic = requests_topic(kafka, model_id)
        ids = [f"forged-{batch.id}-{n}" for n in range(1, 6)]
        values = [forged(i, model_id, batch_id=batch.id, line=n) for n, i in enumerate(ids, 1)]
        values.append(
            forged(
                f"to-results-{batch.id}",
                model_id,
                batch_id=batch.id,
                line=1,
                reply_topic=results_topic(kafka),
            )
        )
        await publish(kafka, topic, values)
        # A made-up signature is no signature.
        bogus = forged(f"bogus-{batch.id}", model_id, batch_id=batch.id, line=2)
        await publish(kafka, topic, [bogus], headers=[(SIGNATURE_HEADER, b"v1=" + b"0" * 64)])
        async with KafkaRequestClient(model_id, reply, kafka):  # creates the reply topic
            pass
        asked = forged(f"asked-{batch.id}", model_id, batch_id=batch.id, line=3, reply_topic=reply)
        await publish(kafka, topic, [asked])

        done = await wait_terminal_async(client, batch.id, timeout_s=120)
        text = (await client.files.content(done.output_file_id)).text if done.output_file_id else ""

    lines = [json.loads(line) for line in text.splitlines() if line]
    assert done.status == "completed" and done.error_file_id is None
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 5, 0)
    assert sorted(line["custom_id"] for line in lines) == [f"own-{n}" for n in range(1, 6)]
    assert all(line["response"]["status_code"] == 200 for line in lines)

    letters = await read_topic(
        kafka, dead_letters_topic(kafka), {*ids, f"to-results-{batch.id}", f"bogus-{batch.id}"}, "request_id"
    )
    assert {letters[i]["reason"] for i in ids} == {"batch_not_verified"}
    assert letters[f"bogus-{batch.id}"]["reason"] == "batch_not_verified"
    assert letters[f"to-results-{batch.id}"]["reason"] == "reply_topic_internal"
    refused = (await read_topic(kafka, reply, {f"asked-{batch.id}"}, "request_id"))[f"asked-{batch.id}"]
    assert (refused["batch_id"], refused["line"], refused["response"]) == (None, None, None)
    assert refused["error"]["code"] == "batch_not_verified"
    assert stack.pid(worker) == pid
