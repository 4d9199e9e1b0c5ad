"""Batches through a worker with no model of its own, forwarding its lines to a real ``vllm serve``
(the session's, of the tiny model): the server a team already runs for live traffic.

Every endpoint that server offers; admission that keeps the server's queue near empty while it
runs full; a cancel that aborts the lines running on the server (its own metrics say so); and
the server killed and started again mid-batch, with every line answered exactly once. The
witnesses are the server's own ``/metrics``, the worker's ``/readyz`` and the output files.
"""

from __future__ import annotations

import collections
import statistics
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types import Batch

from deploy.local import ModelSpec, Stack
from tests.support.lines import CHAT, chat_body, read_lines, request_line
from tests.support.metrics import metric_value, metric_values
from tests.support.stacks import FAKE_STACK_ENV, OwnStack
from tests.support.vllm_server import SERVER_MAX_NUM_SEQS, VllmServer
from tests.support.waiting import wait_terminal, wait_until

pytestmark = pytest.mark.e2e

MODEL = "remote-model"  # batchstream's name for the model; the server calls it otherwise
WORKER_MAX_NUM_SEQS = 2 * SERVER_MAX_NUM_SEQS  # more than the server runs: admission must hold back
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"


@pytest.fixture(scope="module")
def remote(own_stack: OwnStack, vllm_server: VllmServer) -> Iterator[Stack]:
    spec = ModelSpec.parse_remote(f"{MODEL}={vllm_server.url}/v1")
    env = {
        **FAKE_STACK_ENV,
        "BATCHSTREAM_INFERENCE_REMOTE_MODEL": vllm_server.served_name,
        "BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(WORKER_MAX_NUM_SEQS),
        "BATCHSTREAM_INFERENCE_REMOTE_LOAD_INTERVAL_S": "0.2",
    }
    with own_stack("remote", ["api", "aggregator", spec.component], models=[spec], extra_env=env) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(remote: Stack) -> OpenAI:
    return OpenAI(base_url=remote.base_url, api_key=remote.api_key, max_retries=5)


def run(client: OpenAI, url: str, lines: list[str]) -> Batch:
    upload = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint=url, completion_window="24h")  # type: ignore[arg-type]


def long_chat_lines(n: int, max_tokens: int, tag: str) -> list[str]:
    """Lines that each generate exactly ``max_tokens`` (vLLM's ``ignore_eos``)."""
    return [
        request_line(
            f"{tag}-{i}",
            CHAT,
            chat_body(MODEL, f"Count to a hundred, {tag} {i}.", max_tokens=max_tokens, ignore_eos=True),
        )
        for i in range(n)
    ]


def server_metric(server: VllmServer, name: str, **labels: str) -> float:
    return metric_value(f"{server.url}/metrics", name, **labels)


def by_custom_id(lines: list[dict[str, Any]]) -> collections.Counter[str]:
    return collections.Counter(line["custom_id"] for line in lines)


def test_every_endpoint_the_server_offers_runs_with_its_answers_passed_on(client: OpenAI) -> None:
    batches = {
        "/v1/chat/completions": [
            request_line(f"c{i}", CHAT, chat_body(MODEL, f"Say hello {i}.", max_tokens=6, temperature=0))
            for i in range(4)
        ],
        "/v1/completions": [
            request_line(f"p{i}", "/v1/completions", {"model": MODEL, "prompt": f"Once {i}", "max_tokens": 6})
            for i in range(4)
        ],
        "/v1/responses": [
            request_line(
                f"r{i}", "/v1/responses", {"model": MODEL, "input": f"Hi {i}", "max_output_tokens": 6}
            )
            for i in range(4)
        ],
    }
    objects = {
        "/v1/chat/completions": "chat.completion",
        "/v1/completions": "text_completion",
        "/v1/responses": "response",
    }
    for url, lines in batches.items():
        batch = wait_terminal(client, run(client, url, lines).id, 180)
        assert batch.status == "completed", (url, batch.errors)
        assert batch.request_counts is not None and batch.request_counts.completed == len(lines), url
        output = read_lines(client, batch.output_file_id)
        assert [x["custom_id"] for x in output] == [x.split('"custom_id": "')[1].split('"')[0] for x in lines]
        bodies = [x["response"]["body"] for x in output]
        assert {b["object"] for b in bodies} == {objects[url]}, url
        # The server's own answer: its ids, and its usage summed on the batch.
        assert all(x["response"]["status_code"] == 200 for x in output)
        usage = batch.usage
        assert usage is not None
        assert usage.output_tokens == sum(
            b["usage"].get("completion_tokens", b["usage"].get("output_tokens", 0)) for b in bodies
        ), url


