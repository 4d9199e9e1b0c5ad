"""The tenants benchmark's HTTP clients: a project's client for the public Files and Batches API,
and the ``/health`` probe polling from a thread of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import TERMINAL, percentile

CHAT = "/v1/chat/completions"
POLL_S = 0.1


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
