"""The console's batch list at 1,000 batches: ``python -m bench --only console``.

Starts the stand-ins and the api alone (the list reads batch documents; no worker, no
aggregator), stores ``--console-batches`` batch documents of one project straight in MongoDB (a
busy project's: counts, usage, metadata, most finished, some running), then opens the console in
Debian's Chromium at 1,000 per page and measures, over ``--console-rounds`` page loads:

- first render: from loading the page to every row in the table (the page's script and config,
  and 10 API pages of 100, included);
- refresh: one of the page's once-a-second updates (fetch, compare, redraw), as the page itself
  times it (``performance.measure("batches-refresh")``).

Yardstick, same run: the same 10 pages fetched by a plain HTTP client (httpx) with nothing drawn.
Target: first render under 1 s.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import httpx
from playwright.sync_api import sync_playwright
from pymongo import MongoClient

from bench.common import new_stack, table
from deploy.local import STAND_INS
from shared.documents import BatchDocument

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-sync"]
PER_PAGE = 1000
TARGET_S = 1.0


def documents(count: int, project: str) -> list[dict[str, Any]]:
    now = int(time.time())
    docs = []
    for i in range(count):
        running = i % 4 == 0
        total = 1000 + i
        done = total // 2 if running else total
        doc = BatchDocument.model_validate(
            {
                "_id": f"batch_{uuid.uuid4().hex[:24]}",
                "project": project,
                "endpoint": "/v1/chat/completions",
                "model": "bench-model",
                "input_file_id": f"file-{i}",
                "status": "in_progress" if running else "completed",
                "created_at": now - 60 * (count - i),
                "in_progress_at": now - 60 * (count - i) + 1,
                "completed_at": None if running else now - 60 * (count - i) + 50,
                "expires_at": now + 86_400,
                "sort_key": time.time_ns() + i,
                "request_counts": {"total": total, "completed": done - i % 7, "failed": i % 7},
                "usage": {"input_tokens": 40 * done, "output_tokens": 90 * done, "total_tokens": 130 * done},
                "metadata": {"team": f"team-{i % 5}", "run": str(i)},
                "priority": i % 3,
            }
        )
        docs.append(doc.to_mongo())
    return docs


def run(args: Any) -> dict[str, Any]:
    count, rounds = args.console_batches, args.console_rounds
    stack = new_stack([])
    print(
        f"console: starting the stand-ins and the api; {count:,} batches, {rounds} page loads ...", flush=True
    )
    stack.start(STAND_INS)
    try:
        stack.provision()
        stack.start(["api"])
        env = stack.env()
        project = "default"
        with MongoClient[dict[str, Any]](env["BATCHSTREAM_MONGO_URI"]) as mongo:
            mongo[env["BATCHSTREAM_MONGO_DATABASE"]].batches.insert_many(documents(count, project))
        origin = stack.base_url.removesuffix("/v1")
        headers = {"Authorization": f"Bearer {stack.api_key}"}
        api_s = []
        with httpx.Client(base_url=origin, headers=headers, timeout=60) as http:
            for _ in range(rounds):
                started, after, fetched = time.perf_counter(), None, 0
                while fetched < min(count, PER_PAGE):
                    params: dict[str, Any] = {"limit": 100, **({"after": after} if after else {})}
                    page = http.get("/v1/batches", params=params).json()
                    fetched += len(page["data"])
                    after = page["last_id"]
                    if not page["has_more"]:
                        break
                api_s.append(time.perf_counter() - started)
        first_s, refresh_ms = [], []
        rows = min(count, PER_PAGE)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.goto(f"{origin}/console/")
            page.evaluate("key => localStorage.setItem('batchstream.console.key', key)", stack.api_key)
            for _ in range(rounds):
                page.goto("about:blank")  # each round loads the page afresh (script, config, list)
                started = time.perf_counter()
                page.goto(f"{origin}/console/#/batches?size={PER_PAGE}")
                # Locators, not wait_for_function: the pages' CSP forbids evaluating strings.
                page.locator("#batches tbody tr").nth(rows - 1).wait_for(timeout=60_000)
                first_s.append(time.perf_counter() - started)
                measures: list[float] = []
                deadline = time.monotonic() + 60
                while len(measures) < 4 and time.monotonic() < deadline:
                    page.wait_for_timeout(250)
                    measures = page.evaluate(
                        "() => performance.getEntriesByName('batches-refresh').map(m => m.duration)"
                    )
                refresh_ms.extend(measures[1:])  # the first is part of the first render
                page.evaluate("performance.clearMeasures()")
            browser.close()
    finally:
        stack.stop(["api", *STAND_INS])
    result = {
        "batches": count,
        "rows": rows,
        "first_render_s": statistics.median(first_s),
        "first_render_max_s": max(first_s),
        "refresh_ms_p50": statistics.median(refresh_ms),
        "refresh_ms_max": max(refresh_ms),
        "api_pages_s": statistics.median(api_s),
        "target_s": TARGET_S,
    }
    print(
        table(
            f"console: the batch list at {rows:,} rows ({rounds} page loads)",
            ["figure", "median", "max", "target"],
            [
                [
                    "first render (page load to every row)",
                    f"{result['first_render_s']:.2f} s",
                    f"{result['first_render_max_s']:.2f} s",
                    f"< {TARGET_S:g} s",
                ],
                [
                    "one refresh (fetch, compare, redraw)",
                    f"{result['refresh_ms_p50']:.0f} ms",
                    f"{result['refresh_ms_max']:.0f} ms",
                    "under the 1 s poll",
                ],
                [
                    "yardstick: the same pages over httpx, nothing drawn",
                    f"{result['api_pages_s']:.2f} s",
                    "",
                    "",
                ],
            ],
        ),
        flush=True,
    )
    print(
        f"console: drawing costs {result['first_render_s'] / result['api_pages_s']:.2f}x the API pages alone"
    )
    return result
