"""The prefix benchmark's ideal, from the prompts' token ids: each distinct prefix computed once,
and the smallest max_model_len that holds every line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

IDEAL_SCRIPT = r"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
block = int(sys.argv[3])
seqs = []
for raw in open(sys.argv[2]):
    if raw.strip():
        body = json.loads(raw)["body"]
        ids = tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        seqs.append(tuple(ids))
seqs.sort()
def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
shared = [lcp(seqs[i - 1], seqs[i]) for i in range(1, len(seqs))]
ideal = sum(len(s) for s in seqs) - sum((n // block) * block for n in shared)
# Tokens of the prefixes two or more lines share, each counted once: what a cache must hold.
distinct = sum(max(0, shared[i] - (shared[i - 1] if i else 0)) for i in range(len(shared)))
total = sum(len(s) for s in seqs)
longest = max((len(s) for s in seqs), default=0)
figures = {"prompt_tokens": total, "ideal_computed": ideal, "distinct_shared": distinct, "longest": longest}
print(json.dumps(figures))
"""


def ideal(python: str, model_dir: str, input_path: Path, block: int) -> dict[str, int]:
    """Prompt tokens; the prefill tokens of each distinct prefix computed once (whole blocks);
    the tokens of the shared prefixes (what the KV cache must hold for the ideal); the longest
    prompt."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [python, "-c", IDEAL_SCRIPT, model_dir, str(input_path), str(block)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def fitting_model_len(lines: list[str], longest_prompt: int, block: int, fallback: int) -> int:
    """The smallest max_model_len (whole KV blocks) that holds every line: vLLM refuses a KV
    cache smaller than one request of max_model_len, so this sets how small a cache can be.
    ``fallback`` when a line leaves its output length to the engine."""
    outputs = []
    for raw in lines:
        body = json.loads(raw).get("body") or {}
        out = body.get("max_completion_tokens") or body.get("max_tokens")
        if not isinstance(out, int):
            return fallback
        outputs.append(out)
    need = longest_prompt + max(outputs, default=0) + 1
    return -(-need // block) * block
