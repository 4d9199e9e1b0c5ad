"""The dispatcher's figures: head of line and the projects' shares of throughput.

- Head of line: a small batch created while a big one runs, against the same small batch alone
  (median of ``runs``). Targets: instant engine within 1.2x alone + 0.5 s (behind 50,000 lines);
  real engine within 2x alone (behind 2,000 lines).
- Shares: two projects, each with an equal batch created at the same moment; while both run,
  each one's share of the lines finished (from the polled ``request_counts``). Target: 50% +/- 10%.

The pipeline benchmark (fake engine) and the parity benchmark (real engine) call these on their
own stacks; nothing here starts a stack.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from openai import OpenAI

from bench.common import BatchTrace, MongoPoller, create_batch, median, met, table
from deploy.local.stack import Stack

UploadSmall = Callable[[OpenAI, str], str]


def small_alone(client: OpenAI, poller: MongoPoller, upload_small: UploadSmall, runs: int) -> list[float]:
    """The small batch alone on the idle stack; the first run warms up and is dropped."""
    alone = []
    for n in range(runs + 1):
        batch_id, created = create_batch(client, upload_small(client, f"alone{n}"))
        trace = poller.wait(batch_id, 600)
        if n:
            alone.append(trace.status_at["completed"] - created)
    return alone


def head_of_line(
    client: OpenAI,
    poller: MongoPoller,
    upload_small: UploadSmall,
    big_file_id: str,
    runs: int,
    factor: float,
    slack_s: float,
) -> dict[str, Any]:
    """Small alone, then small created as soon as the big batch is in_progress."""
    alone = small_alone(client, poller, upload_small, runs)
    small_file = upload_small(client, "during")
    big_id, _ = create_batch(client, big_file_id)
    poller.wait(big_id, 600, "in_progress")
    small_id, small_created = create_batch(client, small_file)
    small = poller.wait(small_id, 1800)
    big = poller.wait(big_id, 3600)
    during = small.status_at.get("completed", float("nan")) - small_created
    limit = factor * median(alone) + slack_s
    return {
        "alone_s": alone,
        "alone_median_s": median(alone),
        "during_s": during,
        "during_status": small.doc.get("status"),
        "big_status": big.doc.get("status"),
        "small_done_before_big": small.status_at.get("completed", 0) < big.status_at.get("completed", 0),
        "limit_s": limit,
        "target_met": during <= limit,
    }


def project_shares(stack: Stack, poller: MongoPoller, upload: Callable[[OpenAI, str], str]) -> dict[str, Any]:
    """Two projects' equal batches created at the same moment; each one's share while both run.

    Both files are uploaded first; then one thread per project creates its batch and has the
    poller watch it at once (a batch not watched yet has no count history, so the window both
    ran could not be found).
    """
    clients = {
        project: OpenAI(
            base_url=stack.base_url, api_key=stack.create_key(project), max_retries=5, timeout=600
        )
        for project in ("team-a", "team-b")
    }
    files = {project: upload(client, project) for project, client in clients.items()}
    go = threading.Barrier(len(clients))

    def create_watched(project: str) -> tuple[str, float]:
        go.wait()
        batch_id, created = create_batch(clients[project], files[project])
        poller.watch(batch_id)
        return batch_id, created

    with ThreadPoolExecutor(len(clients)) as pool:
        made = dict(zip(clients, pool.map(create_watched, clients), strict=True))
    traces = {project: poller.wait(batch_id, 3600) for project, (batch_id, _) in made.items()}
    created_at = [created for _, created in made.values()]
    return {
        "projects": list(made),
        "created_apart_s": max(created_at) - min(created_at),
        **shares_while_both_run(traces),
    }


def shares_while_both_run(traces: dict[str, BatchTrace]) -> dict[str, Any]:
    """Lines each batch finished while both were running: from the later one's first counted
    result to the first moment one of them had all its results (its ``finalizing``)."""
    starts = [next((t for t, c in trace.counts if c > 0), float("inf")) for trace in traces.values()]
    ends = [
        trace.status_at.get("finalizing", trace.status_at.get("completed", 0)) for trace in traces.values()
    ]
    begin, end = max(starts), min(ends)

    def done_at(trace: BatchTrace, moment: float) -> int:
        return max((c for t, c in trace.counts if t <= moment), default=0)

    finished = {p: max(0, done_at(tr, end) - done_at(tr, begin)) for p, tr in traces.items()}
    total = sum(finished.values())
    shares = {p: n / total if total else float("nan") for p, n in finished.items()}
    return {
        "window_s": end - begin,
        "finished_in_window": finished,
        "shares": shares,
        "target_met": end > begin and total > 0 and all(0.4 <= s <= 0.6 for s in shares.values()),
    }


def print_figures(title: str, hol: dict[str, Any] | None, shares: dict[str, Any] | None) -> None:
    rows: list[list[Any]] = []
    if hol:
        rows.append(["small batch alone (median)", hol["alone_median_s"], ""])
        rows.append(
            [
                "small batch behind the big one",
                hol["during_s"],
                f"limit {hol['limit_s']:.2f} s: {met(hol['target_met'])}",
            ]
        )
    if shares:
        if "created_apart_s" in shares:
            rows.append(["the two batches created apart (s)", shares["created_apart_s"], ""])
        for project, share in shares["shares"].items():
            rows.append([f"share of {project} while both ran", share, "50% +/- 10%"])
        rows.append(["window both ran (s)", shares["window_s"], met(shares["target_met"])])
    print()
    print(table(title, ["figure", "value", "target"], rows))
