"""Shared pieces of the benchmarks: stacks, process sampling, Mongo polling, input files, tables."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import platform
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from openai import OpenAI

from deploy.local import REPO_ROOT, STAND_INS, ModelSpec, Stack, free_ports
from deploy.local.brokers import Broker, parse_broker
from shared.protocol.messages import result_count
from shared.topics import results_topic

TERMINAL = {"completed", "failed", "expired", "cancelled"}


# ------------------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": model or platform.processor(),
        "logical_cpus": psutil.cpu_count(logical=True),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# --------------------------------------------------------------------------------------- stack


BROKER_ENV = "BATCHSTREAM_BENCH_BROKER"
"""The Kafka-protocol broker of every benchmark's stack (``python -m bench --broker``): tansu or noida."""


def bench_broker() -> Broker:
    try:
        return parse_broker(os.environ.get(BROKER_ENV, ""))
    except ValueError as exc:
        raise SystemExit(f"{BROKER_ENV}: {exc}") from None


def new_stack(models: Sequence[ModelSpec], *, inference_python: str = "", **extra_env: str) -> Stack:
    """A fresh stack on free ports in a temporary state dir, isolated by prefix/database/bucket,
    on the run's broker (``bench_broker``)."""
    run = uuid.uuid4().hex[:8]
    stack = Stack(
        Path(tempfile.mkdtemp(prefix=f"batchstream-bench-{run}-")),
        ports=free_ports(),
        models=list(models),
        topic_prefix=f"b{run}.",
        mongo_database=f"batchstream_b{run}",
        bucket=f"batchstream-b{run}",
        environment="development",
        extra_env=dict(extra_env),
        broker=bench_broker(),
    )
    if inference_python:
        stack.inference_python = inference_python
    return stack


def start_stack(stack: Stack) -> dict[str, float]:
    """Start stand-ins, provision, then the services; returns seconds each start step took."""
    took: dict[str, float] = {}
    t = time.monotonic()
    stack.start(STAND_INS)
    stack.provision()
    took["stand_ins_s"] = time.monotonic() - t
    for name in ["api", "aggregator", *(m.component for m in stack.models)]:
        t = time.monotonic()
        stack.start([name])
        took[f"{name}_start_s"] = time.monotonic() - t
    return took


def service_names(stack: Stack) -> list[str]:
    return [*STAND_INS, "api", "aggregator", *(m.component for m in stack.models)]


# ----------------------------------------------------------------------------------- processes


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    total = 0.0
    for proc in _tree(pid):
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def rss_bytes(pid: int) -> int:
    total = 0
    for proc in _tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


class ProcessSampler:
    """Samples each service's RSS (process tree) in a thread; CPU is read at start and stop."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.2) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.peak_rss: dict[str, int] = dict.fromkeys(pids, 0)
        self.cpu_start: dict[str, float] = {}
        self.cpu_marked: dict[str, float] = {}
        self.cpu_end: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcessSampler:
        self.cpu_start = {n: cpu_seconds(p) for n, p in self.pids.items()}
        self._self_cpu = time.process_time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_end = {n: cpu_seconds(p) for n, p in self.pids.items()}
        self.client_cpu_s = time.process_time() - self._self_cpu

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.peak_rss[name] = max(self.peak_rss[name], rss_bytes(pid))
            self._stop.wait(self.interval_s)

    def mark(self) -> None:
        """Read every service's CPU now: ``cpu_since_mark`` is what they used from here on."""
        self.cpu_marked = {n: cpu_seconds(p) for n, p in self.pids.items()}

    @property
    def cpu(self) -> dict[str, float]:
        return {n: self.cpu_end.get(n, 0.0) - self.cpu_start.get(n, 0.0) for n in self.pids}

    @property
    def cpu_since_mark(self) -> dict[str, float]:
        return {n: self.cpu_end.get(n, 0.0) - self.cpu_marked.get(n, 0.0) for n in self.pids}


# ------------------------------------------------------------------------------------ batches


def create_batch(client: OpenAI, file_id: str) -> tuple[str, float]:
    """A chat-completions batch of the uploaded ``file_id``: its id and when it was created."""
    created = time.time()
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id, created


# ------------------------------------------------------------------------------------ polling


