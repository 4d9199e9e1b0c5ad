"""Engine parity: the same chat file through ``vllm run-batch`` and through the batchstream stack.

Same model, same engine settings (enforce_eager, max_num_seqs, max_model_len, dtype,
VLLM_CPU_KVCACHE_SPACE), greedy decoding with a fixed max_tokens, several rounds alternating which
goes first. Engine start-up is excluded from both timings:

- run-batch: timed from its "Reading batch from" log line (printed once the engine and the serving
  objects are up) to the moment the output file was last written (its mtime); engine shutdown after
  the write is not counted. Its whole process wall time (start-up included) is reported beside it.
- batchstream: the worker's engine is started once, before any round; a round is timed from
  ``batches.create`` to the batch document turning ``completed`` (polled from MongoDB every 50 ms),
  and from the start of the upload to the same point.

Throughput is completion tokens summed over the output file, divided by the timed span.
"""

from __future__ import annotations

import collections
import json
import os
import re
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openai import OpenAI

from bench import dispatch
from bench.common import (
    MongoPoller,
    ResultsTap,
    chat_line,
    cpu_seconds,
    create_batch,
    median,
    new_stack,
    start_stack,
    table,
)
from deploy.local import ModelSpec

SERVED_NAME = "tiny-llama"
READY_MARKER = "Reading batch from"


def build_input(path: Path, requests: int, max_tokens: int) -> None:
    topics = ["a river", "a lighthouse", "the moon", "a market", "an old clock", "a storm", "bread"]
    with path.open("w") as out:
        for i in range(requests):
            prompt = f"Write a short story about {topics[i % len(topics)]}, number {i}."
            out.write(chat_line(f"req-{i}", SERVED_NAME, prompt, max_tokens=max_tokens, temperature=0) + "\n")


def engine_env(kv_cache_gib: str) -> dict[str, str]:
    return {
        "VLLM_CPU_KVCACHE_SPACE": kv_cache_gib,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }


def summarize_output(lines: list[dict[str, Any]]) -> tuple[int, int, dict[str, str]]:
    """(completion tokens, failed lines, custom_id -> generated text)."""
    tokens = failed = 0
    texts: dict[str, str] = {}
    for line in lines:
        body = (line.get("response") or {}).get("body") or {}
        if line.get("error") or (line.get("response") or {}).get("status_code") != 200:
            failed += 1
            continue
        tokens += int(body.get("usage", {}).get("completion_tokens", 0))
        texts[line["custom_id"]] = body["choices"][0]["message"]["content"]
    return tokens, failed, texts


