"""The prefix benchmark's sides: ``vllm run-batch`` (on the file, and on it grouped) and the
stack, each with a KV cache of about the wanted size, in alternating rounds; and the stack with
two workers, affinity on and off."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from openai import OpenAI

from bench.common import MongoPoller, create_batch, new_stack, start_stack
from bench.parity import run_batch_once
from bench.prefix_input import SERVED_NAME, grouped
from deploy.local import ModelSpec, Stack

SERVED_COMPONENT = ModelSpec("", SERVED_NAME).component
# run-batch on the same lines sorted by their messages: what the order alone gives the engine.
GROUPED = "run-batch grouped"
# The first start's KV cache in blocks, from which the model's tokens per block are measured.
PROBE_BLOCKS = 400


def cache_figures(lines: list[dict[str, Any]]) -> dict[str, float]:
    prompt = cached = 0
    for line in lines:
        usage = ((line.get("response") or {}).get("body") or {}).get("usage") or {}
        prompt += int(usage.get("prompt_tokens") or 0)
        cached += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "computed": prompt - cached,
        "hit_rate": cached / max(1, prompt),
    }


def stack_once(client: OpenAI, poller: MongoPoller, input_path: Path) -> dict[str, Any]:
    upload = client.files.create(file=("prefix.jsonl", input_path.read_bytes()), purpose="batch")
    batch_id, created_at = create_batch(client, upload.id)
    trace = poller.completed(batch_id, timeout_s=3600)
    timed = trace.status_at["completed"] - created_at
    counts = trace.doc.get("request_counts") or {}
    if counts.get("failed"):
        raise RuntimeError(f"the batch failed {counts['failed']} of {counts.get('total')} lines")
    text = client.files.content(trace.doc["output_file_id"]).text
    lines = [json.loads(x) for x in text.splitlines() if x]
    tokens = sum(
        int((((x.get("response") or {}).get("body") or {}).get("usage") or {}).get("completion_tokens") or 0)
        for x in lines
    )
    figures = {"system": "batchstream", "timed_s": timed, "output_tokens": tokens}
    # Where the stack's own time goes: validation (created to in_progress), and the last count
    # to completed (finalize); the engine's span is what lies between.
    phases = {
        "validate_s": trace.status_at.get("in_progress", created_at) - created_at,
        "finalize_s": trace.status_at["completed"] - trace.counts[-1][0] if trace.counts else float("nan"),
    }
    return figures | phases | {"tokens_per_s": tokens / timed} | cache_figures(lines)


def warm_up(client: OpenAI, poller: MongoPoller) -> None:
    """An untimed small batch on a (re)started worker, so a timed round starts, as run-batch's
    does, with the engine warm and the worker in its group with its partitions. Its prompt is
    shorter than one KV block: it leaves nothing in the prefix cache."""
    line = json.dumps(
        {
            "custom_id": "warm-up",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1},
        }
    )
    # Several lines, so that with two workers both are likely to take one.
    lines = "\n".join(line.replace('"warm-up"', f'"warm-up-{i}"') for i in range(8))
    upload = client.files.create(file=("warm-up.jsonl", lines.encode()), purpose="batch")
    poller.wait(create_batch(client, upload.id)[0], timeout_s=600)


def run_batch_side(args: Any, input_path: Path, work: Path, blocks: int) -> dict[str, Any]:
    args.run_batch_extra = ["--enable-prompt-tokens-details", "--dtype", args.prefix_dtype]
    if blocks:
        args.run_batch_extra += ["--num-gpu-blocks-override", str(blocks)]
    result = run_batch_once(args.inference_python, args.model_dir, input_path, work, args, {})
    result.pop("_texts", None)
    if result["failed"]:
        raise RuntimeError(f"run-batch failed {result['failed']} of {result['lines']} lines")
    output = max(work.glob("run-batch-*.jsonl"), key=lambda p: p.stat().st_mtime)
    lines = [json.loads(x) for x in output.read_text().splitlines() if x.strip()]
    return result | cache_figures(lines)


def engine_settings(args: Any, blocks: int) -> dict[str, str]:
    return {
        "BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(args.max_num_seqs),
        "BATCHSTREAM_INFERENCE_MAX_MODEL_LEN": str(args.max_model_len),
        "BATCHSTREAM_INFERENCE_DTYPE": args.prefix_dtype,
        "BATCHSTREAM_INFERENCE_KV_CACHE_BLOCKS": str(blocks),
    }


def cache_tokens(stack: Stack, component: str) -> int:
    """The KV cache's size in tokens as the worker's vLLM reports it (0 if not found)."""
    for line in stack.log_file(component).read_text(errors="replace").splitlines():
        found = re.search(r"KV cache size: ([\d,]+) tokens", line)
        if found:
            return int(found.group(1).replace(",", ""))
    return 0


def sized_stack(args: Any, models: list[ModelSpec], wanted_tokens: int, **env: str) -> tuple[Stack, int]:
    """A started stack whose workers' KV caches hold about ``wanted_tokens`` (0: the memory
    setting's cache): vLLM's tokens per block depend on the model (a hybrid model's sliding-window
    layers share the pool), so the first start measures them and the workers restart sized."""
    probe = PROBE_BLOCKS if wanted_tokens else 0
    stack = new_stack(models, inference_python=args.inference_python, **engine_settings(args, probe), **env)
    start_stack(stack)
    if not wanted_tokens:
        return stack, 0
    per_block = cache_tokens(stack, models[0].component) / PROBE_BLOCKS
    if not per_block:
        raise RuntimeError("the worker's log does not say its KV cache size")
    blocks = max(1, round(wanted_tokens / per_block))
    if blocks != probe:
        stack.extra_env["BATCHSTREAM_INFERENCE_KV_CACHE_BLOCKS"] = str(blocks)
        names = [m.component for m in models]
        stack.stop(names)
        stack.start(names)
    return stack, blocks


def compare(args: Any, input_path: Path, work: Path, wanted_tokens: int, label: str) -> list[dict[str, Any]]:
    """Rounds of run-batch and the stack (one worker), both with a KV cache of about
    ``wanted_tokens`` (0: the memory setting's), alternating which goes first."""
    rounds: list[dict[str, Any]] = []
    print(f"prefix ({label}): starting the stack ...", flush=True)
    stack, blocks = sized_stack(args, [ModelSpec(args.model_dir, SERVED_NAME)], wanted_tokens, **args.env)
    try:
        client = OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5, timeout=600)
        poller = MongoPoller(stack)
        try:
            systems = ["run-batch", "batchstream", GROUPED]
            for r in range(args.prefix_rounds):
                for system in systems if r % 2 == 0 else systems[::-1]:
                    print(f"prefix ({label}): round {r + 1}/{args.prefix_rounds}: {system} ...", flush=True)
                    cache = cache_tokens(stack, SERVED_COMPONENT)
                    if system == "run-batch":
                        result = run_batch_side(args, input_path, work, blocks)
                    elif system == GROUPED:
                        result = run_batch_side(args, grouped(input_path, work), work, blocks)
                        result["system"] = GROUPED
                    else:
                        if any(x["system"] == "batchstream" for x in rounds):
                            # A cold cache, as run-batch starts with: the worker would still hold
                            # the last round's prefixes (the same file's).
                            stack.stop([SERVED_COMPONENT])
                            stack.start([SERVED_COMPONENT])
                        warm_up(client, poller)
                        result = stack_once(client, poller, input_path)
                    result.setdefault("kv_cache", f"{cache:,} tokens")
                    rounds.append(result | {"round": r + 1, "cache": label, "blocks": blocks})
        finally:
            poller.close()
    finally:
        stack.stop()
    return rounds


def two_workers(args: Any, input_path: Path, wanted_tokens: int, affinity: bool) -> dict[str, Any]:
    """The stack with two workers of the model, each its own KV cache of about ``wanted_tokens``."""
    models = [ModelSpec(args.model_dir, SERVED_NAME), ModelSpec(args.model_dir, SERVED_NAME, replica=1)]
    print(f"prefix: two workers, affinity {'on' if affinity else 'off'}: starting ...", flush=True)
    env = {"BATCHSTREAM_DISPATCH_AFFINITY": str(affinity).lower(), **args.env}
    stack, _ = sized_stack(args, models, wanted_tokens, **env)
    try:
        client = OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5, timeout=600)
        poller = MongoPoller(stack)
        try:
            warm_up(client, poller)
            return stack_once(client, poller, input_path) | {"affinity": affinity}
        finally:
            poller.close()
    finally:
        stack.stop()
