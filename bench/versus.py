"""Versus: the parity batch through this tree's stack and through an older commit's, in turns.

Answers "did this change cost throughput?", which the parity ratio cannot settle on a shared
machine: there, ``vllm run-batch`` itself varies by 10-25% from one round to the next, more than
the 3% to be shown. Here both stacks (each with its own vLLM worker, started before the rounds)
are up at once, and while one side runs its batch the other side's stack is frozen (SIGSTOP to
each of its process groups, SIGCONT after; its driver process is not, and only polls a little),
so no other service shares the machine with the batch and each batch runs alone: an idle stack
is not free (~1.6 CPU s per batch on the one core vLLM leaves to everything else on the
development machine, docs/benchmarks.md). ``--idle-side running`` keeps it up idle and measures
its CPU. A thawed side first runs a small untimed warm-up batch (its broker saw its consumers'
sessions lapse while frozen; the warm-up waits out the rejoin). The rounds go ABBA (this, that,
that, this, ...; with ``--start-first that``: that, this, this, that, ...), so the first batch
of each round after the first follows that same side's batch of the round before, with no freeze
and no warm-up; the two sides take that place in turns. The figure is the geometric mean of the
per-round ratios (this tree's tokens/s over the other's, the two batches of one round back to
back) with its 95% interval (Student's t on the log ratios); the median and range are
printed beside it. No run-batch and no engine start-up per round: on the development machine a
round takes ~25 s, so many fit.

The other commit is checked out in a temporary git worktree that shares this tree's ``.venv``,
``.venv-inference`` and ``.cache``; each side's stack runs from its own tree, driven by a child
process (``_SIDE``) that uses that tree's own bench helpers, so the older code is run as it was.
A child stops its stack when its stdin closes or it gets SIGINT or SIGTERM, so a failed or
interrupted run leaves no stack behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from bench.common import median, table
from bench.parity import stack_cpu
from deploy.local import REPO_ROOT

CPU_KEYS = ("worker_cpu_s", "rest_cpu_s", "idle_side_cpu_s")
STOP_WAIT_S = 300  # longer than a stack's own stop timeouts added up
# Student's t, two-sided 95%, by degrees of freedom (between the rows: the row below, the wider).
T95 = dict(enumerate([12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228], start=1)) | {
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    35: 2.030,
    40: 2.021,
    50: 2.009,
    60: 2.000,
    80: 1.990,
    100: 1.984,
    120: 1.980,
}


def t95(df: int) -> float:
    """Student's t for a two-sided 95% interval: the table's row at or below ``df``."""
    return T95[max(k for k in T95 if k <= max(df, 1))]


SHARED = (".venv", ".venv-inference", ".cache")  # linked into the other tree, not rebuilt

# One side's driver, run with ``python -c`` in its tree (its cwd first on sys.path): it starts
# that tree's stack, then runs the parity batch once per "run" line on stdin and answers one JSON
# line per batch on its own stdout channel (everything else the tree prints goes to stderr); a "warm"
# line runs a small batch, untimed.
_SIDE = r"""
WARM_LINES = 8
import hashlib, json, os, shutil, signal, sys, tempfile
from pathlib import Path
answer = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the finally: the stack stops
cfg = json.loads(sys.argv[1])
os.environ["VLLM_CPU_KVCACHE_SPACE"] = cfg["kv_cache_gib"]
from openai import OpenAI
from bench.common import MongoPoller, ResultsTap, new_stack, start_stack
from bench.parity import SERVED_NAME, ModelSpec, batchstream_once, build_input  # as that tree has them
work = Path(tempfile.mkdtemp(prefix="batchstream-versus-"))
path = work / "in.jsonl"
build_input(path, cfg["requests"], cfg["max_tokens"])
warm = work / "warm.jsonl"
build_input(warm, WARM_LINES, 16)
stack = new_stack([ModelSpec(cfg["model_dir"], SERVED_NAME)], inference_python=cfg["inference_python"],
                  **cfg["env"])
