"""Prefix order: a shuffled shared-prefix file through ``vllm run-batch`` and through the stack.

``python -m bench --only prefix [--input FILE] [--kv-cache-tokens N]``. Without ``--input`` it
makes two shared-prefix workloads, shuffled: documents x questions, and few-shot templates x
inputs. With ``--input`` it takes any chat-completions JSONL file as given (``body.model``
replaced by the benchmark's model). Both sides run the same model with the same engine settings
(prefix caching on, as vLLM's default; the KV cache sized alike by ``num_gpu_blocks_override``);
rounds alternate which goes first.

Figures per side: output tokens/s (timed as in ``parity.py``), the prefix-cache hit rate
(``cached_tokens`` over prompt tokens, summed over the output file's ``usage``) and the prefill
tokens computed (prompt tokens minus cached). A third side, ``run-batch grouped``, is run-batch
on the same lines sorted by their messages (lines sharing a prefix adjacent, as a user could sort
a file by hand): what the order alone is worth to the engine, the yardstick of the stack's ratio.
The ideal is each distinct prefix computed once:
the prompts' token ids (the model's own tokenizer and chat template) in a trie, counted in whole
KV blocks as vLLM caches them. The last line is ``prefix: X.XXx run-batch``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from openai import OpenAI

from bench.common import MongoPoller, create_batch, median, new_stack, start_stack, table
from bench.parity import engine_env, run_batch_once
from deploy.local import ModelSpec, Stack

SERVED_NAME = "prefix-model"
SERVED_COMPONENT = ModelSpec("", SERVED_NAME).component
# run-batch on the same lines sorted by their messages: what the order alone gives the engine.
GROUPED = "run-batch grouped"
# The first start's KV cache in blocks, from which the model's tokens per block are measured.
PROBE_BLOCKS = 400
WORDS = "river stone lamp market clock storm bread field letter window garden tower".split()


def documents_lines(documents: int, questions: int, doc_words: int, max_tokens: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for d in range(documents):
        text = " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(doc_words))
        for q in range(questions):
            lines.append(
                _chat(
                    f"doc{d}-q{q}",
                    [
                        {"role": "system", "content": "Answer the question from the document, briefly."},
                        {
                            "role": "user",
                            "content": f"Document {d}:\n{text}\n\nQuestion {q}: what is word {q}?",
                        },
                    ],
                    max_tokens,
                )
            )
    rng.shuffle(lines)
    return lines


def fewshot_lines(templates: int, inputs: int, shots: int, max_tokens: int, seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    lines = []
    for t in range(templates):
        examples = []
        for s in range(shots):
            words = " ".join(rng.choice(WORDS) for _ in range(24))
            examples += [
                {"role": "user", "content": f"Task {t} example {s}: {words}"},
                {"role": "assistant", "content": f"Label {rng.randrange(5)}"},
            ]
        for i in range(inputs):
            words = " ".join(rng.choice(WORDS) for _ in range(12))
            messages = [{"role": "system", "content": f"Label each text for task {t}."}, *examples]
            messages.append({"role": "user", "content": f"Input {i}: {words}"})
            lines.append(_chat(f"tpl{t}-in{i}", messages, max_tokens))
    rng.shuffle(lines)
    return lines


def _chat(custom_id: str, messages: list[dict[str, str]], max_tokens: int) -> str:
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def given_lines(path: str) -> list[str]:
    lines = []
    for raw in Path(path).read_text().splitlines():
        if raw.strip():
            item = json.loads(raw)
            item.setdefault("body", {})["model"] = SERVED_NAME
            lines.append(json.dumps(item))
    return lines


IDEAL_SCRIPT = r"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
block = int(sys.argv[3])
seqs = []
for raw in open(sys.argv[2]):
    if raw.strip():
        body = json.loads(raw)["body"]
        ids = tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        seqs.append(tuple(ids))
seqs.sort()
def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
shared = [lcp(seqs[i - 1], seqs[i]) for i in range(1, len(seqs))]
ideal = sum(len(s) for s in seqs) - sum((n // block) * block for n in shared)
# Tokens of the prefixes two or more lines share, each counted once: what a cache must hold.
distinct = sum(max(0, shared[i] - (shared[i - 1] if i else 0)) for i in range(len(shared)))
total = sum(len(s) for s in seqs)
longest = max((len(s) for s in seqs), default=0)
figures = {"prompt_tokens": total, "ideal_computed": ideal, "distinct_shared": distinct, "longest": longest}
print(json.dumps(figures))
"""


