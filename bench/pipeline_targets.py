"""The pipeline ceiling's targets: the plumbing figures of one run, and a million-line batch
beside the 50,000-line one of the same run."""

from __future__ import annotations

from typing import Any

from bench.common import met, table

# The yardstick: the whole batch's rate before the dispatcher (5,869 lines/s, docs/benchmarks.md
# names the run); the target is 3x.
YARDSTICK_LINES_PER_S, SPEEDUP_TARGET = 5_869, 3.0
OUR_SERVICES = ("api", "aggregator", "inference")  # what "our services" sums (not the stand-ins)


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
    ours_met = [x <= OUR_CPU_TARGET for x in ours]
    rows.append(
        [
            "our services: CPU s / 1,000 lines",
            f"{ours[0]:.3f}",
            f"{ours[1]:.3f}",
            "",
            f"<= {OUR_CPU_TARGET}: {met(ours_met[0])} / {met(ours_met[1])}",
        ]
    )
    rows[0][4] = f"50,000 >= {SMALL_RATE_TARGET:,}: {met(small['batch_lines_per_s'] >= SMALL_RATE_TARGET)}"
    for stat, target in LAG_TARGETS.items():
        lag = [r["live_count_lag_s"].get(stat, float("nan")) for r in (small, big)]
        rows.append(
            [
                f"live-count lag {stat} (s)",
                f"{lag[0]:.2f}",
                f"{lag[1]:.2f}",
                "",
                f"<= {target}: {met(lag[0] <= target)} / {met(lag[1] <= target)}",
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
            f"<= {limits[0]:g} / {limits[1]:g}: {met(tails[0] <= limits[0])} / {met(tails[1] <= limits[1])}",
        ]
    )
    for name in services:
        rows.append(
            [
                f"{name}: peak RSS MiB",
                f"{small['peak_rss_mib'][name]:.0f}",
                f"{big['peak_rss_mib'][name]:.0f}",
                f"{growth[name]:.2f}x",
                f"<= {RSS_GROWTH_TARGET}x: {met(growth[name] <= RSS_GROWTH_TARGET)}",
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