try:
    start_stack(stack)
    client = OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5, timeout=600)
    poller, tap = MongoPoller(stack), ResultsTap(stack)
    try:
        answer.write(json.dumps({"ready": True, "pids": stack.pids()}) + "\n")
        for command in sys.stdin:
            if command.strip() == "warm":  # untimed: the whole pipeline works again
                batchstream_once(client, poller, tap, warm, stack.pids())
                answer.write(json.dumps({"warm": True}) + "\n")
                continue
            if command.strip() != "run":
                break
            seen = set(tap.times)  # the results tap keys results by batch id: this batch's is the new one
            result = batchstream_once(client, poller, tap, path, stack.pids())
            texts = result.pop("_texts")
            digest = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()[:12]
            new = [key for key in tap.times if key not in seen]
            stamps = sorted(tap.times[new[0]]) if len(new) == 1 else []
            offsets = [round(t - stamps[0], 3) for t in stamps]  # each result after the first, for the JSON
            answer.write(json.dumps({**result, "texts_sha256": digest, "result_offsets_s": offsets}) + "\n")
    finally:
        tap.close()
        poller.close()
finally:
    stack.stop()
    shutil.rmtree(work, ignore_errors=True)
"""


class Side:
    """One tree's stack, driven by a ``_SIDE`` child process."""

    def __init__(self, name: str, tree: Path, config: dict[str, Any], log: Path) -> None:
        self.name = name
        self.log = log
        self.pids: dict[str, int] = {}
        self.frozen = False
        self._stderr = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SIDE, json.dumps(config)],
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )

    def wait_ready(self) -> None:
        """Until its stack is up."""
        self.pids = self._read()["pids"]

    def cpu_s(self) -> float:
        """CPU seconds its stack's processes have used so far."""
        return sum(stack_cpu(self.pids).values())

    def run(self) -> dict[str, Any]:
        return self._ask("run")

    def warm_up(self) -> None:
        self._ask("warm")

    def freeze(self) -> None:
        """SIGSTOP every process group of its stack (a vLLM worker's engine processes too)."""
        self.frozen = True  # first: an interrupt midway still leaves it to be thawed
        self._signal_groups(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal_groups(signal.SIGCONT)
        self.frozen = False

    def _signal_groups(self, sig: signal.Signals) -> None:
        for pid in self.pids.values():  # each component leads its own process group
            with contextlib.suppress(OSError):
                os.killpg(pid, sig)

    def _ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """Ends the child, which stops its stack (its ``finally``); never raises. ``run`` thaws
        every side before closing any."""
        with contextlib.suppress(OSError):  # a child already gone: a broken pipe
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        for nudge in (None, signal.SIGINT, signal.SIGKILL):
            if nudge is not None:
                self.proc.send_signal(nudge)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_WAIT_S)
                break
        self._stderr.close()

    def _read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.proc.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            rc = self.proc.wait()
            self._stderr.flush()
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"the {self.name} side ended (rc {rc}); the end of its log:\n{tail}")
        return json.loads(line)  # type: ignore[no-any-return]


