"""The local stack's broker keeps messages in memory; a batch in flight when it dies still completes.

``make up`` after a broker loss restarts every service, requeues in-flight batches and the api
publishes their lines again: the batch ends with every line once and exact counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from deploy.local import STAND_INS, ModelSpec, Stack, free_ports, up

pytestmark = pytest.mark.e2e
MODEL = "fake-recovery"


@pytest.fixture(scope="module")
def fake_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("broker-loss"),
        ports=free_ports(),
        models=[ModelSpec("", MODEL, engine="fake")],
        environment="test",
    )
    try:
        stack.start(STAND_INS)
        stack.provision()
        stack.start(["api", "aggregator", stack.models[0].component])
        yield stack
    finally:
        stack.stop()


def test_a_batch_in_flight_when_the_broker_dies_completes_after_up(fake_stack: Stack) -> None:
    client = OpenAI(base_url=fake_stack.base_url, api_key=fake_stack.api_key, max_retries=5)
    worker = fake_stack.models[0].component
    fake_stack.stop([worker])  # lines wait on Kafka, unserved
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": str(i)}]},
        }
        for i in range(50)
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    upload = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).status != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.2)

    fake_stack.stop(["kafka"])  # the broker forgets every message
    assert up(fake_stack, ["api", "aggregator", "inference"]) == 0

    deadline = time.monotonic() + 120
    while (done := client.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline, done.status
        time.sleep(0.3)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        50,
        50,
        0,
    )
    assert done.output_file_id is not None
    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.split("\n") if x]
    assert [line["custom_id"] for line in out] == [f"c{i}" for i in range(50)]


def test_up_twice_leaves_running_components_alone(fake_stack: Stack, tmp_path: Path) -> None:
    before = fake_stack.pids()
    assert up(fake_stack, ["api", "aggregator", "inference"]) == 0
    assert fake_stack.pids() == before
