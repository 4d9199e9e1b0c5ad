"""The local stack's broker keeps messages in memory; a batch in flight when it dies still completes.

``make up`` after a broker loss restarts every service, requeues in-flight batches and the api
publishes their lines again: the batch ends with every line once and exact counts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from deploy.local import STAND_INS, ModelSpec, Stack, free_ports, up
from tests.support.lines import chat_request, jsonl, read_lines
from tests.support.waiting import wait_status, wait_terminal

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
    lines = [chat_request(f"c{i}", MODEL, str(i)) for i in range(50)]
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_status(client, batch.id, {"in_progress"})

    fake_stack.stop(["kafka"])  # the broker forgets every message
    assert up(fake_stack, ["api", "aggregator", "inference"]) == 0

    done = wait_terminal(client, batch.id, 120)
    assert done.status == "completed", done.errors
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        50,
        50,
        0,
    )
    assert done.output_file_id is not None
    out = read_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in out] == [f"c{i}" for i in range(50)]


def test_up_twice_leaves_running_components_alone(fake_stack: Stack) -> None:
    before = fake_stack.pids()
    assert up(fake_stack, ["api", "aggregator", "inference"]) == 0
    assert fake_stack.pids() == before
