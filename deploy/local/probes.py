"""Readiness probes (TCP, HTTP health, a signed S3 request), the one polling loop (tenacity), and
one value read from a Prometheus ``/metrics`` page."""

from __future__ import annotations

import io
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from shared.settings import StorageSettings

T = TypeVar("T")
Probe = Callable[[], bool]


def poll_until(check: Callable[[], T], timeout_s: float, interval_s: float = 0.2) -> T:
    """Call ``check`` every ``interval_s`` until it returns something truthy or ``timeout_s`` passed.

    Returns the last value: truthy on success, falsy when time ran out. An exception from ``check``
    propagates at once.
    """
    retrying = Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_fixed(interval_s),
        retry=retry_if_result(lambda value: not value),
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
    )
    return retrying(check)


def wait_ready(ready: Probe, alive: Probe, timeout_s: float) -> str:
    """``"ready"``, ``"exited"`` (the process died first) or ``"timeout"``."""

    def state() -> str:
        if not alive():
            return "exited"
        return "ready" if ready() else ""

    return poll_until(state, timeout_s) or "timeout"


def tcp_ready(port: int, host: str = "127.0.0.1") -> Probe:
    """Something accepts connections on host:port."""

    def check() -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False

    return check


def http_ready(url: str) -> Probe:
    """A GET on ``url`` answers 2xx."""

    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(200 <= response.status < 300)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    return check


READY_PROBE_KEY = "_stack/ready-probe"  # a few bytes the probe writes and reads back


def s3_ready(port: int, storage: StorageSettings) -> Probe:
    """A real signed request: the bucket listing answers (the bucket may not exist yet).

    Once the bucket exists (a restart), the probe also writes and reads back a small object:
    a restarted SeaweedFS answers metadata calls a few seconds before its volume server serves
    data again, and "ready" must mean the stored files can be read.
    """
    listening = tcp_ready(port)

    def check() -> bool:
        if not listening():
            return False
        try:
            client = _s3_client(f"127.0.0.1:{port}", storage)
            if storage.bucket in {b.name for b in client.list_buckets()}:
                return _round_trip(client, storage.bucket)
        except Exception:
            return False
        return True

    return check


def _round_trip(client: Any, bucket: str) -> bool:
    body = b"ready"
    client.put_object(bucket, READY_PROBE_KEY, io.BytesIO(body), len(body))
    response = client.get_object(bucket, READY_PROBE_KEY)
    try:
        return bool(response.read() == body)
    finally:
        response.close()
        response.release_conn()


def _s3_client(endpoint: str, storage: StorageSettings) -> Any:
    import urllib3
    from minio import Minio

    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1, read=3), retries=False)
    return Minio(
        endpoint,
        access_key=storage.access_key,
        secret_key=storage.secret_key,
        secure=False,
        region=storage.region,
        http_client=http,
    )


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def metric_value(url: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` on the ``/metrics`` page at ``url`` whose labels
    include ``labels`` (0 when there is none)."""
    return metric_values(url, name, **labels)[name]


def metric_values(url: str, *names: str, **labels: str) -> dict[str, float]:
    """``metric_value`` of each of ``names`` from one reading of the page. Only the samples' own
    lines are parsed: a vLLM server's page is mostly histograms, slow to parse whole."""
    wanted = [line for line in metrics_text(url).splitlines() if line.startswith(names)]
    values = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families("\n".join(wanted) + "\n"):
        for sample in family.samples:
            if sample.name in values and labels.items() <= sample.labels.items():
                values[sample.name] += sample.value
    return values
