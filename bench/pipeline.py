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

The lag, the profile, the targets and the tables are in ``pipeline_lag``, ``pipeline_profile``,
``pipeline_targets`` and ``pipeline_report``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

from bench import dispatch
from bench.common import (
    MongoPoller,
    ProcessSampler,
    ResultsTap,
    chat_line,
    create_batch,
    median,
    new_stack,
    service_names,
    start_stack,
    write_padded_file,
)
from bench.pipeline_lag import aggregator_lag_sums, count_lag, lag_breakdown
from bench.pipeline_profile import Profiler, profile_summary
from bench.pipeline_report import print_report
from bench.pipeline_targets import plumbing_figures
from deploy.local import ModelSpec, Stack

MODEL = "fake-model"
SMALL_LINES = 10
HOL_FACTOR, HOL_SLACK_S = 1.2, 0.5  # head of line: behind the big batch within 1.2x alone + 0.5 s


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
    print_report(result)
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
    lag = count_lag(results, big_trace.counts)
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
