"""The tenants benchmark's two measurements: the good project's batch alone and beside a flood
(the fair share), and ``/health`` while a giant one-line file is uploaded and validated."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import TERMINAL, ProcessSampler
from bench.tenants_client import POLL_S, Answer, HealthProbe, Tenant, finished, pending
from bench.tenants_files import MB, write_huge_line_file, write_lines, write_long_line
from deploy.local import Stack

FLOOD_PRIORITY = 100
HUGE_KINDS = ("huge line", "over the line limit")
RATIO_TARGET = 2.0  # beside the flood within 2x alone: two projects' fair share
HEALTH_P99_TARGET_S = 0.25
API_RSS_TARGET_MIB = 300.0


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
