"""Pipeline ceiling: the stack with the instant fake engine and one large batch.

Measures, for a ``--lines`` batch padded to about ``--line-bytes`` per line (50,000 x 4,000 B,
about 200 MB, by default):

- upload, validation and emission; ingest = start of upload until the batch document says every
  request message was published (``emitted``), i.e. all lines are on Kafka;
- the whole batch: ``batches.create`` until the document turns ``completed``;
- live-count lag: for each result on the results topic (its Kafka timestamp) the time until the
  batch document's completed + failed first covered it (documents polled every 50 ms, so the lag
  is an upper bound within 50 ms);
- finalize: the document turning ``finalizing`` until ``completed``, both polled;
- CPU seconds per 1,000 lines for every process of the stack (psutil, process trees), and each
  one's peak RSS sampled every 200 ms;
- head-of-line: a 10-line batch created as soon as the large one is ``in_progress``, against the
  same batch alone on the idle stack (median of ``--small-runs``); target: within 1.2x
  alone + 0.5 s;
- shares: two projects each create an equal ``--share-lines`` batch at once; each one's
  share of the lines finished while both run (target 50% +/- 10%), see ``bench/dispatch.py``.

With the dispatcher (docs/dispatcher.md), ``emitted`` means every line was dispatched: lines wait in
object storage until the workers take them, so "ingest" now spans nearly the whole batch.

``--profile SERVICE`` records the named service with py-spy (if installed) during the large batch
and prints its hottest functions; the raw collapsed stacks are saved under bench/results/.
"""

from __future__ import annotations

import bisect
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from bench import dispatch
from bench.common import (
    MongoPoller,
    ProcessSampler,
    ResultsTap,
    chat_line,
    create_batch,
    median,
    new_stack,
    percentile,
    service_names,
    start_stack,
    table,
    write_padded_file,
)
from deploy.local import ModelSpec, Stack

MODEL = "fake-model"
SMALL_LINES = 10
HOL_FACTOR, HOL_SLACK_S = 1.2, 0.5  # head of line: behind the big batch within 1.2x alone + 0.5 s
# The yardstick: the whole batch's rate before the dispatcher (5,869 lines/s, docs/benchmarks.md
# names the run); the target is 3x.
YARDSTICK_LINES_PER_S, SPEEDUP_TARGET = 5_869, 3.0
OUR_SERVICES = ("api", "aggregator", "inference")  # what "our services" sums (not the stand-ins)


