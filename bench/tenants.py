"""Tenants: a project flooding the service beside a well-behaved one (``python -m bench --only
tenants``).

One stack with two projects' keys (``good`` and ``flood``), then two measurements:

1. **The fair share.** The good project's batch (``--tenants-good-lines``) alone on the idle
   stack (the median of ``--tenants-alone-runs``, after an untimed warm-up batch), then the same
   batch beside a flood the other project started first: ``--tenants-flood-batches`` small
   batches, ``--tenants-priority-batches`` large ones created with ``"priority": 100``, a file
   with one ``--tenants-huge-line-mb`` line among short ones and a file ending in a line of
   ``--tenants-over-line-mb`` (over any line limit set below the broker's message limit), all
   created before the good batch and still running when it ends. Each batch is timed from its
   create call to the first poll (every 0.1 s) that sees it ``completed``. Target: beside the
   flood within 2x alone, the fair share of two projects. Also printed: the good project's share
   of the lines finished while both ran (from the batches' live ``request_counts``), and every
   flood create's answer; a refusal (413, 429, a batch ``failed``) is counted, not an error.
2. **The api stays responsive under a giant line.** ``GET /health`` polled every
   ``--tenants-health-interval-ms`` from a thread of its own while the flood project uploads a
   ``--tenants-giant-mb`` file of one line with no newline and creates a batch of it, until the
   batch leaves ``validating`` (or the upload is refused). Targets: /health p99 < 250 ms and the
   api's peak RSS (its process tree, sampled every 0.1 s) < 300 MiB. The same poll on the idle
   stack is printed beside it.

The engine is the fake one, **paced**, with places: each line takes ``--tenants-line-seconds``
and at most ``--tenants-places`` run at once (``BATCHSTREAM_INFERENCE_FAKE_MAX_RUNNING``, as
vLLM's ``max_num_seqs``), so the model serves a fixed number of lines per second whatever else the
cores do, as a GPU would. That capacity is what the two projects share. As with vLLM, the worker
holds sixteen times as many lines as the engine has places, and gives each freed place to the
project, then the batch, with the fewest lines on the engine (``services/inference/engine_places.py``):
the lines the dispatcher keeps ahead in the topic wait in the worker, where a new batch's go
first. The instant engine has no capacity to share (its batches are bound by the plumbing's CPU,
which fairness does not apportion); the tiny vLLM model (``--tenants-engine vllm``) on this CPU
shares both cores with the flood's uploads and validation, so its ratio would mostly measure that;
``--tenants-engine sim`` runs the simulated GPU (``--sim-*``: ratios only, docs/benchmarks.md).

Only the public HTTP API is used (httpx), so the benchmark runs on any version of the api.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import TERMINAL, ProcessSampler, chat_line, new_stack, percentile, start_stack, table
from bench.simulated import SIM_PROFILE, sim_env
from deploy.local import ModelSpec, Stack

CHAT = "/v1/chat/completions"
FAKE_MODEL = "fake-model"
VLLM_MODEL = "tiny-llama"
SIM_MODEL = "sim-model"
KEYS = {"good": "sk-tenants-good", "flood": "sk-tenants-flood"}
LINE_MAX_TOKENS = 16  # the paced engine takes seconds_per_token x max_tokens per line
FLOOD_PRIORITY = 100
HUGE_KINDS = ("huge line", "over the line limit")
RATIO_TARGET = 2.0  # beside the flood within 2x alone: two projects' fair share
HEALTH_P99_TARGET_S = 0.25
API_RSS_TARGET_MIB = 300.0
POLL_S = 0.1
MB = 1_000_000
WORD = "word "  # a prompt of words: any engine counts it as many tokens (over the context)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


# ------------------------------------------------------------------------------------- files


def write_lines(path: Path, lines: int, model: str, prefix: str) -> Path:
    with path.open("w") as out:
        for i in range(lines):
            out.write(
                chat_line(f"{prefix}-{i}", model, f"Say hello to {prefix} {i}.", max_tokens=LINE_MAX_TOKENS)
                + "\n"
            )
    return path


def write_long_line(out: Any, size: int, model: str, custom_id: str) -> None:
    """One chat request line of exactly ``size`` bytes (no newline): its prompt is words."""
    head, tail = chat_line(custom_id, model, "\0", max_tokens=LINE_MAX_TOKENS).encode().split(b"\\u0000")
    pad = size - len(head) - len(tail)
    if pad < 0:
        raise ValueError(f"a line of {size} bytes cannot hold a request")
    out.write(head)
    chunk = (WORD * (2**20 // len(WORD))).encode()
    while pad >= len(chunk):
        out.write(chunk)
        pad -= len(chunk)
    out.write(chunk[:pad])
    out.write(tail)


def write_huge_line_file(path: Path, line_bytes: int, short_lines: int, model: str, last: bool) -> Path:
    """Short lines and one of ``line_bytes``: in the middle, or ``last`` with no newline after it."""
    with path.open("wb") as out:
        for i in range(short_lines):
            if i == short_lines // 2 and not last:
                write_long_line(out, line_bytes, model, "huge")
                out.write(b"\n")
            out.write(
                chat_line(f"short-{i}", model, f"Say hello {i}.", max_tokens=LINE_MAX_TOKENS).encode() + b"\n"
            )
        if last:
            write_long_line(out, line_bytes, model, "huge")
    return path


# ------------------------------------------------------------------------------------ client


@dataclass
class Answer:
    """One HTTP answer: its status and JSON body (``{}`` when it has none)."""

    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def code(self) -> str:
        """The error's ``code`` (or its status) for a refusal, ``ok`` otherwise."""
        if self.ok:
            return "ok"
        error = self.body.get("error") or {}
        return f"{self.status} {error.get('code') or error.get('type') or ''}".strip()