def test_admission_fills_the_server_and_keeps_its_queue_near_empty(
    client: OpenAI, vllm_server: VllmServer
) -> None:
    """The worker may hold twice what the server runs; it lets on only what the server runs."""
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                reading = metric_values(f"{vllm_server.url}/metrics", RUNNING, WAITING)
                samples.append((reading[RUNNING], reading[WAITING]))
            except OSError:
                pass
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        batch = wait_terminal(client, run(client, CHAT, long_chat_lines(48, 96, "fill")).id, 300)
    finally:
        stop.set()
        sampler.join()
    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == 48
    running = [r for r, _ in samples]
    waiting = [w for _, w in samples]
    assert max(running) == SERVER_MAX_NUM_SEQS, "the worker never filled the server"
    # Without admission 2 x 8 lines would be on the server, 8 of them waiting in its queue all
    # along. With it the queue is empty in most readings and holds under one line on average.
    # Each probe for room (one line more once the server shows none waiting) ends with a line or
    # a few waiting: a reading of the server lags the lines it is still taking in, and the lines
    # it runs must end before the halved limit shows. How long that lasts grows with the
    # machine's load (measured: 18% to 25% of the readings), so the share is bounded loosely.
    assert max(waiting) <= SERVER_MAX_NUM_SEQS // 2, collections.Counter(waiting)
    assert sum(w > 0 for w in waiting) <= len(waiting) // 2, collections.Counter(waiting)
    assert statistics.mean(waiting) <= 1, collections.Counter(waiting)


def test_a_cancel_aborts_the_lines_running_on_the_server(client: OpenAI, vllm_server: VllmServer) -> None:
    """The server's counters are the witness: vLLM does not count a request whose client went
    away as finished, so the lines that ran to their end and the tokens generated tell. A line
    of 12,000 tokens runs for minutes here, so whatever the cancel's way through the stack takes,
    it finds the lines mid-way, and the server empties long before they could end."""
    lines, tokens = 16, 12_000

    def ended() -> float:
        return server_metric(vllm_server, "vllm:request_success_total", finished_reason="length")

    def generated() -> float:
        return server_metric(vllm_server, "vllm:generation_tokens_total")

    ended_before, generated_before = ended(), generated()
    batch = run(client, CHAT, long_chat_lines(lines, tokens, "cancel"))
    wait_until(
        lambda: server_metric(vllm_server, "vllm:num_requests_running") > 0, 120, "lines on the server"
    )
    client.batches.cancel(batch.id)
    wait_until(
        lambda: server_metric(vllm_server, "vllm:num_requests_running") == 0, 60, "the server to stop them"
    )
    done = wait_terminal(client, batch.id, 120)
    assert done.status == "cancelled"
    # The lines on the server stopped mid-way: none ran to its 12,000th token, and the server
    # generated a small part of what the batch asked for.
    assert ended() == ended_before
    assert generated() - generated_before < lines * tokens / 4
    assert done.request_counts is not None and done.request_counts.completed == 0


def worker_readyz(stack: Stack) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{stack.ports.inference}/readyz", timeout=5)


def test_the_server_killed_and_restarted_mid_batch_answers_every_line_once(
    client: OpenAI, remote: Stack, vllm_server: VllmServer
) -> None:
    # Four of the server's waves of short lines: the kill lands while the server runs lines (its
    # own gauge says so just before), which then have no answer; the batch's counts trail by about
    # a second, and the waves after the first outlast that.
    total = 4 * SERVER_MAX_NUM_SEQS
    batch = run(client, CHAT, long_chat_lines(total, 128, "restart"))

    def some_done_and_more_running() -> bool:
        counts = client.batches.retrieve(batch.id).request_counts
        some_done = counts is not None and counts.completed >= 4
        return some_done and server_metric(vllm_server, RUNNING) > 0

    wait_until(some_done_and_more_running, 180, "some lines answered and more on the server", 0.05)
    vllm_server.kill()

    def unready() -> list[str]:
        answer = worker_readyz(remote)
        return list(answer.json().get("failing", [])) if answer.status_code == 503 else []

    assert "server_reachable" in wait_until(unready, 30, "/readyz to say the server is unreachable")
    vllm_server.start()
    wait_until(lambda: worker_readyz(remote).status_code == 200, 30, "the worker ready again")
    done = wait_terminal(client, batch.id, 300)
    assert done.status == "completed", done.errors
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (total, 0)
    output = read_lines(client, done.output_file_id)
    assert by_custom_id(output) == collections.Counter(f"restart-{i}" for i in range(total))
    assert read_lines(client, done.error_file_id) == []
