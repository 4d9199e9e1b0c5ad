"""Run the benchmarks: ``python -m bench [--only parity|pipeline|prefix|shared|console|tenants|tail]
[options]``
(``make bench``), or ``python -m bench --only versus --against REV`` (this tree against an older
commit).

Prints tables and writes bench/results/bench-<time>.json and bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import console, parity, pipeline, pipeline_targets, prefix, shared, tail, tenants, versus
from bench.common import BROKER_ENV, default_path, machine
from deploy.local import REPO_ROOT
from deploy.local.brokers import BROKER_NAMES, BROKERS, DEFAULT_BROKER

RESULTS_DIR = REPO_ROOT / "bench" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--only",
        choices=["parity", "pipeline", "prefix", "shared", "console", "tenants", "tail", "versus"],
        help="run one benchmark (versus, tenants and tail: only so)",
    )
    parser.add_argument(
        "--inference-python",
        default=default_path("BATCHSTREAM_BENCH_INFERENCE_PYTHON", ".venv-inference/bin/python"),
        help="python with vLLM (env BATCHSTREAM_BENCH_INFERENCE_PYTHON)",
    )
    parser.add_argument(
        "--model-dir",
        default=default_path("BATCHSTREAM_BENCH_MODEL_DIR", ".cache/models/tiny-llama"),
        help="model both engines load (env BATCHSTREAM_BENCH_MODEL_DIR)",
    )
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default=os.environ.get(BROKER_ENV) or DEFAULT_BROKER,
        help=f"the stacks' Kafka broker: Tansu (memory) or noida-db (env {BROKER_ENV})",
    )
    parity_group = parser.add_argument_group("engine parity")
    parity_group.add_argument("--rounds", type=int, default=3)
    parity_group.add_argument("--parity-requests", type=int, default=400)
    parity_group.add_argument("--max-tokens", type=int, default=256)
    parity_group.add_argument("--max-num-seqs", type=int, default=64)
    parity_group.add_argument("--max-model-len", type=int, default=2048)
    parity_group.add_argument("--kv-cache-gib", default="1", help="VLLM_CPU_KVCACHE_SPACE for both")
    console_group = parser.add_argument_group("console (the batch list in Chromium)")
    console_group.add_argument("--console-batches", type=int, default=1000)
    console_group.add_argument("--console-rounds", type=int, default=5)
    versus_group = parser.add_argument_group("versus (the parity batch, this tree against a commit)")
    versus_group.add_argument("--against", default="", help="the commit (any git revision) to compare")
    versus_group.add_argument("--pairs", type=int, default=10, help="rounds of one batch on each side")
    versus_group.add_argument(
        "--idle-side",
        choices=["frozen", "running"],
        default="frozen",
        help="the other side's stack during a batch: frozen (SIGSTOP; each batch runs alone) or running idle",
    )
    versus_group.add_argument(
        "--start-first",
        choices=["this", "that"],
        default="this",
        help="whose stack starts first and runs the first batch (alternate it between runs: a whole "
        "run can favour one side)",
    )
    pre = parser.add_argument_group("prefix order (shared-prefix file against run-batch)")
    pre.add_argument("--input", default="", help="a chat-completions JSONL file instead of the generated one")
    pre.add_argument(
        "--prefix-model-dir",
        default=default_path("BATCHSTREAM_BENCH_PREFIX_MODEL_DIR", ".cache/models/gemma-3-270m"),
        help="the model of the prefix benchmark (Gemma 3 270M: prefill costs what it does on a real model)",
    )
    pre.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=0,
        help="KV cache of both sides in tokens (num_gpu_blocks_override = tokens / --kv-block-tokens); "
        "default: half the workload's shared prefixes, and a second run with the memory setting's cache",
    )
    pre.add_argument(
        "--kv-block-tokens", type=int, default=128, help="tokens per KV block (vLLM's CPU default: 128)"
    )
    pre.add_argument("--prefix-documents", type=int, default=8)
    pre.add_argument("--prefix-questions", type=int, default=6)
    pre.add_argument("--prefix-doc-words", type=int, default=90, help="words per document (~3 tokens each)")
    pre.add_argument("--prefix-templates", type=int, default=2)
    pre.add_argument("--prefix-inputs", type=int, default=6)
    pre.add_argument(
        "--prefix-dtype",
        default="float32",
        help="both engines' dtype (a CPU without AVX512-BF16 emulates bfloat16: about half the speed)",
    )
    pre.add_argument(
        "--prefix-max-model-len",
        type=int,
        default=0,
        help="both engines' max_model_len (default: the longest line's prompt and output, in whole blocks)",
    )
    pre.add_argument(
        "--prefix-caches",
        choices=["both", "small", "room"],
        default="both",
        help="which KV caches to run: the small one, the memory setting's (room), or both",
    )
    pre.add_argument("--prefix-rounds", type=int, default=1)
    pre.add_argument("--prefix-pairs", type=int, default=1, help="0 skips the two-worker affinity runs")
    sha = parser.add_argument_group("shared server (a batch beside live traffic on one vllm serve)")
    sha.add_argument(
        "--shared-model-dir",
        default=default_path("BATCHSTREAM_BENCH_SHARED_MODEL_DIR", ".cache/models/gemma-3-270m"),
        help="the server's model (Gemma 3 270M: a step costs what it does on a real model)",
    )
    sha.add_argument("--shared-dtype", default="float32", help="the server's dtype (see --prefix-dtype)")
    sha.add_argument("--shared-max-num-seqs", type=int, default=16, help="sequences the server runs at once")
    sha.add_argument("--shared-max-model-len", type=int, default=512)
    sha.add_argument("--shared-max-tokens", type=int, default=64, help="output tokens of each batch line")
    sha.add_argument("--live-max-tokens", type=int, default=16, help="output tokens of each live request")
    sha.add_argument(
        "--live-share",
        type=float,
        default=0.5,
        help="the live rate, as a share of the live requests/s sustained",
    )
    sha.add_argument("--shared-seconds", type=float, default=30.0, help="each measuring window")
    sha.add_argument("--shared-batch-lines", type=int, default=0, help="default: enough to outlast a window")
    pipe = parser.add_argument_group("pipeline ceiling (fake engine)")
    pipe.add_argument(
        "--lines",
        type=int,
        default=pipeline_targets.YARDSTICK_LINES,
        help="more than 50,000: a 50,000-line run first, then this one, compared",
    )
    pipe.add_argument(
        "--line-bytes",
        type=int,
        default=None,
        help="pad each line to about this size (4,000; 180 beyond 50,000 lines, to fit 2 GiB)",
    )
    pipe.add_argument("--small-runs", type=int, default=3, help="runs of the 10-line batch alone")
    pipe.add_argument("--profile", default="none", help="py-spy a service: api, aggregator, inference")
    pipe.add_argument("--share-lines", type=int, default=20_000, help="each project's batch (shares)")
    tai = parser.add_argument_group("tail (a file of mixed lengths: file order, sorted by hand, batchstream)")
    tai.add_argument(
        "--engine",
        choices=["vllm", "sim"],
        default="vllm",
        help="tail, shared and tenants: vLLM (tail: --model-dir, run-batch for the file orders) or "
        "the simulated GPU (--sim-*; for tenants the same as --tenants-engine sim)",
    )
    tai.add_argument("--tail-lines", type=int, default=1_000, help="lines of the generated file")
    tai.add_argument("--tail-short-tokens", type=int, default=32, help="output tokens of a short line")
    tai.add_argument("--tail-long-tokens", type=int, default=1_024, help="output tokens of a long line")
    tai.add_argument(
        "--tail-long-lines", type=int, default=0, help="long lines of the generated file (0: a tenth)"
    )
    tai.add_argument(
        "--tail-beside-lines",
        type=int,
        default=0,
        help="a batch of this many short lines beside batchstream's",
    )
    sim = parser.add_argument_group("the simulated GPU (--engine sim, --tenants-engine sim)")
    sim.add_argument(
        "--sim-speedup",
        type=float,
        default=None,
        help="simulated seconds per wall second on the stack (default 1 for tail, else 10: the "
        "stack's own timers, the counts' flushes and the ETA's whole seconds, count this many times over)",
    )
    sim.add_argument(
        "--sim-max-num-seqs", type=int, default=256, help="sequences it batches (vLLM's default)"
    )
    sim.add_argument("--sim-max-model-len", type=int, default=8_192)
    ten = parser.add_argument_group("tenants (a flooding project beside a well-behaved one)")
    ten.add_argument(
        "--tenants-engine",
        choices=["paced", "vllm", "sim"],
        default="paced",
        help="the fake engine at a fixed pace (default), the tiny vLLM model (--model-dir), or the "
        "simulated GPU (--sim-*)",
    )
    ten.add_argument("--tenants-line-seconds", type=float, default=0.2, help="paced: seconds a line takes")
    ten.add_argument("--tenants-places", type=int, default=64, help="paced: lines the engine runs at once")
    ten.add_argument("--tenants-good-lines", type=int, default=1_000, help="the good project's batch")
    ten.add_argument("--tenants-alone-runs", type=int, default=2, help="runs of the good batch alone")
    ten.add_argument("--tenants-flood-batches", type=int, default=50, help="the flood's small batches")
    ten.add_argument("--tenants-flood-lines", type=int, default=100, help="lines of each small batch")
    ten.add_argument(
        "--tenants-priority-batches", type=int, default=2, help="the flood's priority-100 batches"
    )
    ten.add_argument("--tenants-priority-lines", type=int, default=3_000, help="lines of each priority batch")
    ten.add_argument("--tenants-huge-line-mb", type=float, default=10, help="the huge line among short ones")
    ten.add_argument(
        "--tenants-over-line-mb",
        type=float,
        default=64,
        help="the line over the line limit (last, no newline)",
    )
    ten.add_argument("--tenants-giant-mb", type=float, default=1000, help="the one-line file (no newline)")
    ten.add_argument("--tenants-health-interval-ms", type=float, default=25, help="/health poll interval")
    ten.add_argument("--tenants-idle-s", type=float, default=3, help="/health polled on the idle stack")
    ten.add_argument("--tenants-timeout-s", type=float, default=600, help="longest wait for any batch")
    parity_group.add_argument(
        "--hol-big", type=int, default=2_000, help="big batch (real engine head of line); 0 skips it"
    )
    parity_group.add_argument("--hol-small", type=int, default=10, help="small batch behind it")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        type=_setting,
        metavar="KEY=VALUE",
        help="extra setting for the stack's services in both benchmarks (repeatable), for experiments",
    )
    args = parser.parse_args(argv)
    args.env = dict(args.env)
    if args.sim_speedup is None:
        args.sim_speedup = 1.0 if args.only == "tail" else 10.0
    return args


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not key or not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _save(report: dict[str, Any], path: Path) -> None:
    text = json.dumps(_clean(report), indent=2, default=str)
    path.write_text(text)
    (RESULTS_DIR / "latest.json").write_text(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ[BROKER_ENV] = args.broker  # every stack of the run (new_stack)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "broker": args.broker,
    }
    m = report["machine"]
    print(f"machine: {m['cpu_model']}, {m['usable_cpus']} usable CPUs, {m['memory_gib']} GiB", flush=True)
    print(f"broker: {BROKER_NAMES[args.broker]}", flush=True)
    started = time.monotonic()
    path = RESULTS_DIR / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if args.only == "versus":
        report["versus"] = versus.run(args)
    if args.only == "tenants":
        report["tenants"] = tenants.run(args)
    if args.only == "tail":
        report["tail"] = tail.run(args)
    if args.only in (None, "pipeline"):
        if args.line_bytes is None:
            args.line_bytes = 4_000 if args.lines <= pipeline_targets.YARDSTICK_LINES else 180
        if args.lines > pipeline_targets.YARDSTICK_LINES:  # the same run at 50,000 lines first, to compare
            big = args.lines
            args.lines = pipeline_targets.YARDSTICK_LINES
            report["pipeline_yardstick"] = pipeline.run(args, RESULTS_DIR)
            _save(report, path)
            args.lines = big
        report["pipeline"] = pipeline.run(args, RESULTS_DIR)
        if "pipeline_yardstick" in report:
            report["pipeline_scale"] = pipeline_targets.compare(
                report["pipeline_yardstick"], report["pipeline"]
            )
        _save(report, path)
    if args.only in (None, "parity"):
        report["parity"] = parity.run(args)
        _save(report, path)
    if args.only in (None, "prefix"):
        report["prefix"] = prefix.run(args)
        _save(report, path)
    if args.only in (None, "shared"):
        report["shared"] = shared.run(args)
        _save(report, path)
    if args.only in (None, "console"):
        report["console"] = console.run(args)
    report["duration_s"] = time.monotonic() - started
    _save(report, path)
    print(f"\nresults: {path} ({report['duration_s']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
