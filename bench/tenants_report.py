"""The tenants benchmark's tables and verdict line."""

from __future__ import annotations

from typing import Any

from bench.common import met, table
from bench.tenants_measure import API_RSS_TARGET_MIB, HEALTH_P99_TARGET_S, RATIO_TARGET


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds == seconds else "-"


def print_report(r: dict[str, Any]) -> None:
    s, g = r["fair_share"], r["giant_line"]
    rows: list[list[Any]] = [
        [
            f"good batch alone ({s['good_lines']:,} lines, median of {len(s['alone'])})",
            f"{s['alone_s']:.2f} s",
            "",
            "",
        ],
        ["good batch beside the flood", f"{s['beside']['seconds']:.2f} s", s["beside"]["status"], ""],
        ["beside / alone", f"{s['ratio']:.2f}x", f"<= {RATIO_TARGET:g}x", met(s["ratio_met"])],
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
                    met(g["health_met"]),
                ],
                ["/health max", _ms(h["max_s"]), _ms(idle["max_s"]), "", ""],
                [
                    "api peak RSS",
                    f"{g['api_peak_rss_mib']:,.0f} MiB",
                    "",
                    f"< {API_RSS_TARGET_MIB:.0f} MiB",
                    met(g["api_rss_met"]),
                ],
            ],
        )
    )
    print(
        f"tenants: good batch {s['ratio']:.2f}x alone beside the flood ({met(s['ratio_met'])}); "
        f"/health p99 {_ms(h['p99_s'])} ({met(g['health_met'])}); api peak RSS "
        f"{g['api_peak_rss_mib']:,.0f} MiB ({met(g['api_rss_met'])})"
    )