class Tenant:
    """One project's HTTP client for the public Files and Batches API (no retries: a refusal is
    a figure here)."""

    def __init__(self, base_url: str, project: str, key: str) -> None:
        self.project = project
        self.http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=httpx.Timeout(600.0)
        )

    def close(self) -> None:
        self.http.close()

    def _answer(self, response: httpx.Response) -> Answer:
        try:
            body = response.json()
        except ValueError:
            body = {}
        return Answer(response.status_code, body if isinstance(body, dict) else {})

    def upload(self, path: Path) -> Answer:
        """Streams the file (httpx reads it in chunks), as multipart ``purpose=batch``. A server
        that refuses it before the end may close the connection: that is status 0 here."""
        with path.open("rb") as fh:
            files = {"file": (path.name, fh, "application/jsonl")}
            try:
                response = self.http.post("/files", files=files, data={"purpose": "batch"})
            except httpx.TransportError as exc:
                return Answer(0, {"error": {"code": type(exc).__name__}})
            return self._answer(response)

    def create(self, file_id: str, tag: str, **extra: Any) -> Answer:
        body = {
            "input_file_id": file_id,
            "endpoint": CHAT,
            "completion_window": "24h",
            "metadata": {"tag": tag},  # a distinct body: identical creates within a minute are one
            **extra,
        }
        return self._answer(self.http.post("/batches", json=body))

    def get(self, batch_id: str) -> Answer:
        return self._answer(self.http.get(f"/batches/{batch_id}"))

    def cancel(self, batch_id: str) -> Answer:
        return self._answer(self.http.post(f"/batches/{batch_id}/cancel"))

    def batches(self) -> dict[str, dict[str, Any]]:
        """Every batch of the project, by id (the list, page by page)."""
        found: dict[str, dict[str, Any]] = {}
        params: dict[str, Any] = {"limit": 100}
        while True:
            page = self._answer(self.http.get("/batches", params=params))
            if not page.ok:
                return found
            for batch in page.body.get("data", []):
                found[batch["id"]] = batch
            if not page.body.get("has_more") or not page.body.get("data"):
                return found
            params["after"] = page.body["data"][-1]["id"]

    def wait(
        self, batch_id: str, timeout_s: float, until: Iterable[str] = TERMINAL
    ) -> tuple[dict[str, Any], float]:
        """Poll the batch every 0.1 s until its status is one of ``until``: the batch and the
        time (``time.time()``) of the poll that saw it; the last batch seen after ``timeout_s``."""
        wanted = set(until)
        deadline = time.monotonic() + timeout_s
        batch: dict[str, Any] = {}
        while True:
            answer = self.get(batch_id)
            seen = time.time()
            if answer.ok:
                batch = answer.body
                if batch.get("status") in wanted:
                    return batch, seen
            if time.monotonic() > deadline:
                return batch, float("nan")
            time.sleep(POLL_S)


