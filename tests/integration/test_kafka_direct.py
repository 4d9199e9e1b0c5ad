"""Publishing straight to Kafka with a reply topic, through the documented helper and its example.

Runs on the whole stack (the worker that serves ``model_id`` answers); nothing goes through the
HTTP api.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from deploy.local.stack import Stack
from shared.kafka_client import KafkaRequestClient
from tests.support.lines import chat_line, chat_request

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
