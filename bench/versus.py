"""Versus: the parity batch through this tree's stack and through an older commit's, in turns.

Answers "did this change cost throughput?", which the parity ratio cannot settle on a shared
machine: there, ``vllm run-batch`` itself varies by 10-25% from one round to the next, more than
the 3% to be shown. Here both stacks (each with its own vLLM worker, started before the rounds)
run at once, so each round's batch has the other stack idle beside it, alike; the rounds go
ABBA (this, that, that, this, ...), and the figure is the median of the per-pair ratios
(this tree's tokens/s over the other's, the two batches of one round back to back), with their
spread. No run-batch and no engine start-up per round, so a round takes ~2 x 25 s and many fit.

The other commit is checked out in a temporary git worktree that shares this tree's ``.venv``,
``.venv-inference`` and ``.cache``; each side's stack runs from its own tree, driven by a child
process (``_SIDE``) that uses that tree's own bench helpers, so the older code is run as it was.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from bench.common import median, table
from deploy.local import REPO_ROOT

CPU_KEYS = ("worker_cpu_s", "rest_cpu_s")
SHARED = (".venv", ".venv-inference", ".cache")  # linked into the other tree, not rebuilt

# One side's driver, run with ``python -c`` in its tree (its cwd first on sys.path): it starts
# that tree's stack, then runs the parity batch once per "run" line on stdin and answers one JSON
# line per batch on its own stdout channel (everything else the tree prints goes to stderr).
_SIDE = r"""
import hashlib, json, os, shutil, sys, tempfile
from pathlib import Path
answer = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
cfg = json.loads(sys.argv[1])
os.environ["VLLM_CPU_KVCACHE_SPACE"] = cfg["kv_cache_gib"]
from openai import OpenAI
from bench.common import MongoPoller, ResultsTap, new_stack, start_stack
from bench.parity import SERVED_NAME, ModelSpec, batchstream_once, build_input  # as that tree has them
work = Path(tempfile.mkdtemp(prefix="batchstream-versus-"))
path = work / "in.jsonl"
build_input(path, cfg["requests"], cfg["max_tokens"])
stack = new_stack([ModelSpec(cfg["model_dir"], SERVED_NAME)], inference_python=cfg["inference_python"],
                  **cfg["env"])
try:
    start_stack(stack)
    client = OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5, timeout=600)
    poller, tap = MongoPoller(stack), ResultsTap(stack)
    try:
        answer.write(json.dumps({"ready": True}) + "\n")
        for command in sys.stdin:
            if command.strip() != "run":
                break
            result = batchstream_once(client, poller, tap, path, stack.pids())
            texts = result.pop("_texts")
            digest = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()[:12]
            answer.write(json.dumps({**result, "texts_sha256": digest}) + "\n")
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
        self._stderr = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SIDE, json.dumps(config)],
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._read()  # {"ready": true}, once its stack is up

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """Ends the child, which stops its stack (by its ``finally``); waits for it."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=60)
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


def checkout(rev: str, into: Path) -> Path:
    """A detached worktree of ``rev`` sharing this tree's environments."""
    tree = into / "tree"
    subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(tree), rev], check=True)
    for name in SHARED:
        (tree / name).symlink_to(REPO_ROOT / name)
    return tree


def remove(tree: Path) -> None:
    subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def describe(rev: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%h %s", rev], capture_output=True, text=True
    )
    return out.stdout.strip()[:72] or rev


def run(args: Any) -> dict[str, Any]:
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
    work = Path(tempfile.mkdtemp(prefix="batchstream-versus-"))
    that_name = describe(args.against)
    print(f"versus: checking out {that_name} ...", flush=True)
    tree = checkout(args.against, work)
    sides: list[Side] = []
    rounds: list[dict[str, Any]] = []
    try:
        for name, root in (("this", REPO_ROOT), ("that", tree)):
            print(f"versus: starting {name} side's stack ({root}) ...", flush=True)
            sides.append(Side(name, root, config, work / f"{name}.log"))
        for r in range(args.pairs):
            for side in sides if r % 2 == 0 else sides[::-1]:
                result = side.run() | {"round": r + 1, "side": side.name}
                print(
                    f"versus: round {r + 1}/{args.pairs}: {side.name} {result['tokens_per_s']:,.0f} tok/s",
                    flush=True,
                )
                rounds.append(result)
    finally:
        for side in sides:
            side.close()
        remove(tree)
        shutil.rmtree(work, ignore_errors=True)
    return report(rounds, that_name, args)


def report(rounds: list[dict[str, Any]], that_name: str, args: Any) -> dict[str, Any]:
    worker = next(k for k in rounds[0]["cpu_s"] if k.startswith("inference"))
    for x in rounds:
        x["worker_cpu_s"] = x["cpu_s"][worker]
        x["rest_cpu_s"] = sum(v for k, v in x["cpu_s"].items() if k != worker)

    def of(side: str, key: str) -> list[float]:
        return [x[key] for x in rounds if x["side"] == side]

    pairs = [t / o for t, o in zip(of("this", "tokens_per_s"), of("that", "tokens_per_s"), strict=True)]
    mean = statistics.fmean(pairs)
    half = 1.96 * statistics.stdev(pairs) / math.sqrt(len(pairs)) if len(pairs) > 1 else math.inf
    summary = {
        "against": that_name,
        "this_tokens_per_s": median(of("this", "tokens_per_s")),
        "that_tokens_per_s": median(of("that", "tokens_per_s")),
        "pair_ratios": pairs,
        "ratio_median": median(pairs),
        "ratio_mean": mean,
        "ratio_mean_95": [mean - half, mean + half],
        **{f"{side}_{key}": median(of(side, key)) for side in ("this", "that") for key in CPU_KEYS},
        "same_texts": len({x["texts_sha256"] for x in rounds}) == 1,
    }
    print()
    print(
        table(
            f"Versus {that_name}: {args.parity_requests} chat requests x {args.max_tokens} tokens, "
            f"max_num_seqs={args.max_num_seqs}, both stacks up, rounds ABBA",
            ["round", "side", "timed s", "tok/s", "to first result s", "worker CPU s", "rest CPU s"],
            [
                [
                    x["round"],
                    x["side"],
                    x["timed_s"],
                    x["tokens_per_s"],
                    x["to_first_result_s"],
                    x["worker_cpu_s"],
                    x["rest_cpu_s"],
                ]
                for x in rounds
            ],
        )
    )
    that = that_name.split()[0]
    print(
        f"median tok/s: this tree {summary['this_tokens_per_s']:,.0f}, {that} "
        f"{summary['that_tokens_per_s']:,.0f}. Per-round ratio this/that over {len(pairs)} rounds: "
        f"median {summary['ratio_median']:.3f}, mean {mean:.3f} (95% interval {mean - half:.3f}-"
        f"{mean + half:.3f}), range {min(pairs):.3f}-{max(pairs):.3f}. CPU s per batch (median), "
        f"this / {that}: worker (engine included) {summary['this_worker_cpu_s']:.1f} / "
        f"{summary['that_worker_cpu_s']:.1f}, the rest of the stack {summary['this_rest_cpu_s']:.1f} / "
        f"{summary['that_rest_cpu_s']:.1f}. Same texts on both: {summary['same_texts']}."
    )
    return {"rounds": rounds, "summary": summary}