def finished(batch: dict[str, Any]) -> int:
    counts = batch.get("request_counts") or {}
    return int(counts.get("completed") or 0) + int(counts.get("failed") or 0)


def pending(batches: dict[str, dict[str, Any]]) -> int:
    """Lines of the running batches without a result yet."""
    return sum(
        max(0, int((b.get("request_counts") or {}).get("total") or 0) - finished(b))
        for b in batches.values()
        if b.get("status") not in TERMINAL
    )


# ------------------------------------------------------------------------------------ health


@dataclass
class HealthProbe:
    """``GET /health`` every ``interval_s`` (or at once after a slower answer) in a thread with
    its own connection: each poll's start time, latency and status."""

    url: str
    interval_s: float
    polls: list[tuple[float, float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=60.0) as http:
            while not self._stop.is_set():
                sent, started = time.time(), time.perf_counter()
                try:
                    status = http.get(self.url).status_code
                except httpx.HTTPError:
                    status = 0
                took = time.perf_counter() - started
                self.polls.append((sent, took, status))
                self._stop.wait(max(0.0, self.interval_s - took))

    def window(self, start: float, end: float) -> dict[str, Any]:
        """The polls sent between ``start`` and ``end`` (``time.time()``)."""
        inside = [(took, status) for sent, took, status in list(self.polls) if start <= sent <= end]
        latencies = [took for took, _ in inside]
        return {
            "polls": len(inside),
            "not_200": sum(1 for _, status in inside if status != 200),
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
            "max_s": max(latencies, default=float("nan")),
        }


# ----------------------------------------------------------------------------- measurements


def good_batch(good: Tenant, file_id: str, tag: str, timeout_s: float) -> dict[str, Any]:
    """One good batch, create to the poll that sees it terminal."""
    created = time.time()
    answer = good.create(file_id, tag)
    if not answer.ok:
        return {"tag": tag, "refused": answer.code, "status": "refused", "seconds": float("nan")}
    batch, seen = good.wait(answer.body["id"], timeout_s)
    took = seen - created if batch.get("status") == "completed" else float("nan")
    return {
        "tag": tag,
        "id": answer.body["id"],
        "status": batch.get("status"),
        "seconds": took,
        "created_at": created,
        "done_at": seen,
        "lines": finished(batch),
    }


@dataclass
class FloodPart:
    """One kind of the flood's batches: its input file and how many batches of it."""

    kind: str
    path: Path
    batches: int
    extra: dict[str, Any] = field(default_factory=dict)


def start_flood(flood: Tenant, parts: list[FloodPart]) -> dict[str, Any]:
    """Upload each part's file, then create its batches (four at once); every answer counted."""
    report: dict[str, Any] = {}
    jobs: list[tuple[str, str, str, dict[str, Any]]] = []
    for part in parts:
        upload = flood.upload(part.path)
        report[part.kind] = {
            "file_mb": part.path.stat().st_size / MB,
            "upload": upload.code,
            "creates": {},
            "ids": [],
        }
        if upload.ok:
            jobs += [
                (part.kind, upload.body["id"], f"{part.kind}-{n}", part.extra) for n in range(part.batches)
            ]

    def create(job: tuple[str, str, str, dict[str, Any]]) -> tuple[str, Answer]:
        kind, file_id, tag, extra = job
        return kind, flood.create(file_id, tag, **extra)

    with ThreadPoolExecutor(4) as pool:
        for kind, answer in pool.map(create, jobs):
            creates = report[kind]["creates"]
            creates[answer.code] = creates.get(answer.code, 0) + 1
            if answer.ok:
                report[kind]["ids"].append(answer.body["id"])
    return report


def fair_share(
    args: Any, good: Tenant, flood: Tenant, probe: HealthProbe, work: Path, model: str
) -> dict[str, Any]:
    good_path = write_lines(work / "good.jsonl", args.tenants_good_lines, model, "good")
    warm = good.upload(write_lines(work / "warm.jsonl", 10, model, "warm"))
    uploaded = good.upload(good_path)
    if not (warm.ok and uploaded.ok):
        raise SystemExit(f"tenants: the good project's upload was refused: {warm.code}, {uploaded.code}")
    good_file = uploaded.body["id"]
    print("tenants: the good batch alone ...", flush=True)
    good_batch(good, warm.body["id"], "warm-up", args.tenants_timeout_s)
    alone = [
        good_batch(good, good_file, f"alone-{n}", args.tenants_timeout_s)
        for n in range(args.tenants_alone_runs)
    ]

    parts = [
        FloodPart(
            "priority 100",
            write_lines(work / "prio.jsonl", args.tenants_priority_lines, model, "prio"),
            args.tenants_priority_batches,
            {"priority": FLOOD_PRIORITY},
        ),
        FloodPart(
            "small",
            write_lines(work / "small.jsonl", args.tenants_flood_lines, model, "small"),
            args.tenants_flood_batches,
        ),
        FloodPart(
            HUGE_KINDS[0],
            write_huge_line_file(
                work / "huge.jsonl", int(args.tenants_huge_line_mb * MB), 20, model, last=False
            ),
            1,
        ),
        FloodPart(
            HUGE_KINDS[1],
            write_huge_line_file(
                work / "over.jsonl", int(args.tenants_over_line_mb * MB), 20, model, last=True
            ),
            1,
        ),
    ]
    print(
        f"tenants: the flood: {args.tenants_priority_batches} x {args.tenants_priority_lines} lines at "
        f"priority {FLOOD_PRIORITY}, {args.tenants_flood_batches} x {args.tenants_flood_lines}, a "
        f"{args.tenants_huge_line_mb:g} MB line, a {args.tenants_over_line_mb:g} MB line ...",
        flush=True,
    )
    flood_started = time.time()
    created = start_flood(flood, parts)
    # The good batch goes in once the flood's lines run (or nothing of it runs: all refused).
    deadline = time.monotonic() + args.tenants_timeout_s
    while time.monotonic() < deadline:
        batches = flood.batches()
        if sum(map(finished, batches.values())) or all(b["status"] in TERMINAL for b in batches.values()):
            break
        time.sleep(POLL_S)
    before = flood.batches()
    flowing_after = time.time() - flood_started
    print("tenants: the good batch beside the flood ...", flush=True)
    beside = good_batch(good, good_file, "beside", args.tenants_timeout_s)
    after = flood.batches()
    flood_done = sum(finished(b) for b in after.values()) - sum(finished(b) for b in before.values())
    good_done = beside.get("lines", 0)
    share = good_done / (good_done + flood_done) if good_done + flood_done else float("nan")

    # The rest of the flood cancelled (part 2 runs on a quiet stack), then the huge lines' outcome.
    huge = {kind: created[kind]["ids"][0] for kind in HUGE_KINDS if created[kind]["ids"]}
    for batch_id, batch in flood.batches().items():
        if batch_id not in huge.values() and batch.get("status") in {"validating", "in_progress"}:
            flood.cancel(batch_id)
    outcomes = {kind: outcome(flood, batch_id, args.tenants_timeout_s) for kind, batch_id in huge.items()}
    for batch_id in flood.batches():
        flood.wait(batch_id, args.tenants_timeout_s)
    final = flood.batches()
    for report in created.values():
        report["final"] = dict(
            sorted(Counter(final[i].get("status", "?") for i in report.pop("ids") if i in final).items())
        )
    alone_s = statistics.median(x["seconds"] for x in alone) if alone else float("nan")
    ratio = beside["seconds"] / alone_s
    return {
        "good_lines": args.tenants_good_lines,
        "alone": alone,
        "alone_s": alone_s,
        "beside": beside,
        "ratio": ratio,
        "ratio_target": RATIO_TARGET,
        "ratio_met": ratio <= RATIO_TARGET,
        "good_share_while_both_ran": share,
        "flood_lines_finished_meanwhile": flood_done,
        "flood_lines_pending_when_good_done": pending(after),
        "flood_flowing_after_s": flowing_after,
        "health_during_flood": probe.window(flood_started, beside.get("done_at", time.time())),
        "flood": created,
        "huge_lines": outcomes,
    }


def error_name(error: dict[str, Any]) -> str:
    """An error line's code; an engine's body may carry its HTTP status there, then its type too."""
    code = error.get("code")
    if isinstance(code, str) and code:
        return code
    return " ".join(str(x) for x in (error.get("type"), code) if x)


def outcome(tenant: Tenant, batch_id: str, timeout_s: float) -> dict[str, Any]:
    """A batch's end: its status, the codes of its ``errors`` (validation) and of its error file's
    lines (run time), and its counts."""
    batch, _ = tenant.wait(batch_id, timeout_s)
    codes = [e.get("code") for e in ((batch.get("errors") or {}).get("data") or [])]
    if batch.get("error_file_id"):
        with tenant.http.stream("GET", f"/files/{batch['error_file_id']}/content") as response:
            for line in response.iter_lines():
                if line.strip():
                    result = json.loads(line)
                    error = result.get("error") or ((result.get("response") or {}).get("body") or {}).get(
                        "error"
                    )
                    codes.append(error_name(error or {}))
    return {
        "status": batch.get("status"),
        "request_counts": batch.get("request_counts"),
        "error_codes": sorted(set(filter(None, codes))),
    }


def giant_line(
    args: Any, stack: Stack, flood: Tenant, probe: HealthProbe, work: Path, model: str
) -> dict[str, Any]:
    """The giant one-line file uploaded and validated while /health is polled."""
    size = int(args.tenants_giant_mb * MB)
    path = work / "giant.jsonl"
    with path.open("wb") as out:
        write_long_line(out, size, model, "giant")
    idle_end = time.time()
    time.sleep(args.tenants_idle_s)  # the probe's idle window: nothing else runs
    idle = probe.window(idle_end, time.time())
    api = stack.pid("api")
    if api is None:
        raise SystemExit("tenants: the api is not running")
    print(f"tenants: a {size / MB:,.0f} MB one-line file, uploaded and validated ...", flush=True)
    with ProcessSampler({"api": api}, interval_s=0.1) as sampler:
        started = time.time()
        upload = flood.upload(path)
        uploaded = time.time()
        status, validated = "upload refused", uploaded
        batch_id = ""
        if upload.ok:
            answer = flood.create(upload.body["id"], "giant")
            status = answer.code
            if answer.ok:
                batch_id = answer.body["id"]
                batch, validated = flood.wait(
                    batch_id,
                    args.tenants_timeout_s,
                    until=TERMINAL | {"in_progress", "finalizing", "cancelling"},
                )
                errors = [e.get("code") for e in ((batch.get("errors") or {}).get("data") or [])]
                status = f"{batch.get('status', '?')}" + (
                    f" ({', '.join(sorted(set(filter(None, errors))))})" if errors else ""
                )
                if validated != validated:  # still validating after the timeout
                    validated, status = (
                        time.time(),
                        f"still {batch.get('status')} after {args.tenants_timeout_s:.0f} s",
                    )
    path.unlink(missing_ok=True)
    if batch_id:
        flood.cancel(batch_id)  # a batch that got through: its line need not run
    during = probe.window(started, validated)
    rss = sampler.peak_rss["api"] / 2**20
    return {
        "file_mb": size / MB,
        "upload": upload.code,
        "upload_s": uploaded - started,
        "outcome": status,
        "validate_s": validated - uploaded,
        "health_idle": idle,
        "health": during,
        "health_p99_target_s": HEALTH_P99_TARGET_S,
        "health_met": during["p99_s"] < HEALTH_P99_TARGET_S,
        "api_peak_rss_mib": rss,
        "api_rss_target_mib": API_RSS_TARGET_MIB,
        "api_rss_met": rss < API_RSS_TARGET_MIB,
    }


# --------------------------------------------------------------------------------------- run


def engine(args: Any) -> tuple[ModelSpec, dict[str, str], str]:
    """The model spec, the worker's settings and a description of the engine."""
    if args.tenants_engine == "vllm":
        if not Path(args.model_dir, "config.json").exists():
            raise SystemExit(f"no model at {args.model_dir} (run `make test` or `make up UP_MODEL=tiny`)")
        return ModelSpec(args.model_dir, VLLM_MODEL), {}, f"vLLM {Path(args.model_dir).name}"
    if args.tenants_engine == "sim" or getattr(args, "engine", "") == "sim":
        return ModelSpec("", SIM_MODEL, engine="sim"), sim_env(args), f"simulated GPU ({SIM_PROFILE.name})"
    pace = args.tenants_line_seconds / LINE_MAX_TOKENS
    env = {
        "BATCHSTREAM_INFERENCE_FAKE_SECONDS_PER_TOKEN": f"{pace:g}",
        "BATCHSTREAM_INFERENCE_FAKE_MAX_RUNNING": str(args.tenants_places),
        "BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(args.tenants_places),  # the worker's window: 16x
        "BATCHSTREAM_INFERENCE_ENGINE_QUEUE_LINES": "0",  # none wait inside the engine: it runs them
    }
    capacity = args.tenants_places / args.tenants_line_seconds
    what = (
        f"paced fake engine, {args.tenants_line_seconds:g} s a line x {args.tenants_places} places "
        f"= {capacity:,.0f} lines/s"
    )
    return ModelSpec("", FAKE_MODEL, engine="fake"), env, what


def run(args: Any) -> dict[str, Any]:
    spec, engine_env, what = engine(args)
    keys = ",".join(f"{key}={project}" for project, key in KEYS.items())
    stack = new_stack(
        [spec], inference_python=args.inference_python, BATCHSTREAM_API_KEYS=keys, **engine_env, **args.env
    )
    work = Path(tempfile.mkdtemp(prefix="batchstream-tenants-"))
    print(f"tenants: starting the stack ({what}) ...", flush=True)
    good = Tenant(stack.base_url, "good", KEYS["good"])
    flood = Tenant(stack.base_url, "flood", KEYS["flood"])
    try:
        startup = start_stack(stack)
        health_url = stack.base_url.removesuffix("/v1") + "/health"
        with HealthProbe(health_url, args.tenants_health_interval_ms / 1000) as probe:
            share = fair_share(args, good, flood, probe, work, spec.served_name)
            giant = giant_line(args, stack, flood, probe, work, spec.served_name)
    finally:
        good.close()
        flood.close()
        stack.stop()
        for leftover in work.iterdir():
            leftover.unlink()
        work.rmdir()
    result = {
        "engine": what,
        "startup": startup,
        "fair_share": share,
        "giant_line": giant,
        "settings": {k: v for k, v in vars(args).items() if k.startswith("tenants_")},
    }
    _print(result)
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds == seconds else "-"


def _print(r: dict[str, Any]) -> None:
    s, g = r["fair_share"], r["giant_line"]
    rows: list[list[Any]] = [
        [
            f"good batch alone ({s['good_lines']:,} lines, median of {len(s['alone'])})",
            f"{s['alone_s']:.2f} s",
            "",
            "",
        ],
        ["good batch beside the flood", f"{s['beside']['seconds']:.2f} s", s["beside"]["status"], ""],
        ["beside / alone", f"{s['ratio']:.2f}x", f"<= {RATIO_TARGET:g}x", _met(s["ratio_met"])],
        [
            "good project's share of the lines finished meanwhile",
            f"{s['good_share_while_both_ran']:.0%}",
            "fair: 50%",
            "",
        ],
        [
            "flood lines still waiting when the good batch ended",
            s["flood_lines_pending_when_good_done"],
            "> 0",
            "",
        ],
        [
            "/health during the flood p50 / p99",
            _ms(s["health_during_flood"]["p50_s"]),
            _ms(s["health_during_flood"]["p99_s"]),
            "",
        ],
    ]
    print()
    print(
        table(
            f"tenants: the good project beside a flood ({r['engine']})",
            ["figure", "value", "note / target", ""],
            rows,
        )
    )
    print()
    print(
        table(
            "tenants: the flood's batches (every create's answer; statuses at the end, the rest cancelled)",
            ["kind", "file MB", "upload", "creates", "statuses"],
            [
                [
                    kind,
                    f"{x['file_mb']:,.1f}",
                    x["upload"],
                    ", ".join(f"{c}: {n}" for c, n in x["creates"].items()),
                    ", ".join(f"{c}: {n}" for c, n in x.get("final", {}).items()),
                ]
                for kind, x in s["flood"].items()
            ],
        )
    )
    for kind, x in s["huge_lines"].items():
        counts = x["request_counts"] or {}
        print(
            f"  {kind}: {x['status']}, {counts.get('failed', 0)} of {counts.get('total', 0)} lines failed"
            + (f" ({', '.join(x['error_codes'])})" if x["error_codes"] else "")
        )
    if s["flood_lines_pending_when_good_done"] == 0:
        print("  (the flood ended before the good batch: raise its sizes for a fair-share figure)")
    h, idle = g["health"], g["health_idle"]
    print()
    print(
        table(
            f"tenants: /health while a {g['file_mb']:,.0f} MB one-line file is uploaded and validated "
            f"({h['polls']} polls, {h['not_200']} not 200)",
            ["figure", "value", "idle stack", "target", ""],
            [
                ["upload", f"{g['upload_s']:.2f} s", "", g["upload"], ""],
                ["create to validated", f"{g['validate_s']:.2f} s", "", g["outcome"], ""],
                ["/health p50", _ms(h["p50_s"]), _ms(idle["p50_s"]), "", ""],
                [
                    "/health p99",
                    _ms(h["p99_s"]),
                    _ms(idle["p99_s"]),
                    f"< {HEALTH_P99_TARGET_S * 1000:.0f} ms",
                    _met(g["health_met"]),
                ],
                ["/health max", _ms(h["max_s"]), _ms(idle["max_s"]), "", ""],
                [
                    "api peak RSS",
                    f"{g['api_peak_rss_mib']:,.0f} MiB",
                    "",
                    f"< {API_RSS_TARGET_MIB:.0f} MiB",
                    _met(g["api_rss_met"]),
                ],
            ],
        )
    )
    print(
        f"tenants: good batch {s['ratio']:.2f}x alone beside the flood ({_met(s['ratio_met'])}); "
        f"/health p99 {_ms(h['p99_s'])} ({_met(g['health_met'])}); api peak RSS "
        f"{g['api_peak_rss_mib']:,.0f} MiB ({_met(g['api_rss_met'])})"
    )