@dataclass
class BatchTrace:
    """What a poller saw of one batch document: status changes and count changes, wall clock."""

    batch_id: str
    status_at: dict[str, float] = field(default_factory=dict)
    emitted_at: float | None = None
    counts: list[tuple[float, int]] = field(default_factory=list)  # (time, completed + failed)
    doc: dict[str, Any] = field(default_factory=dict)

    def done(self) -> bool:
        return self.doc.get("status") in TERMINAL


class MongoPoller:
    """Polls batch documents straight from MongoDB (what the api would answer), in a thread."""

    def __init__(self, stack: Stack, interval_s: float = 0.05) -> None:
        from pymongo import MongoClient

        env = stack.env()
        self._client: MongoClient[dict[str, Any]] = MongoClient(env["BATCHSTREAM_MONGO_URI"])
        self._batches = self._client[env["BATCHSTREAM_MONGO_DATABASE"]]["batches"]
        self.interval_s = interval_s
        self.traces: dict[str, BatchTrace] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, batch_id: str) -> BatchTrace:
        with self._lock:
            return self.traces.setdefault(batch_id, BatchTrace(batch_id))

    def wait(self, batch_id: str, timeout_s: float, what: str = "terminal") -> BatchTrace:
        trace = self.watch(batch_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if what == "terminal" and trace.done():
                return trace
            if what != "terminal" and what in trace.status_at:
                return trace
            time.sleep(self.interval_s / 2)
        raise TimeoutError(f"batch {batch_id} not {what} after {timeout_s:.0f} s: {trace.doc}")

    def completed(self, batch_id: str, timeout_s: float) -> BatchTrace:
        """``wait`` until the batch ends; ``RuntimeError`` unless it completed."""
        trace = self.wait(batch_id, timeout_s)
        if trace.doc.get("status") != "completed":
            raise RuntimeError(f"batch ended {trace.doc.get('status')}: {trace.doc.get('errors')}")
        return trace

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                live = [t for t in self.traces.values() if not t.done()]
            if live:
                ids = [t.batch_id for t in live]
                docs = {d["_id"]: d for d in self._batches.find({"_id": {"$in": ids}})}
                now = time.time()
                for trace in live:
                    doc = docs.get(trace.batch_id)
                    if doc is None:
                        continue
                    trace.doc = doc
                    trace.status_at.setdefault(doc["status"], now)
                    if doc.get("emitted") and trace.emitted_at is None:
                        trace.emitted_at = now
                    counts = doc.get("request_counts") or {}
                    seen = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
                    if not trace.counts or trace.counts[-1][1] != seen:
                        trace.counts.append((now, seen))
            self._stop.wait(self.interval_s)


class ResultsTap:
    """Reads the results topic in a thread and keeps each record's Kafka timestamp by batch id."""

    def __init__(self, stack: Stack) -> None:
        self.settings = stack.kafka_settings()
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        self._ready.wait(30)

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            results_topic(self.settings),
            bootstrap_servers=self.settings.bootstrap_servers,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        self._ready.set()
        try:
            while not self._stop.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=5000)
                now = time.time()
                for records in batches.values():
                    for record in records:
                        key = record.key.decode() if record.key else ""
                        stamp = record.timestamp / 1000 if record.timestamp and record.timestamp > 0 else now
                        self.times[key] += [stamp] * result_count(record.headers)
        finally:
            await consumer.stop()

    def wait_for(self, batch_id: str, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.times.get(batch_id, ())) < count and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


# --------------------------------------------------------------------------------------- files


def chat_line(custom_id: str, model: str, content: str, **body: Any) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], **body},
        }
    )


def write_padded_file(path: Path, lines: int, line_bytes: int, model: str, prefix: str) -> int:
    """A chat batch whose lines are padded with words to about line_bytes each; returns its size."""
    base = len(chat_line(f"{prefix}-{lines}", model, "", max_tokens=16)) + 1
    pad = max(0, line_bytes - base)
    words = ("lorem ipsum dolor sit amet " * (pad // 27 + 1))[:pad]
    with path.open("w") as out:
        for i in range(lines):
            out.write(chat_line(f"{prefix}-{i}", model, words, max_tokens=16) + "\n")
    return path.stat().st_size


# -------------------------------------------------------------------------------------- output


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: Iterable[float]) -> float:
    data = list(values)
    return statistics.median(data) if data else float("nan")


def table(title: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[str(h) for h in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(lines)


def met(ok: bool) -> str:
    """A target's verdict as the tables print it."""
    return "met" if ok else "NOT met"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def default_path(env: str, relative: str) -> str:
    return os.environ.get(env) or str(REPO_ROOT / relative)
