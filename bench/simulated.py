"""The simulated GPU in the benchmarks (``--engine sim``): the worker's settings for it, and a
request file run straight on it in simulated time, as ``vllm run-batch`` runs a file on its
engine (every line queued at once, in the file's order).

Its figures are ratios between orders and policies on the same simulated engine, never claims
about hardware (docs/benchmarks.md, "The simulated GPU").
"""

from __future__ import annotations

import json
from typing import Any

from services.inference.sim_gpu import (
    PROFILE,
    SimGpu,
    SimSequence,
    output_length,
    prompt_blocks,
    prompt_words,
)

SIM_PROFILE = PROFILE


def sim_env(args: Any) -> dict[str, str]:
    """The worker's settings for the simulated GPU (the benchmark's ``--sim-*`` options)."""
    return {
        "BATCHSTREAM_INFERENCE_SIM_SPEEDUP": f"{args.sim_speedup:g}",
        "BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(args.sim_max_num_seqs),
        "BATCHSTREAM_INFERENCE_MAX_MODEL_LEN": str(args.sim_max_model_len),
    }


def run_file(lines: list[str], max_num_seqs: int, max_model_len: int) -> list[float]:
    """Each line's finish time in simulated seconds (in the file's order), the file run on the
    simulated GPU as run-batch runs it: every line queued at once, first come first served."""
    gpu = SimGpu(PROFILE, max_num_seqs)
    seqs = []
    for raw in lines:
        body = json.loads(raw)["body"]
        prompt = prompt_words(body.get("messages"))
        seq = SimSequence(max(1, len(prompt)), output_length(body, max_model_len - len(prompt), prompt))
        seq.blocks = prompt_blocks(prompt)
        gpu.submit(seq)
        seqs.append(seq)
    while (due := gpu.next_event_at()) is not None:
        gpu.advance(due)
    return [s.finished_at or 0.0 for s in seqs]
