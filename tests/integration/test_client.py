"""The one-step client uploads, creates, waits with a progress display, and downloads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.local.stack import Stack
from tests.support.lines import chat_request, jsonl, parse_jsonl

pytestmark = pytest.mark.e2e


def run_client(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.api.client", *args, "--base-url", stack.base_url, "--poll", "0.3"],
        env={**os.environ, "OPENAI_API_KEY": stack.api_key},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_client_runs_a_batch_and_writes_its_output(stack: Stack, model_id: str, tmp_path: Path) -> None:
    ids = [f"c{i}" for i in range(6)]
    lines = [chat_request(i, model_id, i, max_tokens=4) for i in ids]
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(lines))
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"

    done = run_client(stack, str(source), "--output", str(out), "--errors", str(errors))

    assert done.returncode == 0, done.stderr
    assert [x["custom_id"] for x in parse_jsonl(out.read_text())] == ids
    assert errors.read_text() == ""
    progress = done.stderr.splitlines()
    assert progress[-1].split()[1:3] == ["completed", "6/6"]
    assert "100.0%" in progress[-1]


def test_the_client_reports_a_failed_batch_line_by_line(stack: Stack, model_id: str, tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text('{"custom_id": "a"}\nnot json\n')

    done = run_client(stack, str(source), "--output", str(tmp_path / "out.jsonl"))

    assert done.returncode == 1
    assert "line 2: invalid_json_line" in done.stderr
    assert "failed" in done.stderr
