"""The one-call helper: upload, create with batch-level defaults, wait, download, as the old client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.types import Batch

from deploy.local.stack import Stack
from services.client.batches import EXIT_CODES, run_batch
from services.client.connection import connect
from shared.protocol.messages import SamplingDefaults

pytestmark = pytest.mark.e2e


def test_run_batch_applies_the_defaults_and_writes_both_files(
    stack: Stack, model_id: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    bodies = [
        {"model": model_id, "messages": [{"role": "user", "content": "Count to ten."}]},
        {"model": model_id, "messages": [{"role": "user", "content": "Name colours."}], "max_tokens": 1},
    ]
    source.write_text(
        "\n".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": b})
            for i, b in enumerate(bodies)
        )
    )
    seen: list[Batch] = []

    batch = run_batch(
        source,
        tmp_path / "out.jsonl",
        tmp_path / "err.jsonl",
        client=connect(stack.base_url, stack.api_key),
        defaults=SamplingDefaults(max_decoding_length=2, temperature=0.0),
        poll_s=0.2,
        on_progress=seen.append,
    )

    assert batch.status == "completed" and EXIT_CODES[batch.status] == 0
    assert seen[0].status == "validating" and seen[-1].status == "completed"
    assert (batch.model_extra or {}).get("max_decoding_length") == 2  # echoed on the batch
    usage = {
        line["custom_id"]: line["response"]["body"]["usage"]["completion_tokens"]
        for line in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())
    }
    assert usage.keys() == {"r0", "r1"}
    assert usage["r0"] <= 2 and usage["r1"] <= 1  # the default where the body is silent; the body wins
    assert (tmp_path / "err.jsonl").read_text() == ""
