"""The pipeline ceiling's tables: the steps, each service's CPU and memory, the plumbing targets,
the two projects' shares and the profile."""

from __future__ import annotations

import os
from typing import Any

from bench import dispatch
from bench.common import met, table
from bench.pipeline_targets import OUR_SERVICES, YARDSTICK_LINES_PER_S


def print_report(r: dict[str, Any]) -> None:
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
            [[n, v, t, met(ok)] for n, v, t, ok in r["plumbing"]],
        )
    )
    targets = r["targets"]
    print("targets: " + "; ".join(f"{name.replace('_', ' ')}: {met(ok)}" for name, ok in targets.items()))
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
