"""Load: twenty clients create small batches at once while one 20,000-line batch runs.

Every batch must end ``completed`` with exact counts and every custom_id once in its output; the
test prints p50/p99 of ``GET /v1/batches/{id}`` over every poll made under that load (a figure for
docs/benchmarks.md, not an assertion: the machine is shared). The worker is the instant fake engine,
so the load is on the api, Kafka, the aggregator and the stores. Marked ``load`` (deselect with
``-m 'not load'``).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from deploy.local import ModelSpec, Stack
from tests.integration.api.corpus import dump, line
from tests.support.http_batches import create_batch
from tests.support.metrics import metric_values
from tests.support.stacks import FAKE_STACK_ENV, OwnStack
from tests.support.waiting import TERMINAL

pytestmark = [pytest.mark.e2e, pytest.mark.load]
MODEL = "corpus-fake"
BIG_LINES = 20_000
CLIENTS = 20
SMALL_LINES = 10


@pytest.fixture(scope="module")
def load_stack(own_stack: OwnStack) -> Iterator[Stack]:
    model = ModelSpec("", MODEL, engine="fake")
    with own_stack(
        "load", ["api", "aggregator", model.component], models=[model], extra_env=FAKE_STACK_ENV
    ) as s:
        yield s


class Polls:
    """Latencies of GET /v1/batches/{id}, from every thread."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._lock = threading.Lock()

    def get(self, api: httpx.Client, batch_id: str) -> dict[str, Any]:
        started = time.monotonic()
        response = api.get(f"/v1/batches/{batch_id}")
        took = time.monotonic() - started
        assert response.status_code == 200, response.text
        with self._lock:
            self.seconds.append(took)
        return dict(response.json())

    def wait(
        self, api: httpx.Client, batch_id: str, timeout_s: float, interval_s: float = 0.2
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (batch := self.get(api, batch_id))["status"] not in TERMINAL:
            assert time.monotonic() < deadline, f"batch {batch_id} still {batch['status']}"
            time.sleep(interval_s)
        return batch


def start_batch(api: httpx.Client, ids: list[str]) -> str:
    return create_batch(api, dump(*(line(custom_id) for custom_id in ids)))


def assert_exact(api: httpx.Client, batch: dict[str, Any], ids: list[str]) -> None:
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": len(ids), "completed": len(ids), "failed": 0}, batch
    assert batch["error_file_id"] is None, batch
    content = api.get(f"/v1/files/{batch['output_file_id']}/content")
    found = [json.loads(x)["custom_id"] for x in content.text.split("\n") if x]
    assert sorted(found) == sorted(ids)  # each once


def test_twenty_clients_while_a_20000_line_batch_runs(load_stack: Stack) -> None:
    headers = {"Authorization": f"Bearer {load_stack.api_key}"}
    base = load_stack.base_url.removesuffix("/v1")
    polls = Polls()
    with httpx.Client(base_url=base, headers=headers, timeout=60) as api:
        big_ids = [f"big-{n}" for n in range(BIG_LINES)]
        started = time.monotonic()
        big = start_batch(api, big_ids)
        deadline = time.monotonic() + 120
        while polls.get(api, big)["status"] == "validating":
            assert time.monotonic() < deadline
            time.sleep(0.2)

        def client(number: int) -> float:
            ids = [f"small-{number}-{n}" for n in range(SMALL_LINES)]
            with httpx.Client(base_url=base, headers=headers, timeout=60) as own:
                began = time.monotonic()
                batch = polls.wait(own, start_batch(own, ids), 300)
                took = time.monotonic() - began
                assert_exact(own, batch, ids)
                return took

        with ThreadPoolExecutor(CLIENTS) as pool:
            smalls = list(pool.map(client, range(CLIENTS)))
        big_during = polls.get(api, big)
        done = polls.wait(api, big, 600, interval_s=0.5)
        big_s = time.monotonic() - started
        assert_exact(api, done, big_ids)
    # The worker sent its results in groups (each result of a batch in one message with others
    # that finished with it), and the aggregator counted every line of them exactly once above.
    worker_metrics = f"http://127.0.0.1:{load_stack.ports.inference}/metrics"
    sent = metric_values(
        worker_metrics,
        "batchstream_inference_results_per_message_sum",
        "batchstream_inference_results_per_message_count",
    )
    results, messages = (
        sent["batchstream_inference_results_per_message_sum"],
        sent["batchstream_inference_results_per_message_count"],
    )
    assert results >= BIG_LINES + CLIENTS * SMALL_LINES
    assert messages < results / 4, f"{results:.0f} results in {messages:.0f} messages"
    seconds = sorted(polls.seconds)
    p50, p99 = statistics.median(seconds), seconds[int(0.99 * (len(seconds) - 1))]
    print(
        f"\nload: {CLIENTS} clients x {SMALL_LINES}-line batches during a {BIG_LINES:,}-line batch: "
        f"small batches created-to-completed median {statistics.median(smalls):.1f}s, max {max(smalls):.1f}s "
        f"(the big one had {big_during['request_counts']['completed']:,} lines done when the last small "
        f"one ended, finished after {big_s:.0f}s); GET /v1/batches/{{id}} over {len(seconds)} polls: "
        f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {seconds[-1] * 1000:.0f} ms; "
        f"the worker sent {results:,.0f} results in {messages:,.0f} messages"
    )
