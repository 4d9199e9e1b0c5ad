"""LoRA adapters and mixed-model batches on real vLLM (CPU): a second worker of the tiny model,
served as ``tiny-lora`` with one random-weight adapter, beside the session's ``tiny-llama``.

Both workers load the same weights, so the same prompt gets the same greedy answer from either;
the adapter's answer differs. A mixed batch over the two models, the adapter and a model nobody
serves must answer every line from the model it names, in the input's order.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types import Batch

from deploy.local import ModelSpec, Stack
from tests.support.lines import CHAT, chat_body, read_lines, request_line
from tests.support.metrics import metric_value
from tests.support.waiting import wait_terminal, wait_until

BASE = "tiny-lora"
ADAPTER = "tiny-lora-demo"
UNKNOWN = "nobody-serves-this"
PROMPTS = ["Hello there", "Tell me a story", "What is two plus two?"]


@pytest.fixture(scope="module")
def client(stack: Stack) -> OpenAI:
    if stack.models[0].engine == "fake":
        pytest.skip("these tests need the vLLM worker")
    return OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5)


@pytest.fixture(scope="module")
def lora_worker(stack: Stack, client: OpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A second worker: the tiny model as ``tiny-lora`` with the adapter ``tiny-lora-demo``;
    yields its index among the stack's workers."""
    base_dir = stack.models[0].path
    adapter_dir = os.environ.get("BATCHSTREAM_TEST_ADAPTER_DIR", "")
    if not adapter_dir:
        out = tmp_path_factory.mktemp("models") / "tiny-demo"
        command = ["-m", "deploy.local.models", "adapter", "--base", base_dir, "--out", str(out)]
        made = subprocess.run(
            [stack.inference_python, *command],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            pytest.skip(f"no adapter (peft): {made.stderr[-300:]}")
        adapter_dir = str(out)
    spec = ModelSpec(base_dir, BASE).with_adapter(f"{ADAPTER}={adapter_dir}")
    before = list(stack.models)
    stack.models = [*before, spec]
    stack.provision()
    try:
        stack.start([spec.component])
        wait_until(lambda: ADAPTER in _model_ids(stack), timeout_s=30, what="the adapter in /v1/models")
        yield len(before)
    finally:
        stack.stop([spec.component])
        stack.models = before


def _model_ids(stack: Stack) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{stack.base_url}/models", headers={"Authorization": f"Bearer {stack.api_key}"})
    return {m["id"]: m for m in answer.json()["data"]}


def _run(client: OpenAI, lines: list[str], **extra: Any) -> Batch:
    upload = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    return client.batches.create(
        input_file_id=upload.id,
        endpoint=CHAT,
        completion_window="24h",
        extra_body=extra or None,
    )


def _line(custom_id: str, model: str, prompt: str) -> str:
    return request_line(custom_id, CHAT, chat_body(model, prompt, max_tokens=8, temperature=0))


def test_adapters_are_listed_with_their_base_model(stack: Stack, lora_worker: int) -> None:
    models = _model_ids(stack)
    assert models[ADAPTER]["parent"] == BASE
    assert models[BASE]["parent"] is None
    assert models[ADAPTER]["max_context_length"] == models[BASE]["max_context_length"]


def test_a_mixed_batch_answers_each_line_from_the_model_it_names(
    stack: Stack, client: OpenAI, lora_worker: int
) -> None:
    session_model = stack.models[0].served_name
    lines, expected = [], []
    # Interleaved on purpose: the dispatcher groups each model's and each adapter's lines.
    for i, prompt in enumerate(PROMPTS):
        for model in (BASE, ADAPTER, session_model, UNKNOWN):
            lines.append(_line(f"{model}-{i}", model, prompt))
            expected.append((f"{model}-{i}", model))
    batch = _run(client, lines, mixed_models=True)
    assert batch.model_extra and batch.model_extra["mixed_models"] is True
    done = wait_terminal(client, batch.id)
    assert done.status == "completed", done.errors
    unknown = len(PROMPTS)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        len(lines),
        len(lines) - unknown,
        unknown,
    )
    output = read_lines(client, done.output_file_id)
    assert [r["custom_id"] for r in output] == [c for c, m in expected if m != UNKNOWN]  # input order
    answers: dict[tuple[str, int], str] = {}
    for record in output:
        model, _, i = record["custom_id"].rpartition("-")
        body = record["response"]["body"]
        assert body["model"] == model, record
        answers[model, int(i)] = body["choices"][0]["message"]["content"]
    for i in range(len(PROMPTS)):
        # Same weights, same greedy answer; the adapter changes it.
        assert answers[BASE, i] == answers[session_model, i]
        assert answers[ADAPTER, i] != answers[BASE, i], (i, answers)
    by_model = (done.model_extra or {})["usage_by_model"]
    assert set(by_model) == {BASE, ADAPTER, session_model}
    assert done.usage is not None
    assert sum(u["total_tokens"] for u in by_model.values()) == done.usage.total_tokens > 0
    assert all(u["output_tokens"] > 0 for u in by_model.values())
    errors = read_lines(client, done.error_file_id)
    assert sorted(r["custom_id"] for r in errors) == sorted(c for c, m in expected if m == UNKNOWN)
    for record in errors:
        assert record["error"]["code"] == "model_not_found" and UNKNOWN in record["error"]["message"]
    # Three adapter lines, sent together: one load into the engine.
    url = f"http://127.0.0.1:{stack.ports.inference + lora_worker}/metrics"
    assert metric_value(url, "batchstream_inference_adapter_loads_total", adapter=ADAPTER) == 1


def test_an_adapter_batch_runs_on_its_base_model_s_workers(client: OpenAI, lora_worker: int) -> None:
    batch = wait_terminal(client, _run(client, [_line("a", ADAPTER, PROMPTS[0])]).id)
    assert batch.status == "completed" and batch.model == ADAPTER
    (record,) = read_lines(client, batch.output_file_id)
    assert record["response"]["body"]["model"] == ADAPTER


def test_two_models_without_the_opt_in_fail_validation_as_openai_s_do(
    client: OpenAI, lora_worker: int
) -> None:
    lines = [_line("base", BASE, PROMPTS[0]), _line("adapter", ADAPTER, PROMPTS[0])]
    batch = wait_terminal(client, _run(client, lines).id)
    assert batch.status == "failed" and batch.errors and batch.errors.data
    (error,) = batch.errors.data
    assert (error.code, error.line, error.param) == ("mismatched_model", 2, "body.model")
    assert batch.model_extra and batch.model_extra["mixed_models"] is False


def test_a_mixed_batch_naming_no_served_model_fails_validation(client: OpenAI, lora_worker: int) -> None:
    batch = wait_terminal(client, _run(client, [_line("x", UNKNOWN, "hi")], mixed_models=True).id)
    assert batch.status == "failed" and batch.errors and batch.errors.data
    assert batch.errors.data[0].code == "model_not_found"