def run_batch_once(
    python: str,
    model_dir: str,
    input_path: Path,
    work: Path,
    args: Any,
    stack_pids: dict[str, int],
    on_output: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``vllm run-batch`` on the file; ``on_output`` sees each line it prints as it prints it
    (a progress bar's every refresh is a line)."""
    output = work / f"run-batch-{time.time_ns()}.jsonl"
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.run_batch",
        "-i",
        str(input_path),
        "-o",
        str(output),
        "--model",
        model_dir,
        "--served-model-name",
        getattr(args, "served_name", SERVED_NAME),
        "--dtype",
        "auto",
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-model-len",
        str(args.max_model_len),
        "--enforce-eager",
        "--disable-log-stats",
        *getattr(args, "run_batch_extra", ()),
    ]
    env = {**os.environ, **engine_env(args.kv_cache_gib)}
    idle_before = sum(stack_cpu(stack_pids).values())
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    ready_at: list[float] = []
    kv_cache: list[str] = []  # vLLM's own reading of its cache size ("8,110 tokens")
    start = time.time()
    proc = subprocess.Popen(
        argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if READY_MARKER in line and not ready_at:
                ready_at.append(time.time())
            found = re.search(r"KV cache size: ([\d,]+ tokens)", line)
            if found and not kv_cache:
                kv_cache.append(found.group(1))
            tail.append(line.rstrip())
            if on_output is not None:
                on_output(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    rc = proc.wait(timeout=1800)
    ended = time.time()
    reader.join(timeout=5)
    if rc != 0 or not ready_at or not output.exists():
        raise RuntimeError(f"vllm run-batch failed (rc {rc}):\n" + "\n".join(tail))
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # run-batch and its engine core, reaped
    written = output.stat().st_mtime
    lines = [json.loads(x) for x in output.read_text().splitlines() if x.strip()]
    tokens, failed, texts = summarize_output(lines)
    timed = written - ready_at[0]
    return {
        "system": "run-batch",
        "wall_s": ended - start,
        "startup_s": ready_at[0] - start,
        "timed_s": timed,
        "lines": len(lines),
        "failed": failed,
        "output_tokens": tokens,
        "tokens_per_s": tokens / timed,
        "stack_idle_cpu_s": sum(stack_cpu(stack_pids).values()) - idle_before,
        "kv_cache": kv_cache[0] if kv_cache else "",
        "cpu_s": {
            "run-batch": children.ru_utime
            + children.ru_stime
            - children_before.ru_utime
            - children_before.ru_stime
        },
        "_texts": texts,
    }


def stack_cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def batchstream_once(
    client: OpenAI, poller: MongoPoller, tap: ResultsTap, input_path: Path, pids: dict[str, int]
) -> dict[str, Any]:
    cpu_before = stack_cpu(pids)
    start = time.time()
    upload = client.files.create(file=("parity.jsonl", input_path.read_bytes()), purpose="batch")
    batch_id, created_at = create_batch(client, upload.id)
    trace = poller.completed(batch_id, timeout_s=1800)
    done = trace.status_at["completed"]
    out_id = trace.doc["output_file_id"]
    lines = [json.loads(x) for x in client.files.content(out_id).text.splitlines() if x.strip()]
    tokens, failed, texts = summarize_output(lines)
    tap.wait_for(batch_id, len(lines), 10)
    last_result = max(tap.times.get(batch_id) or [float("nan")])
    first_result = min(tap.times.get(batch_id) or [float("nan")])
    timed = done - created_at
    cpu_after = stack_cpu(pids)
    return {
        "system": "batchstream",
        "cpu_s": {name: cpu_after[name] - cpu_before[name] for name in pids},
        "wall_s": done - start,
        "upload_s": created_at - start,
        "timed_s": timed,
        "lines": len(lines),
        "failed": failed,
        "output_tokens": tokens,
        "tokens_per_s": tokens / timed,
        "to_first_result_s": first_result - created_at,
        "to_last_result_s": last_result - created_at,
        "tokens_per_s_to_last_result": tokens / (last_result - created_at),
        "_texts": texts,
    }


def run(args: Any) -> dict[str, Any]:
    if not Path(args.inference_python).exists():
        raise SystemExit(f"no inference python at {args.inference_python} (run `make venvs`)")
    if not Path(args.model_dir, "config.json").exists():
        raise SystemExit(f"no model at {args.model_dir} (run `make test` or `make up UP_MODEL=tiny`)")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = args.kv_cache_gib  # the stack's worker reads it
    work = Path(tempfile.mkdtemp(prefix="batchstream-parity-"))
    input_path = work / "in.jsonl"
    build_input(input_path, args.parity_requests, args.max_tokens)
    stack = new_stack(
        [ModelSpec(args.model_dir, SERVED_NAME)],
        inference_python=args.inference_python,
        BATCHSTREAM_INFERENCE_MAX_NUM_SEQS=str(args.max_num_seqs),
        BATCHSTREAM_INFERENCE_MAX_MODEL_LEN=str(args.max_model_len),
        BATCHSTREAM_INFERENCE_DTYPE="auto",
        **args.env,
    )
    rounds: list[dict[str, Any]] = []
    try:
        print(f"parity: starting the stack (vLLM worker on {args.model_dir}) ...", flush=True)
        startup = start_stack(stack)
        client = OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5, timeout=600)
        poller = MongoPoller(stack)
        tap = ResultsTap(stack)
        pids = stack.pids()
        try:
            for r in range(args.rounds):
                order = ["run-batch", "batchstream"] if r % 2 == 0 else ["batchstream", "run-batch"]
                for system in order:
                    print(f"parity: round {r + 1}/{args.rounds}: {system} ...", flush=True)
                    if system == "run-batch":
                        result = run_batch_once(
                            args.inference_python, args.model_dir, input_path, work, args, pids
                        )
                    else:
                        result = batchstream_once(client, poller, tap, input_path, pids)
                    result["round"] = r + 1
                    rounds.append(result)
            # after parity: leaves it undisturbed; --hol-big 0 skips it (parity alone, for A/B runs)
            hol = head_of_line_real(args, client, poller, work) if args.hol_big else None
        finally:
            tap.close()
            poller.close()
    finally:
        stack.stop()

    reference = next(x["_texts"] for x in rounds if x["system"] == "run-batch")
    for result in rounds:
        texts = result.pop("_texts")
        result["same_text_as_run_batch"] = sum(1 for k, v in texts.items() if reference.get(k) == v)

    def med(system: str, key: str) -> float:
        return median(x[key] for x in rounds if x["system"] == system and key in x)

    theirs, ours = med("run-batch", "tokens_per_s"), med("batchstream", "tokens_per_s")
    ours_to_last_result = med("batchstream", "tokens_per_s_to_last_result")
    summary: dict[str, float | None] = {
        "run_batch_tokens_per_s": theirs,
        "batchstream_tokens_per_s": ours,
        "batchstream_tokens_per_s_to_last_result": ours_to_last_result,
        "run_batch_timed_s": med("run-batch", "timed_s"),
        "batchstream_timed_s": med("batchstream", "timed_s"),
        "run_batch_startup_s": med("run-batch", "startup_s"),
        "batchstream_worker_startup_s": startup.get(f"{stack.models[0].component}_start_s"),
    }
    summary["throughput_ratio_batchstream_over_run_batch"] = ours / theirs
    summary["engine_ratio_to_last_result"] = ours_to_last_result / theirs
    print()
    print(
        table(
            f"Engine parity: {args.parity_requests} chat requests, max_tokens={args.max_tokens}, "
            f"temperature 0, max_num_seqs={args.max_num_seqs}, max_model_len={args.max_model_len}, "
            f"enforce_eager, VLLM_CPU_KVCACHE_SPACE={args.kv_cache_gib}",
            [
                "round",
                "system",
                "timed s",
                "tok/s",
                "to first result s",
                "to last result s",
                "wall s",
                "start-up s",
                "out tokens",
                "failed",
                "same text",
            ],
            [
                [
                    x["round"],
                    x["system"],
                    x["timed_s"],
                    x["tokens_per_s"],
                    x.get("to_first_result_s", float("nan")),
                    x.get("to_last_result_s", float("nan")),
                    x["wall_s"],
                    x.get("startup_s", float("nan")),
                    x["output_tokens"],
                    x["failed"],
                    x["same_text_as_run_batch"],
                ]
                for x in rounds
            ],
        )
    )
    print(
        f"median tok/s: run-batch {summary['run_batch_tokens_per_s']:,.0f}, batchstream "
        f"{summary['batchstream_tokens_per_s']:,.0f}; ratio batchstream/run-batch "
        f"{summary['throughput_ratio_batchstream_over_run_batch']:.2f} (create to completed), "
        f"{summary['engine_ratio_to_last_result']:.2f} (create to the last result on Kafka)\n"
        "timed: run-batch from its 'Reading batch from' log line (engine up) to the output file's "
        "last write; batchstream from batches.create to status completed (engine started before), "
        "and to the last result message on Kafka (before aggregation and finalize). "
        "wall: run-batch process start to exit; batchstream upload start to completed. "
        "batchstream start-up is the worker's, once for all rounds: "
        f"{summary['batchstream_worker_startup_s']:.1f} s."
    )
    print(cpu_report(rounds, stack.models[0].component))
    if hol is not None:
        dispatch.print_figures(
            f"Dispatcher (real engine): {args.hol_small}-line batch behind {args.hol_big:,} lines", hol, None
        )
    return {
        "settings": _settings(args),
        "startup": startup,
        "rounds": rounds,
        "summary": summary,
        "head_of_line": hol,
    }


def head_of_line_real(args: Any, client: OpenAI, poller: MongoPoller, work: Path) -> dict[str, Any]:
    """The real-engine head of line: a small batch behind a big one, within 2x its time alone."""
    print(f"parity: head of line, {args.hol_small} lines behind {args.hol_big:,} ...", flush=True)
    big_path = work / "hol-big.jsonl"
    build_input(big_path, args.hol_big, args.max_tokens)
    big_id = client.files.create(file=(big_path.name, big_path.read_bytes()), purpose="batch").id

    def upload_small(client: OpenAI, tag: str) -> str:
        path = work / f"hol-{tag}.jsonl"
        build_input(path, args.hol_small, args.max_tokens)
        return client.files.create(file=(path.name, path.read_bytes()), purpose="batch").id

    return dispatch.head_of_line(client, poller, upload_small, big_id, 3, factor=2.0, slack_s=0.0)


def cpu_report(rounds: list[dict[str, Any]], worker: str) -> str:
    """Where the CPU went: the engine's share against the plumbing's, per system (medians)."""
    ours = [x for x in rounds if x["system"] == "batchstream"]
    theirs = [x for x in rounds if x["system"] == "run-batch"]
    worker_s = median(x["cpu_s"].get(worker, 0.0) for x in ours)
    others = {name: median(x["cpu_s"][name] for x in ours) for name in ours[0]["cpu_s"] if name != worker}
    spread = ", ".join(f"{name} {value:.1f}" for name, value in sorted(others.items(), key=lambda kv: -kv[1]))
    run_batch_s = median(x["cpu_s"]["run-batch"] for x in theirs)
    return (
        f"CPU s per round (median): run-batch (engine included) {run_batch_s:.1f}"
        f", idle stack beside it {median(x['stack_idle_cpu_s'] for x in theirs):.1f}; "
        f"batchstream worker (engine included) {worker_s:.1f}, the rest of the stack "
        f"{sum(others.values()):.1f} ({spread})"
    )


def _settings(args: Any) -> dict[str, Any]:
    keys = ["parity_requests", "max_tokens", "max_num_seqs", "max_model_len", "kv_cache_gib", "rounds"]
    return {k: getattr(args, k) for k in keys} | {"model_dir": args.model_dir, "extra_env": args.env}