def git(*argv: str, check: bool = False) -> str:
    """A git command in this tree; its output (with ``check``, its failure ends the run, saying why)."""
    done = subprocess.run(["git", "-C", str(REPO_ROOT), *argv], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"git {' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def checkout(rev: str, into: Path) -> Path:
    """A detached worktree of ``rev`` sharing this tree's environments."""
    tree = into / "tree"
    git("worktree", "add", "--detach", str(tree), rev, check=True)
    for name in SHARED:
        (tree / name).symlink_to(REPO_ROOT / name)
    return tree


def remove(tree: Path) -> None:
    git("worktree", "remove", "--force", str(tree))


def describe(rev: str) -> str:
    return git("log", "-1", "--format=%h %s", rev)[:72] or rev


def run(args: Any) -> dict[str, Any]:
    if not args.against:
        raise SystemExit("--only versus needs --against REV")
    if args.pairs < 2:
        raise SystemExit("--pairs must be at least 2 (the interval needs two rounds)")
    for needed in (Path(args.inference_python), Path(args.model_dir, "config.json")):
        if not needed.exists():
            raise SystemExit(f"{needed} is missing (run `make venvs` and `make test` once)")
    config = {
        "kv_cache_gib": args.kv_cache_gib,
        "requests": args.parity_requests,
        "max_tokens": args.max_tokens,
        "model_dir": args.model_dir,
        "inference_python": args.inference_python,
        "env": {
            "BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(args.max_num_seqs),
            "BATCHSTREAM_INFERENCE_MAX_MODEL_LEN": str(args.max_model_len),
            "BATCHSTREAM_INFERENCE_DTYPE": "auto",
            **args.env,
        },
    }
    versions = {
        "this": git("rev-parse", "HEAD") + (" (uncommitted changes)" if git("status", "--porcelain") else ""),
        "that": git("rev-parse", "--verify", f"{args.against}^{{commit}}", check=True),
    }
    that_name = describe(args.against)
    work = Path(tempfile.mkdtemp(prefix="batchstream-versus-"))
    sides: list[Side] = []
    rounds: list[dict[str, Any]] = []
    tree: Path | None = None
    finished = False
    try:
        print(f"versus: checking out {that_name} ...", flush=True)
        tree = checkout(args.against, work)
        order = [("this", REPO_ROOT), ("that", tree)]
        for name, root in order if args.start_first == "this" else order[::-1]:
            print(f"versus: starting {name} side's stack ({root}) ...", flush=True)
            sides.append(Side(name, root, config, work / f"{name}.log"))
            sides[-1].wait_ready()
        if args.idle_side == "frozen":
            for side in sides:  # each side's first batch, too, follows a thaw and a warm-up
                side.freeze()
        for r in range(args.pairs):
            for side in sides if r % 2 == 0 else sides[::-1]:
                other = next(s for s in sides if s is not side)
                rounds.append(run_round(side, other, r + 1, args.idle_side == "frozen"))
                speed = rounds[-1]["tokens_per_s"]
                print(f"versus: round {r + 1}/{args.pairs}: {side.name} {speed:,.0f} tok/s", flush=True)
        finished = True
    finally:
        for side in sides:  # every stack thawed before any is stopped (each stop takes a while)
            if side.frozen:
                side.thaw()
        for side in sides:
            side.close()
        if tree is not None:
            remove(tree)
        if finished:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"versus: the sides' logs are kept in {work}", flush=True)
    settings = {k: v for k, v in config.items() if k != "env"} | {
        "env": args.env,
        "pairs": args.pairs,
        "idle_side": args.idle_side,
        "start_first": args.start_first,
    }
    return report(rounds, that_name, args) | {"versions": versions, "settings": settings}


def run_round(side: Side, idle: Side, number: int, freeze_idle: bool) -> dict[str, Any]:
    """One batch on ``side`` (the other side frozen, or left idle), and the CPU the other side's
    stack used meanwhile (0 when frozen)."""
    if side.frozen:
        side.thaw()
        side.warm_up()
    if freeze_idle and not idle.frozen:
        idle.freeze()
    idle_before = idle.cpu_s()
    result = side.run()
    return result | {"round": number, "side": side.name, "idle_side_cpu_s": idle.cpu_s() - idle_before}


PHASES = {  # name: the span of a batch it covers, from its round's result
    "create to first result": lambda x: x["to_first_result_s"],
    "first to last result": lambda x: x["to_last_result_s"] - x["to_first_result_s"],
    "last result to completed": lambda x: x["timed_s"] - x["to_last_result_s"],
    "create to completed": lambda x: x["timed_s"],
}


