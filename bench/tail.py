"""The tail: a file of mixed lengths in file order, sorted longest-first by hand, and through
batchstream (``python -m bench --only tail [--engine sim|vllm] [--input FILE]``).

The file (without ``--input``): ``--tail-lines`` chat lines, most short (``--tail-short-tokens``),
``--tail-long-lines`` long (``--tail-long-tokens``; 0: a tenth), half of the long ones spread
evenly through the file and half in its last twentieth; each line's length is held by
``min_tokens`` = ``max_tokens``. With
``--input``, any chat-completions JSONL file as given (``body.model`` replaced).

Three sides on one engine:
- **file order**: the file as ``vllm run-batch`` runs it, every line queued at once in the file's
  order (on ``--engine sim``, the file straight on the simulated GPU, in simulated time; on
  ``--engine vllm``, ``vllm run-batch`` itself on ``--model-dir``);
- **sorted by hand**: the same, its lines sorted longest first (by ``max_tokens``): the
  yardstick of what order alone is worth on this engine;
- **batchstream**: the file as a batch on a stack whose worker runs the same engine (the sim
  engine at ``--sim-speedup``: its wall seconds times the speed-up are simulated seconds).

Every time of a side is in its engine's seconds (simulated on ``sim``, wall on ``vllm``). Figures
per side: the time from the first line queued (the engine ready; for batchstream, its create
call) to the last line done, and the tail (from 90% of the lines done to the last). Lines done per
side: the simulated finish times; run-batch's progress bar (refreshed every 5 s at most: its
responses' ``created`` is a line's start, in whole seconds); batchstream's live
``request_counts``, polled. For batchstream also the ETA's error when 25%, 50% and 75% of the
lines were done: the batch's ``estimated_completion_at`` as the api answers it then, minus the
actual end, over the time then left (the api's whole seconds count ``--sim-speedup`` times over
on ``sim``). With ``--tail-beside-lines N``, another
batch of N short lines is created just before batchstream's, so the two share the engine (the
ETA beside a second batch; it is cancelled if it outlasts the measured one). Printed last:
``tail: X.XXx file order`` (file order's time over batchstream's) and ``sorted by hand: Y.YYx file
order``.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

from bench.common import create_batch, new_stack, start_stack, table
from bench.parity import READY_MARKER, run_batch_once
from bench.simulated import SIM_PROFILE, run_file, sim_env
from deploy.local import ModelSpec, Stack

SERVED_NAME = "tail-model"
QUARTERS = (0.25, 0.5, 0.75)


def tail_lines(lines: int, short: int, long: int, seed: int = 7, longs: int = 0) -> list[str]:
    """Most lines short, ``longs`` long (0: a tenth): half of the long ones spread through, half
    at the end."""
    rng = random.Random(seed)
    longs = longs or max(1, lines // 10)
    spread = longs // 2
    at_end = longs - spread
    places = {round((i + 0.5) * (lines - lines // 20) / max(1, spread)) for i in range(spread)}
    places |= set(range(lines - at_end, lines))
    out = []
    for n in range(lines):
        tokens = long if n in places else short
        content = f"Line {n}: write about " + " ".join(
            rng.choice("river stone lamp clock".split()) for _ in range(8)
        )
        body = {
            "model": SERVED_NAME,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": tokens,
            "min_tokens": tokens,
            "temperature": 0.0,
        }
        out.append(
            json.dumps(
                {"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            )
        )
    return out


def given_lines(path: str) -> list[str]:
    out = []
    for raw in Path(path).read_text().splitlines():
        if raw.strip():
            line = json.loads(raw)
            line["body"]["model"] = SERVED_NAME
            out.append(json.dumps(line))
    return out


def longest_first(lines: list[str]) -> list[str]:
    def length(raw: str) -> int:
        body = json.loads(raw)["body"]
        return int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)

    return sorted(lines, key=length, reverse=True)  # stable: equal lengths keep the file's order


def figures(done_at: list[float]) -> dict[str, float]:
    """From each line's finish time (seconds from the start): the end and the tail."""
    times = sorted(done_at)
    at90 = times[max(0, -(-len(times) * 9 // 10) - 1)]
    return {"end_s": times[-1], "tail_s": times[-1] - at90}


# ----------------------------------------------------------------------------------- the sides


def sim_side(lines: list[str], args: Any) -> dict[str, float]:
    return figures(run_file(lines, args.sim_max_num_seqs, args.sim_max_model_len))


PROGRESS = re.compile(r"Running batch:.*\|\s*(\d+)/(\d+)")
"""run-batch's progress bar (tqdm, refreshed at most every 5 s): lines done of the file."""


def done_times(samples: list[tuple[float, int]], start: float) -> list[float]:
    """Each line's finish time (seconds from ``start``) from samples of (when, lines done so far):
    the lines that a sample adds are taken as done when it was seen."""
    out: list[float] = []
    before = 0
    for at, done in samples:
        out += [at - start] * max(0, done - before)
        before = max(before, done)
    return out


def vllm_side(lines: list[str], args: Any, work: Path) -> dict[str, float]:
    """The file through ``vllm run-batch``, in wall seconds from its engine being ready (the lines
    queued) to each line done, as its progress bar counts them (its responses' ``created`` is a
    line's start, in whole seconds, not its end)."""
    path = work / f"in-{time.time_ns()}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    args.served_name = SERVED_NAME
    ready: list[float] = []
    samples: list[tuple[float, int]] = []

    def seen(line: str) -> None:
        now = time.time()
        if READY_MARKER in line and not ready:
            ready.append(now)
        if found := PROGRESS.search(line):
            samples.append((now, int(found.group(1))))

    run_batch_once(args.inference_python, args.model_dir, path, work, args, {}, on_output=seen)
    return figures(done_times(samples, ready[0]))


class CountsWatch:
    """Polls the batch document every ``interval_s`` in a thread for its live counts; when a
    share of the lines is done, reads the batch from the api as a client would and keeps its
    ``estimated_completion_at`` (wall seconds, as the api answers it)."""

    def __init__(
        self, stack: Stack, client: OpenAI, batch_id: str, total: int, interval_s: float = 0.1
    ) -> None:
        from pymongo import MongoClient

        env = stack.env()
        self._client: MongoClient[dict[str, Any]] = MongoClient(env["BATCHSTREAM_MONGO_URI"])
        self._batches = self._client[env["BATCHSTREAM_MONGO_DATABASE"]]["batches"]
        self._api = client
        self.batch_id, self.total, self.interval_s = batch_id, total, interval_s
        self.counts: list[tuple[float, int]] = []
        self.estimates: dict[float, tuple[float, float | None]] = {}  # share -> (seen at, estimated end)
        self.ended: float | None = None
        self.running: float | None = None  # when it was first seen in progress (validated)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self.ended is None:
            doc = self._batches.find_one({"_id": self.batch_id}) or {}
            now = time.time()
            counts = doc.get("request_counts") or {}
            done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
            if not self.counts or self.counts[-1][1] != done:
                self.counts.append((now, done))
            for share in QUARTERS:
                if share not in self.estimates and done >= share * self.total:
                    batch = self._api.batches.retrieve(self.batch_id)
                    self.estimates[share] = (now, (batch.model_extra or {}).get("estimated_completion_at"))
            if self.running is None and doc.get("status") == "in_progress":
                self.running = now
            if doc.get("status") in ("completed", "failed", "expired", "cancelled"):
                self.ended = now
                break
            time.sleep(self.interval_s)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        self._client.close()


def upload(client: OpenAI, lines: list[str], name: str) -> str:
    return client.files.create(file=(name, ("\n".join(lines) + "\n").encode()), purpose="batch").id


def eta_error(estimated_s: float | None, end_s: float, seen_s: float) -> float | None:
    """The ETA's error: the estimated end minus the actual end, over the time left when the
    estimate was read (all three in one time base)."""
    left = end_s - seen_s
    return None if estimated_s is None or left <= 0 else (estimated_s - end_s) / left


def batchstream_side(
    client: OpenAI, stack: Stack, lines: list[str], scale: float, beside: list[str] | None = None
) -> dict[str, Any]:
    """The batch's figures in the engine's seconds from its create call: wall seconds times
    ``scale`` (simulated seconds per wall second; 1 on a real engine), the line counts' and the
    ETA's wall times alike; with ``beside``, another batch of those lines created just before it
    shares the engine (and is cancelled once the measured batch ends)."""
    other = create_batch(client, upload(client, beside, "beside.jsonl"))[0] if beside else None
    file_id = upload(client, lines, "tail.jsonl")
    batch_id, created_at = create_batch(client, file_id)
    watch = CountsWatch(stack, client, batch_id, len(lines))
    watch.join(timeout_s=7200)
    if other is not None and client.batches.retrieve(other).status in ("validating", "in_progress"):
        client.batches.cancel(other)
    if watch.ended is None:
        raise RuntimeError(f"batch {batch_id} did not end")
    done_at: list[float] = []
    for (at, done), (_, before) in zip(watch.counts[1:], watch.counts, strict=False):
        done_at += [(at - created_at) * scale] * (done - before)
    found = figures(done_at)
    if watch.running is not None:
        found["validated_s"] = (watch.running - created_at) * scale
    errors = {}
    for share, (seen, estimate) in sorted(watch.estimates.items()):
        estimated_s = None if estimate is None else (estimate - created_at) * scale
        errors[f"eta_error_{round(share * 100)}"] = eta_error(
            estimated_s, found["end_s"], (seen - created_at) * scale
        )
    return found | errors


def warm_up(client: OpenAI) -> None:
    """An untimed one-line batch, so the timed one starts with the worker warm in its group."""
    line = json.dumps(
        {
            "custom_id": "warm-up",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1},
        }
    )
    batch_id, _ = create_batch(client, upload(client, [line], "warm-up.jsonl"))
    deadline = time.monotonic() + 600
    while (
        client.batches.retrieve(batch_id).status not in ("completed", "failed")
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------- run


def run(args: Any) -> dict[str, Any]:
    lines = (
        given_lines(args.input)
        if args.input
        else tail_lines(
            args.tail_lines, args.tail_short_tokens, args.tail_long_tokens, longs=args.tail_long_lines
        )
    )
    sorted_lines = longest_first(lines)
    work = Path(tempfile.mkdtemp(prefix="batchstream-tail-"))
    if args.engine == "sim":
        engine = f"simulated GPU ({SIM_PROFILE.name}), {args.sim_max_num_seqs} sequences"
        spec, env, scale = ModelSpec("", SERVED_NAME, engine="sim"), sim_env(args), args.sim_speedup
        file_order, by_hand = sim_side(lines, args), sim_side(sorted_lines, args)
    else:
        engine = f"vLLM {Path(args.model_dir).name}, {args.max_num_seqs} sequences"
        spec, scale = ModelSpec(args.model_dir, SERVED_NAME), 1.0
        env = {"BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(args.max_num_seqs)}
        env["BATCHSTREAM_INFERENCE_MAX_MODEL_LEN"] = str(args.max_model_len)
        file_order, by_hand = vllm_side(lines, args, work), vllm_side(sorted_lines, args, work)
    if args.tail_beside_lines:
        engine += f"; batchstream's batch beside another of {args.tail_beside_lines} short lines"
    print(f"\ntail: {len(lines)} lines on the {engine}", flush=True)
    stack = new_stack([spec], inference_python=args.inference_python, **env, **args.env)
    try:
        start_stack(stack)
        client = OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5, timeout=600)
        warm_up(client)
        beside = tail_lines(args.tail_beside_lines, args.tail_short_tokens, args.tail_short_tokens, seed=11)
        ours = batchstream_side(client, stack, lines, scale, beside if args.tail_beside_lines else None)
    finally:
        stack.stop()
    sides = {"file order": file_order, "sorted by hand": by_hand, "batchstream": ours}
    unit = "simulated s" if args.engine == "sim" else "s"
    print(
        table(
            "the tail file on one engine",
            ["side", f"end ({unit})", f"tail ({unit})", "ETA error 25% / 50% / 75%"],
            [
                [
                    name,
                    f"{side['end_s']:.2f}",
                    f"{side['tail_s']:.2f}",
                    " / ".join(
                        "-" if side.get(f"eta_error_{q}") is None else f"{side[f'eta_error_{q}']:+.0%}"
                        for q in (25, 50, 75)
                    )
                    if name == "batchstream"
                    else "",
                ]
                for name, side in sides.items()
            ],
        )
    )
    ratio = file_order["end_s"] / ours["end_s"]
    by_hand_ratio = file_order["end_s"] / by_hand["end_s"]
    if "validated_s" in ours:
        print(f"batchstream's batch in progress {ours['validated_s']:.2f} {unit} after its create call")
    print(f"tail: {ratio:.2f}x file order")
    print(f"sorted by hand: {by_hand_ratio:.2f}x file order")
    return {
        "engine": engine,
        "lines": len(lines),
        "sides": sides,
        "tail_vs_file_order": ratio,
        "sorted_by_hand_vs_file_order": by_hand_ratio,
    }
