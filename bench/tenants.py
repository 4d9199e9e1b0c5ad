"""Tenants: a project flooding the service beside a well-behaved one (``python -m bench --only
tenants``).

One stack with two projects' keys (``good`` and ``flood``), then two measurements:

1. **The fair share.** The good project's batch (``--tenants-good-lines``) alone on the idle
   stack (the median of ``--tenants-alone-runs``, after an untimed warm-up batch), then the same
   batch beside a flood the other project started first: ``--tenants-flood-batches`` small
   batches, ``--tenants-priority-batches`` large ones created with ``"priority": 100``, a file
   with one ``--tenants-huge-line-mb`` line among short ones and a file ending in a line of
   ``--tenants-over-line-mb`` (over any line limit set below the broker's message limit), all
   created before the good batch and still running when it ends. Each batch is timed from its
   create call to the first poll (every 0.1 s) that sees it ``completed``. Target: beside the
   flood within 2x alone, the fair share of two projects. Also printed: the good project's share
   of the lines finished while both ran (from the batches' live ``request_counts``), and every
   flood create's answer; a refusal (413, 429, a batch ``failed``) is counted, not an error.
2. **The api stays responsive under a giant line.** ``GET /health`` polled every
   ``--tenants-health-interval-ms`` from a thread of its own while the flood project uploads a
   ``--tenants-giant-mb`` file of one line with no newline and creates a batch of it, until the
   batch leaves ``validating`` (or the upload is refused). Targets: /health p99 < 250 ms and the
   api's peak RSS (its process tree, sampled every 0.1 s) < 300 MiB. The same poll on the idle
   stack is printed beside it.

The engine is the fake one, **paced**, with places: each line takes ``--tenants-line-seconds``
and at most ``--tenants-places`` run at once (``BATCHSTREAM_INFERENCE_FAKE_MAX_RUNNING``, as
vLLM's ``max_num_seqs``), so the model serves a fixed number of lines per second whatever else the
cores do, as a GPU would. That capacity is what the two projects share. As with vLLM, the worker
holds sixteen times as many lines as the engine has places, and gives each freed place to the
project, then the batch, with the fewest lines on the engine (``services/inference/engine_places.py``):
the lines the dispatcher keeps ahead in the topic wait in the worker, where a new batch's go
first. The instant engine has no capacity to share (its batches are bound by the plumbing's CPU,
which fairness does not apportion); the tiny vLLM model (``--tenants-engine vllm``) on this CPU
shares both cores with the flood's uploads and validation, so its ratio would mostly measure that;
``--tenants-engine sim`` runs the simulated GPU (``--sim-*``: ratios only, docs/benchmarks.md).

Only the public HTTP API is used (httpx), so the benchmark runs on any version of the api.

This module starts the stack and runs both; the input files, the HTTP clients, the measurements
and the tables are in ``tenants_files``, ``tenants_client``, ``tenants_measure`` and
``tenants_report``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench.common import new_stack, start_stack
from bench.simulated import SIM_PROFILE, sim_env
from bench.tenants_client import HealthProbe, Tenant
from bench.tenants_files import LINE_MAX_TOKENS
from bench.tenants_measure import fair_share, giant_line
from bench.tenants_report import print_report
from deploy.local import ModelSpec

FAKE_MODEL = "fake-model"
VLLM_MODEL = "tiny-llama"
SIM_MODEL = "sim-model"
KEYS = {"good": "sk-tenants-good", "flood": "sk-tenants-flood"}


def engine(args: Any) -> tuple[ModelSpec, dict[str, str], str]:
    """The model spec, the worker's settings and a description of the engine."""
    if args.tenants_engine == "vllm":
        if not Path(args.model_dir, "config.json").exists():
            raise SystemExit(f"no model at {args.model_dir} (run `make test` or `make up UP_MODEL=tiny`)")
        return ModelSpec(args.model_dir, VLLM_MODEL), {}, f"vLLM {Path(args.model_dir).name}"
    if args.tenants_engine == "sim" or getattr(args, "engine", "") == "sim":
        return ModelSpec("", SIM_MODEL, engine="sim"), sim_env(args), f"simulated GPU ({SIM_PROFILE.name})"
    pace = args.tenants_line_seconds / LINE_MAX_TOKENS
    env = {
        "BATCHSTREAM_INFERENCE_FAKE_SECONDS_PER_TOKEN": f"{pace:g}",
        "BATCHSTREAM_INFERENCE_FAKE_MAX_RUNNING": str(args.tenants_places),
        "BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(args.tenants_places),  # the worker's window: 16x
        "BATCHSTREAM_INFERENCE_ENGINE_QUEUE_LINES": "0",  # none wait inside the engine: it runs them
    }
    capacity = args.tenants_places / args.tenants_line_seconds
    what = (
        f"paced fake engine, {args.tenants_line_seconds:g} s a line x {args.tenants_places} places "
        f"= {capacity:,.0f} lines/s"
    )
    return ModelSpec("", FAKE_MODEL, engine="fake"), env, what


def run(args: Any) -> dict[str, Any]:
    spec, engine_env, what = engine(args)
    keys = ",".join(f"{key}={project}" for project, key in KEYS.items())
    stack = new_stack(
        [spec], inference_python=args.inference_python, BATCHSTREAM_API_KEYS=keys, **engine_env, **args.env
    )
    work = Path(tempfile.mkdtemp(prefix="batchstream-tenants-"))
    print(f"tenants: starting the stack ({what}) ...", flush=True)
    good = Tenant(stack.base_url, "good", KEYS["good"])
    flood = Tenant(stack.base_url, "flood", KEYS["flood"])
    try:
        startup = start_stack(stack)
        health_url = stack.base_url.removesuffix("/v1") + "/health"
        with HealthProbe(health_url, args.tenants_health_interval_ms / 1000) as probe:
            share = fair_share(args, good, flood, probe, work, spec.served_name)
            giant = giant_line(args, stack, flood, probe, work, spec.served_name)
    finally:
        good.close()
        flood.close()
        stack.stop()
        for leftover in work.iterdir():
            leftover.unlink()
        work.rmdir()
    result = {
        "engine": what,
        "startup": startup,
        "fair_share": share,
        "giant_line": giant,
        "settings": {k: v for k, v in vars(args).items() if k.startswith("tenants_")},
    }
    print_report(result)
    return result