def phase_differences(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Per phase, the median over rounds of this side's span minus the other's in the same round:
    which part of a batch a difference in throughput comes from."""
    mine = [x for x in rounds if x["side"] == "this"]
    theirs = [x for x in rounds if x["side"] == "that"]
    return {
        name: median(span(a) - span(b) for a, b in zip(mine, theirs, strict=True))
        for name, span in PHASES.items()
    }


def report(rounds: list[dict[str, Any]], that_name: str, args: Any) -> dict[str, Any]:
    worker = next(k for k in rounds[0]["cpu_s"] if k.startswith("inference"))
    for x in rounds:
        x["worker_cpu_s"] = x["cpu_s"][worker]
        x["rest_cpu_s"] = sum(v for k, v in x["cpu_s"].items() if k != worker)

    def of(side: str, key: str) -> list[float]:
        return [x[key] for x in rounds if x["side"] == side]

    pairs = [t / o for t, o in zip(of("this", "tokens_per_s"), of("that", "tokens_per_s"), strict=True)]
    logs = [math.log(p) for p in pairs]
    mean = math.exp(statistics.fmean(logs))
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    low, high = mean * math.exp(-half), mean * math.exp(half)
    phases = phase_differences(rounds)
    summary = {
        "against": that_name,
        "this_tokens_per_s": median(of("this", "tokens_per_s")),
        "that_tokens_per_s": median(of("that", "tokens_per_s")),
        "pair_ratios": pairs,
        "ratio_median": median(pairs),
        "ratio_geomean": mean,
        "ratio_geomean_95": [low, high],
        **{f"{side}_{key}": median(of(side, key)) for side in ("this", "that") for key in CPU_KEYS},
        "same_texts": len({x["texts_sha256"] for x in rounds}) == 1,
        "phases_this_minus_that_s": phases,
    }
    print()
    print(
        table(
            f"Versus {that_name}: {args.parity_requests} chat requests x {args.max_tokens} tokens, "
            f"max_num_seqs={args.max_num_seqs}, the other side {args.idle_side}, rounds ABBA",
            [
                "round",
                "side",
                "timed s",
                "tok/s",
                "to first result s",
                "to last result s",
                "worker CPU s",
                "rest CPU s",
                "idle side CPU s",
            ],
            [
                [
                    x["round"],
                    x["side"],
                    x["timed_s"],
                    x["tokens_per_s"],
                    x["to_first_result_s"],
                    x["to_last_result_s"],
                    x["worker_cpu_s"],
                    x["rest_cpu_s"],
                    x["idle_side_cpu_s"],
                ]
                for x in rounds
            ],
        )
    )
    that = that_name.split()[0]
    print(
        f"median tok/s: this tree {summary['this_tokens_per_s']:,.0f}, {that} "
        f"{summary['that_tokens_per_s']:,.0f}. Per-round ratio this/that over {len(pairs)} rounds: "
        f"geometric mean {mean:.3f} (95% interval {low:.3f}-{high:.3f}), median "
        f"{summary['ratio_median']:.3f}, range {min(pairs):.3f}-{max(pairs):.3f}. CPU s per batch "
        f"(median), this / {that}: worker (engine included) {summary['this_worker_cpu_s']:.1f} / "
        f"{summary['that_worker_cpu_s']:.1f}, the rest of the stack {summary['this_rest_cpu_s']:.1f} / "
        f"{summary['that_rest_cpu_s']:.1f}, the other side's idle stack beside its batches "
        f"{summary['this_idle_side_cpu_s']:.1f} / {summary['that_idle_side_cpu_s']:.1f}. "
        f"Same texts on both: {summary['same_texts']}."
    )
    print(
        "Where the time goes, this minus that per round (median s): "
        + ", ".join(f"{name} {value:+.3f}" for name, value in phases.items())
    )
    return {"rounds": rounds, "summary": summary}