class Profiler:
    """py-spy recording one PID until stopped (SIGINT makes py-spy write its output)."""

    def __init__(self, pid: int, out: Path) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(exe).exists():
            raise SystemExit("--profile needs py-spy (pip install py-spy==0.4.3 into this environment)")
        self.out = out
        argv = [exe, "record", "-p", str(pid), "-r", "100", "-f", "raw", "-o", str(out), "--nonblocking"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> list[tuple[str, int]]:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return parse_collapsed(self.out) if self.out.exists() else []


def parse_collapsed(path: Path) -> list[tuple[str, int]]:
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if count.isdigit():
            stacks.append((frames, int(count)))
    return stacks


def _func(frame: str) -> str:
    """'fn (path/to/file.py:12)' -> 'fn (to/file.py)': line numbers dropped, path shortened."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/", "python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})" if where else name


def profile_summary(stacks: list[tuple[str, int]], top: int = 15) -> dict[str, Any]:
    total = sum(c for _, c in stacks) or 1
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    idle = 0
    for frames, count in stacks:
        parts = [_func(f) for f in frames.split(";")[1:]]  # the first is the thread
        if not parts:
            continue
        leaf = parts[-1]
        if any(w in leaf for w in ("select (", "poll (", "epoll", "_run_once", "wait (")):
            idle += count
        own[leaf] += count
        for name in set(parts):
            inclusive[name] += count
    return {
        "samples": total,
        "idle_share": idle / total,
        "self": [(n, c / total) for n, c in own.most_common(top)],
        "inclusive": [(n, c / total) for n, c in inclusive.most_common(top * 3)],
    }


def upload_small(client: OpenAI, tag: str) -> str:
    data = "\n".join(chat_line(f"{tag}-{i}", MODEL, f"hello {i}", max_tokens=16) for i in range(SMALL_LINES))
    return client.files.create(file=(f"{tag}.jsonl", data.encode()), purpose="batch").id


def run(args: Any, results_dir: Path) -> dict[str, Any]:
    stack = new_stack([ModelSpec("", MODEL, engine="fake")], **args.env)
    work = Path(tempfile.mkdtemp(prefix="batchstream-pipeline-"))
    big_path = work / "big.jsonl"
    size = write_padded_file(big_path, args.lines, args.line_bytes, MODEL, "line")
    print(
        f"pipeline: {args.lines:,} lines, {size / 1e6:,.1f} MB; starting the stack (fake engine) ...",
        flush=True,
    )
    try:
        startup = start_stack(stack)
        client = OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5, timeout=600)
        poller = MongoPoller(stack)
        try:
            result = _measure(args, stack, client, poller, big_path, size, results_dir)
        finally:
            poller.close()
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["startup"] = startup
    _print(result)
    return result


def _measure(
    args: Any,
    stack: Stack,
    client: OpenAI,
    poller: MongoPoller,
    big_path: Path,
    size: int,
    results_dir: Path,
) -> dict[str, Any]:
    # Head-of-line baseline: the small batch alone on the idle stack (the first run warms up).
    alone = []
    for n in range(args.small_runs + 1):
        small_id, created = create_batch(client, upload_small(client, f"alone{n}"))
        trace = poller.wait(small_id, 120)
        if n:
            alone.append(trace.status_at["completed"] - created)
    small_file = upload_small(client, "during")

    pids = {name: pid for name in service_names(stack) if (pid := stack.pid(name)) is not None}
    lag_before = aggregator_lag_sums(stack)
    tap = ResultsTap(stack)
    profiler = None
    if args.profile and args.profile != "none":
        target = next((n for n in pids if n == args.profile or n.startswith(args.profile)), None)
        if target is None:
            raise SystemExit(f"--profile {args.profile}: no such service among {', '.join(pids)}")
        profiler = Profiler(
            pids[target], results_dir / f"profile-{target}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
        )
    with ProcessSampler(pids) as sampler:
        t_upload = time.time()
        with big_path.open("rb") as fh:
            upload = client.files.create(file=("big.jsonl", fh), purpose="batch")
        sampler.mark()  # the batch's own CPU, without the upload's
        big_id, t_create = create_batch(client, upload.id)
        big_trace = poller.wait(big_id, 600, "in_progress")
        small_id, small_created = create_batch(client, small_file)
        small_trace = poller.wait(small_id, 600)
        big_trace = poller.wait(big_id, 900)
        t_done = time.time()
        tap.wait_for(big_id, args.lines, 30)
    tap.close()
    lag_parts = lag_breakdown(lag_before, aggregator_lag_sums(stack))
    profile = None
    if profiler is not None:
        profile = profile_summary(profiler.stop())
        profile["service"] = args.profile
        profile["raw"] = str(profiler.out)

    doc = big_trace.doc
    counts = doc.get("request_counts") or {}
    at = big_trace.status_at
    emitted_at = big_trace.emitted_at or float("nan")
    completed = at.get("completed", t_done)
    results = sorted(tap.times.get(big_id, []))
    lag = _count_lag(results, big_trace.counts)
    cpu = sampler.cpu
    lines = args.lines
    out = {
        "settings": {
            "lines": lines,
            "line_bytes": args.line_bytes,
            "file_bytes": size,
            "small_lines": SMALL_LINES,
            "small_runs": args.small_runs,
            "extra_env": args.env,
        },
        "status": doc.get("status"),
        "request_counts": counts,
        "upload_s": t_create - t_upload,
        "upload_mb_per_s": size / 1e6 / (t_create - t_upload),
        "validate_s": at.get("in_progress", float("nan")) - t_create,
        "emit_s": emitted_at - at.get("in_progress", float("nan")),
        "ingest_s": emitted_at - t_upload,
        "ingest_lines_per_s": lines / (emitted_at - t_upload),
        "create_to_emitted_s": emitted_at - t_create,
        "batch_s": completed - t_create,
        "batch_lines_per_s": lines / (completed - t_create),
        "upload_to_completed_s": completed - t_upload,
        "first_result_after_create_s": (results[0] - t_create) if results else float("nan"),
        "last_result_after_create_s": (results[-1] - t_create) if results else float("nan"),
        "last_result_to_finalizing_s": (at.get("finalizing", float("nan")) - results[-1])
        if results
        else float("nan"),
        "finalize_s": completed - at.get("finalizing", float("nan")),
        "finalize_s_from_documents": (doc.get("completed_at") or 0) - (doc.get("finalizing_at") or 0),
        "results_seen_on_topic": len(results),
        "count_updates_seen": len(big_trace.counts),
        "live_count_lag_s": lag,
        "live_count_lag_parts_s": lag_parts,
        "cpu_s": cpu,
        "cpu_s_per_1000_lines": {n: c / lines * 1000 for n, c in cpu.items()},
        "batch_cpu_s_per_1000_lines": {n: c / lines * 1000 for n, c in sampler.cpu_since_mark.items()},
        "cpu_s_total": sum(cpu.values()),
        "bench_client_cpu_s": sampler.client_cpu_s,
        "peak_rss_mib": {n: b / 2**20 for n, b in sampler.peak_rss.items()},
        "head_of_line": {
            "alone_s": alone,
            "alone_median_s": median(alone),
            "during_s": small_trace.status_at.get("completed", float("nan")) - small_created,
            "during_status": small_trace.doc.get("status"),
            "during_created_after_big_create_s": small_created - t_create,
        },
        "targets": {},
        "profile": profile,
    }
    hol = out["head_of_line"]
    hol["limit_s"] = HOL_FACTOR * hol["alone_median_s"] + HOL_SLACK_S
    out["targets"] = {
        "batch_under_30_s": out["batch_s"] < 30,
        "head_of_line": hol["during_s"] <= hol["limit_s"],
    }
    work = Path(tempfile.mkdtemp(prefix="batchstream-shares-"))
    try:

        def upload_share(client: OpenAI, project: str) -> str:
            path = work / f"{project}.jsonl"
            write_padded_file(path, args.share_lines, 200, MODEL, project)
            with path.open("rb") as fh:
                return client.files.create(file=(path.name, fh), purpose="batch").id

        print(f"pipeline: two projects, {args.share_lines:,} lines each, at once ...", flush=True)
        out["shares"] = dispatch.project_shares(stack, poller, upload_share)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["targets"]["project_shares"] = out["shares"]["target_met"]
    out["plumbing"] = plumbing_figures(out)
    out["targets"].update({name: ok for name, _, _, ok in out["plumbing"]})
    return out


def plumbing_figures(r: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """The plumbing targets: (name, value, target, met)."""
    ours = sum(v for n, v in r["cpu_s_per_1000_lines"].items() if n.startswith(OUR_SERVICES))
    lag = r["live_count_lag_s"]
    tail = r["last_result_to_finalizing_s"] + r["finalize_s"]
    file_in = r["upload_s"] + r["validate_s"]
    speedup = r["batch_lines_per_s"] / YARDSTICK_LINES_PER_S
    api_rss = r["peak_rss_mib"].get("api", float("nan"))
    return [
        ("our_services_cpu_s_per_1000_lines", ours, "<= 0.10", ours <= 0.10),
        (
            "batch_speedup",
            speedup,
            f">= {SPEEDUP_TARGET:g}x of {YARDSTICK_LINES_PER_S:,} lines/s",
            speedup >= 3,
        ),
        ("count_lag_p50_s", lag.get("p50", float("nan")), "<= 0.5", lag.get("p50", 9) <= 0.5),
        ("count_lag_max_s", lag.get("max", float("nan")), "<= 1.0", lag.get("max", 9) <= 1.0),
        ("last_result_to_completed_s", tail, "<= 1.0", tail <= 1.0),
        ("file_in_s (upload + validate)", file_in, "< 5", file_in < 5),
        ("api_peak_rss_mib", api_rss, "< 300", api_rss < 300),
    ]


LAG_STAGES = {
    # name in the output: the aggregator's histogram and labels (services/aggregator/metrics.py)
    "polled_oldest": ("batchstream_aggregator_result_age_seconds", ("polled", "oldest")),
    "polled_newest": ("batchstream_aggregator_result_age_seconds", ("polled", "newest")),
    "chunk_started_oldest": ("batchstream_aggregator_result_age_seconds", ("chunk_started", "oldest")),
    "chunk_started_newest": ("batchstream_aggregator_result_age_seconds", ("chunk_started", "newest")),
    "chunk_processing": ("batchstream_aggregator_chunk_seconds", ()),
}


def aggregator_lag_sums(stack: Stack) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of the aggregator's lag histograms, scraped from its /metrics."""
    url = f"http://127.0.0.1:{stack.ports.aggregator}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found: dict[tuple[str, tuple[str, ...]], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sample.labels[k] for k in ("stage", "end") if k in sample.labels)
            for suffix, index in (("_sum", 0), ("_count", 1)):
                if sample.name.endswith(suffix):
                    found[(sample.name.removesuffix(suffix), labels)][index] += sample.value
    return {name: tuple(found.get(key, [0.0, 0.0])) for name, key in LAG_STAGES.items()}  # type: ignore[misc]


def lag_breakdown(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Mean of each lag histogram over the big batch (the difference of two scrapes)."""
    means = {}
    for name in LAG_STAGES:
        total, count = (a - b for a, b in zip(after[name], before[name], strict=True))
        means[name] = total / count if count else float("nan")
    return means


def _count_lag(results: list[float], counts: list[tuple[float, int]]) -> dict[str, float]:
    """Per result k (in time order): when the document's count first reached k, minus its time."""
    if not results or not counts:
        return {}
    seen_values = [c for _, c in counts]
    lags = []
    for k in range(1, len(results) + 1):
        i = bisect.bisect_left(seen_values, k)  # counts only grow
        if i < len(counts):
            lags.append(counts[i][0] - results[k - 1])
    return {
        "p50": percentile(lags, 50),
        "p95": percentile(lags, 95),
        "max": max(lags) if lags else float("nan"),
        "poll_interval": 0.05,
    }


def _print(r: dict[str, Any]) -> None:
    s = r["settings"]
    lag = r["live_count_lag_s"]
    parts = r.get("live_count_lag_parts_s") or {}
    batch_cpu = r.get("batch_cpu_s_per_1000_lines") or {}
    nan = float("nan")
    hol = r["head_of_line"]
    rows = [
        ["upload", r["upload_s"], f"{r['upload_mb_per_s']:.1f} MB/s", ""],
        ["validate (create -> in_progress)", r["validate_s"], "", ""],
        ["dispatch (in_progress -> every line sent)", r["emit_s"], "metered by the dispatcher", ""],
        [
            "ingest (upload -> every line sent)",
            r["ingest_s"],
            f"{r['ingest_lines_per_s']:,.0f} lines/s",
            "",
        ],
        [
            "whole batch (create -> completed)",
            r["batch_s"],
            f"{r['batch_lines_per_s']:,.0f} lines/s",
            "< 30 s",
        ],
        ["upload -> completed", r["upload_to_completed_s"], "", ""],
        ["first result after create", r["first_result_after_create_s"], "", ""],
        ["last result after create", r["last_result_after_create_s"], "", ""],
        ["last result -> finalizing", r["last_result_to_finalizing_s"], "", ""],
        ["finalize (finalizing -> completed)", r["finalize_s"], "", ""],
        [
            "live-count lag p50 / p95 / max",
            lag.get("p50", float("nan")),
            f"{lag.get('p95', 0):.2f} / {lag.get('max', 0):.2f} s",
            "",
        ],
        [
            "  a result's age when polled (mean of oldest / newest)",
            parts.get("polled_oldest", nan),
            f"{parts.get('polled_newest', nan):.2f} s",
            "",
        ],
        [
            "  ... when its chunk starts (oldest / newest)",
            parts.get("chunk_started_oldest", nan),
            f"{parts.get('chunk_started_newest', nan):.2f} s",
            "",
        ],
        ["  ... + the chunk until counted (mean)", parts.get("chunk_processing", nan), "", ""],
        [f"{s['small_lines']}-line batch alone (median)", hol["alone_median_s"], "", ""],
        [
            f"{s['small_lines']}-line batch during the big one",
            hol["during_s"],
            hol["during_status"],
            f"<= {hol['limit_s']:.2f} s",
        ],
    ]
    print()
    print(
        table(
            f"Pipeline ceiling (fake engine): {s['lines']:,} lines, {s['file_bytes'] / 1e6:,.1f} MB, "
            f"status {r['status']}, counts {r['request_counts']}",
            ["step", "seconds", "rate / note", "target"],
            rows,
        )
    )
    print()
    print(
        table(
            "Per service during the big batch (upload to completed; the batch alone: create to completed)",
            ["service", "CPU s", "CPU s / 1,000 lines", "batch alone", "peak RSS MiB"],
            [
                [n, r["cpu_s"][n], r["cpu_s_per_1000_lines"][n], batch_cpu.get(n, nan), r["peak_rss_mib"][n]]
                for n in sorted(r["cpu_s"], key=lambda n: -r["cpu_s"][n])
            ]
            + [
                [
                    "(all)",
                    r["cpu_s_total"],
                    r["cpu_s_total"] / s["lines"] * 1000,
                    sum(batch_cpu.values()) if batch_cpu else nan,
                    nan,
                ]
            ],
        )
    )
    print(f"bench client CPU (upload, polling, results tap): {r['bench_client_cpu_s']:.1f} s")
    stand_ins = sum(v for n, v in batch_cpu.items() if not n.startswith(OUR_SERVICES))
    if stand_ins > 0:
        cores = len(os.sched_getaffinity(0))
        ceiling = cores / stand_ins * 1000
        print(
            f"the stand-ins (broker, S3, MongoDB) alone used {stand_ins:.2f} CPU s per 1,000 lines of "
            f"the batch: on {cores} cores no batch runs faster than {ceiling:,.0f} lines/s "
            f"({ceiling / YARDSTICK_LINES_PER_S:.1f}x the yardstick) even if our services cost nothing"
        )
    print()
    print(
        table(
            "Plumbing targets",
            ["figure", "value", "target", ""],
            [[n, v, t, "met" if ok else "NOT met"] for n, v, t, ok in r["plumbing"]],
        )
    )
    targets = r["targets"]
    print(
        "targets: "
        + "; ".join(f"{name.replace('_', ' ')}: {'met' if ok else 'NOT met'}" for name, ok in targets.items())
    )
    dispatch.print_figures("Dispatcher (fake engine): two projects at once", None, r.get("shares"))
    profile = r.get("profile")
    if profile:
        print()
        print(
            table(
                f"py-spy profile of {profile['service']} ({profile['samples']:,} samples, "
                f"idle/poll share {profile['idle_share']:.0%}): self time",
                ["function", "share"],
                [[n, f"{share:.1%}"] for n, share in profile["self"]],
            )
        )
        print(f"raw collapsed stacks: {profile['raw']}")


YARDSTICK_LINES = 50_000
RSS_GROWTH_TARGET = 1.3  # each service's peak RSS at the big batch, against the yardstick's
# The million-line targets: our services' CPU per 1,000 lines (upload to completed); the
# 50,000-line batch at twice the 3,597 lines/s of the 200 MB batch of ``make bench`` before the
# million-line work (docs/benchmarks.md names the run); the live count behind the results;
# last result to completed per size.
OUR_CPU_TARGET = 0.15
SMALL_RATE_TARGET = 2 * 3_597
LAG_TARGETS = {"p50": 0.5, "max": 1.0}
TAIL_TARGETS = {YARDSTICK_LINES: 1.0, 1_000_000: 10.0}


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def compare(small: dict[str, Any], big: dict[str, Any]) -> dict[str, Any]:
    """The big batch beside the 50,000-line one of the same run: lines/s, CPU per 1,000 lines and
    peak RSS per service, and how much each service's peak grew (target: <= 1.3x)."""
    lines = (small["settings"]["lines"], big["settings"]["lines"])
    services = [n for n in big["peak_rss_mib"] if n.startswith(OUR_SERVICES)]
    growth = {n: big["peak_rss_mib"][n] / small["peak_rss_mib"][n] for n in services}
    rows: list[list[Any]] = [
        [
            "lines/s (create to completed)",
            f"{small['batch_lines_per_s']:,.0f}",
            f"{big['batch_lines_per_s']:,.0f}",
            "",
            "",
        ],
        [
            "exact counts",
            str(small["request_counts"] == {"completed": lines[0], "failed": 0, "total": lines[0]}),
            str(big["request_counts"] == {"completed": lines[1], "failed": 0, "total": lines[1]}),
            "",
            "",
        ],
    ]
    for name in services:
        rows.append(
            [
                f"{name}: CPU s / 1,000 lines",
                f"{small['cpu_s_per_1000_lines'][name]:.3f}",
                f"{big['cpu_s_per_1000_lines'][name]:.3f}",
                "",
                "",
            ]
        )
    ours = [sum(r["cpu_s_per_1000_lines"][n] for n in services) for r in (small, big)]
    met = [x <= OUR_CPU_TARGET for x in ours]
    rows.append(
        [
            "our services: CPU s / 1,000 lines",
            f"{ours[0]:.3f}",
            f"{ours[1]:.3f}",
            "",
            f"<= {OUR_CPU_TARGET}: {_met(met[0])} / {_met(met[1])}",
        ]
    )
    rows[0][4] = f"50,000 >= {SMALL_RATE_TARGET:,}: {_met(small['batch_lines_per_s'] >= SMALL_RATE_TARGET)}"
    for stat, target in LAG_TARGETS.items():
        lag = [r["live_count_lag_s"].get(stat, float("nan")) for r in (small, big)]
        rows.append(
            [
                f"live-count lag {stat} (s)",
                f"{lag[0]:.2f}",
                f"{lag[1]:.2f}",
                "",
                f"<= {target}: {_met(lag[0] <= target)} / {_met(lag[1] <= target)}",
            ]
        )
    tails = [r["last_result_to_finalizing_s"] + r["finalize_s"] for r in (small, big)]
    limits = [TAIL_TARGETS.get(n, float("nan")) for n in lines]
    rows.append(
        [
            "last result to completed (s)",
            f"{tails[0]:.2f}",
            f"{tails[1]:.2f}",
            "",
            f"<= {limits[0]:g} / {limits[1]:g}: "
            f"{_met(tails[0] <= limits[0])} / {_met(tails[1] <= limits[1])}",
        ]
    )
    for name in services:
        rows.append(
            [
                f"{name}: peak RSS MiB",
                f"{small['peak_rss_mib'][name]:.0f}",
                f"{big['peak_rss_mib'][name]:.0f}",
                f"{growth[name]:.2f}x",
                f"<= {RSS_GROWTH_TARGET}x: {'met' if growth[name] <= RSS_GROWTH_TARGET else 'NOT met'}",
            ]
        )
    print(
        table(
            f"pipeline: {lines[1]:,} lines beside {lines[0]:,} (same line size, same run)",
            ["figure", f"{lines[0]:,}", f"{lines[1]:,}", "growth", "target"],
            rows,
        ),
        flush=True,
    )
    return {
        "lines": lines,
        "our_cpu_s_per_1000_lines": ours,
        "rss_growth": growth,
        "rss_growth_met": all(g <= RSS_GROWTH_TARGET for g in growth.values()),
    }