def ideal(python: str, model_dir: str, input_path: Path, block: int) -> dict[str, int]:
    """Prompt tokens; the prefill tokens of each distinct prefix computed once (whole blocks);
    the tokens of the shared prefixes (what the KV cache must hold for the ideal); the longest
    prompt."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [python, "-c", IDEAL_SCRIPT, model_dir, str(input_path), str(block)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def fitting_model_len(lines: list[str], longest_prompt: int, block: int, fallback: int) -> int:
    """The smallest max_model_len (whole KV blocks) that holds every line: vLLM refuses a KV
    cache smaller than one request of max_model_len, so this sets how small a cache can be.
    ``fallback`` when a line leaves its output length to the engine."""
    outputs = []
    for raw in lines:
        body = json.loads(raw).get("body") or {}
        out = body.get("max_completion_tokens") or body.get("max_tokens")
        if not isinstance(out, int):
            return fallback
        outputs.append(out)
    need = longest_prompt + max(outputs, default=0) + 1
    return -(-need // block) * block


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


def grouped(input_path: Path, work: Path) -> Path:
    """The same lines sorted by their messages, so lines that share a prefix are adjacent: the
    order a user could give run-batch by hand (the yardstick of what order alone is worth)."""
    lines = [x for x in input_path.read_text().splitlines() if x.strip()]
    lines.sort(key=lambda x: json.dumps(json.loads(x).get("body", {}).get("messages")))
    out = work / "in-grouped.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


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


def run(args: Any) -> dict[str, Any]:
    if not Path(args.prefix_model_dir, "config.json").exists():
        raise SystemExit(f"no model at {args.prefix_model_dir} (make bench prepares Gemma 3 270M)")
    args = argparse.Namespace(
        **{**vars(args), "model_dir": args.prefix_model_dir, "served_name": SERVED_NAME}
    )
    work = Path(tempfile.mkdtemp(prefix="batchstream-prefix-"))
    input_path = work / "in.jsonl"
    if args.input:
        lines = given_lines(args.input)
        workload = f"{args.input} ({len(lines)} lines)"
    else:
        lines = documents_lines(
            args.prefix_documents, args.prefix_questions, args.prefix_doc_words, 8, seed=1
        )
        lines += fewshot_lines(args.prefix_templates, args.prefix_inputs, 6, 8, seed=1)
        random.Random(2).shuffle(lines)
        workload = (
            f"{args.prefix_documents} documents x {args.prefix_questions} questions + "
            f"{args.prefix_templates} few-shot templates x {args.prefix_inputs} inputs, shuffled"
        )
    input_path.write_text("\n".join(lines) + "\n")
    os.environ.update(engine_env(args.kv_cache_gib))
    block = args.kv_block_tokens
    best = ideal(args.inference_python, args.model_dir, input_path, block)
    if not args.prefix_max_model_len:
        args.prefix_max_model_len = fitting_model_len(lines, best["longest"], block, args.max_model_len)
    args.max_model_len = args.prefix_max_model_len  # both sides' engines
    # vLLM refuses a cache that cannot hold one request of max_model_len.
    wanted = max(args.kv_cache_tokens or best["distinct_shared"] // 2, args.max_model_len + block)
    print(
        f"prefix: {len(lines)} lines, {best['prompt_tokens']:,} prompt tokens, shared prefixes "
        f"{best['distinct_shared']:,} tokens; a small KV cache of about {wanted:,} tokens",
        flush=True,
    )
    rounds = compare(args, input_path, work, wanted, "small") if args.prefix_caches != "room" else []
    if not args.kv_cache_tokens and args.prefix_caches != "small":
        rounds += compare(args, input_path, work, 0, "room")
    pair = (
        [two_workers(args, input_path, wanted, flag) for flag in (True, False)] if args.prefix_pairs else []
    )

    def med(cache: str, system: str, key: str) -> float:
        return median(x[key] for x in rounds if x["system"] == system and x["cache"] == cache)

    print()
    print(
        table(
            f"Prefix order: {workload}; max_num_seqs={args.max_num_seqs}, "
            f"max_model_len={args.max_model_len}, dtype {args.prefix_dtype}; KV cache small: about "
            f"{wanted:,} tokens, room: the memory setting's ({args.kv_cache_gib} GiB)",
            [
                "cache",
                "round",
                "system",
                "timed s",
                "validate s",
                "finalize s",
                "tok/s",
                "hit rate",
                "prefill computed",
                "prompt tokens",
            ],
            [
                [
                    x["cache"],
                    x["round"],
                    x["system"],
                    x["timed_s"],
                    x.get("validate_s", float("nan")),
                    x.get("finalize_s", float("nan")),
                    x["tokens_per_s"],
                    x["hit_rate"],
                    x["computed"],
                    x["prompt_tokens"],
                ]
                for x in rounds
            ],
        )
    )
    ideal_computed = max(1, best["ideal_computed"])
    summary: dict[str, Any] = {}
    for cache in sorted({x["cache"] for x in rounds}, key=lambda c: c != "small"):
        ratio = med(cache, "batchstream", "tokens_per_s") / med(cache, "run-batch", "tokens_per_s")
        summary[cache] = {
            "ratio": ratio,
            "run_batch_computed_over_ideal": med(cache, "run-batch", "computed") / ideal_computed,
            "batchstream_computed_over_ideal": med(cache, "batchstream", "computed") / ideal_computed,
            "grouped_computed_over_ideal": med(cache, GROUPED, "computed") / ideal_computed,
            "grouped_over_run_batch": med(cache, GROUPED, "tokens_per_s")
            / med(cache, "run-batch", "tokens_per_s"),
            "run_batch_hit_rate": med(cache, "run-batch", "hit_rate"),
            "batchstream_hit_rate": med(cache, "batchstream", "hit_rate"),
        }
        s = summary[cache]
        print(
            f"{cache} cache: batchstream/run-batch tokens/s {ratio:.2f}x; hit rate "
            f"{s['run_batch_hit_rate']:.1%} run-batch, {s['batchstream_hit_rate']:.1%} batchstream; "
            f"prefill computed / ideal ({best['ideal_computed']:,} tokens): "
            f"{s['run_batch_computed_over_ideal']:.2f}x run-batch, "
            f"{s['batchstream_computed_over_ideal']:.2f}x batchstream, "
            f"{s['grouped_computed_over_ideal']:.2f}x run-batch grouped; run-batch on the file "
            f"sorted by hand: {s['grouped_over_run_batch']:.2f}x run-batch; vLLM's cache: "
            f"{next((x['kv_cache'] for x in rounds if x['cache'] == cache and x.get('kv_cache')), '?')}"
        )
    for x in pair:
        print(
            f"two workers, affinity {'on ' if x['affinity'] else 'off'}: hit rate {x['hit_rate']:.1%}, "
            f"prefill computed {x['computed']:,}, {x['tokens_per_s']:.1f} tok/s"
        )
    print(f"prefix: {summary['small' if 'small' in summary else 'room']['ratio']:.2f}x run-batch")
    return {
        "workload": workload,
        "ideal": best,
        "kv_cache": {"small_tokens_wanted": wanted, "block_tokens": block},
        "rounds": rounds,
        "two_workers": pair,
        "summary": summary,
    }
