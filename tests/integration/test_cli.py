"""The ``batchstream`` command against the whole stack, run as a user runs it (a subprocess).

Submit with its progress display and exit statuses, ``--json`` reads, cancel and wait, errors from
the api, and keys made and revoked in the database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.local.stack import Stack
from tests.support.stacks import extra_api
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def command(stack: Stack, *args: str) -> list[str]:
    return [sys.executable, "-m", "services.client", "--base-url", stack.base_url, *args]


def cli_env(stack: Stack, api_key: str | None = None) -> dict[str, str]:
    """The key through the openai SDK's variable, as a user's shell would set it."""
    return {**os.environ, **stack.env(), "OPENAI_API_KEY": api_key or stack.api_key}


def batchstream(stack: Stack, *args: str, api_key: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(stack, *args),
        env=cli_env(stack, api_key),
        capture_output=True,
        text=True,
        timeout=300,
    )


def read_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def write_chat_lines(path: Path, model: str, ids: list[str], **body: Any) -> Path:
    lines = [
        {
            "custom_id": i,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"Say {i}"}], **body},
        }
        for i in ids
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_submit_shows_progress_writes_the_results_and_exits_0(
    stack: Stack, model_id: str, tmp_path: Path
) -> None:
    ids = [f"c{i}" for i in range(6)]
    source = write_chat_lines(tmp_path / "questions.jsonl", model_id, ids)  # no max_tokens in a body

    done = batchstream(stack, "submit", str(source), "--poll", "0.2", "--max-decoding-length", "3")

    assert done.returncode == 0, done.stderr
    output, errors = tmp_path / "questions.output.jsonl", tmp_path / "questions.errors.jsonl"
    results = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ids
    assert all(r["response"]["body"]["usage"]["completion_tokens"] <= 3 for r in results)
    assert errors.read_text() == ""
    progress = done.stderr.splitlines()
    last_bar = next(line for line in reversed(progress) if "6/6" in line)
    assert "completed" in last_bar and "100%" in last_bar
    assert f"6 lines to {output}" in progress[-1]


def test_submit_json_prints_the_final_batch_with_its_defaults(
    stack: Stack, model_id: str, tmp_path: Path
) -> None:
    source = write_chat_lines(tmp_path / "in.jsonl", model_id, ["a", "b"], max_tokens=2)
    write_chat_lines(tmp_path / "more.jsonl", "no-such-model", ["c"])
    source.write_text(source.read_text() + (tmp_path / "more.jsonl").read_text())  # a second model
    out = tmp_path / "out.jsonl"

    batch = read_json(
        batchstream(
            stack,
            "submit",
            str(source),
            "-o",
            str(out),
            "--temperature",
            "0",
            "--json",
            "-m",
            "k=v",
            "--mixed-models",
        )
    )

    assert batch["status"] == "completed" and batch["request_counts"] == {
        "total": 3,
        "completed": 2,
        "failed": 1,
    }
    assert batch["temperature"] == 0 and batch["metadata"] == {"k": "v"} and batch["mixed_models"] is True
    assert len(out.read_text().splitlines()) == 2


def test_a_failed_batch_exits_1_and_lists_every_bad_line(stack: Stack, tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text('{"custom_id": "a"}\nnot json\n')

    done = batchstream(stack, "submit", str(source), "--poll", "0.2")

    assert done.returncode == 1
    assert "line 2: invalid_json_line" in done.stderr
    assert "failed" in done.stderr


def test_reads_print_the_api_s_json(stack: Stack, model_id: str, tmp_path: Path) -> None:
    source = write_chat_lines(tmp_path / "up.jsonl", model_id, ["x"])

    uploaded = read_json(batchstream(stack, "files", "upload", str(source), "--json"))
    assert uploaded["object"] == "file" and uploaded["bytes"] == source.stat().st_size

    listed = read_json(batchstream(stack, "files", "list", "--purpose", "batch", "--json"))
    assert uploaded["id"] in [f["id"] for f in listed["data"]]
    content = batchstream(stack, "files", "download", uploaded["id"])
    assert content.stdout == source.read_text()

    models = read_json(batchstream(stack, "models", "--json"))
    assert model_id in [m["id"] for m in models["data"]]

    deleted = read_json(batchstream(stack, "files", "delete", uploaded["id"], "--json"))
    assert deleted == {"id": uploaded["id"], "object": "file", "deleted": True}
    gone = batchstream(stack, "files", "list", "--json")
    assert uploaded["id"] not in [f["id"] for f in read_json(gone)["data"]]


def test_an_api_error_exits_5_with_the_api_s_message(stack: Stack) -> None:
    done = batchstream(stack, "batches", "get", "batch_does_not_exist")

    assert done.returncode == 5
    assert done.stderr.startswith("error: 404")


def test_wait_follows_a_batch_until_cancelled_and_exits_4(
    stack: Stack, unserved_model: str, tmp_path: Path
) -> None:
    source = write_chat_lines(tmp_path / "stuck.jsonl", unserved_model, ["s1", "s2"])
    created = read_json(batchstream(stack, "submit", str(source), "--no-wait", "--json"))
    batch_id = created["id"]
    wait_until(
        lambda: (
            read_json(batchstream(stack, "batches", "get", batch_id, "--json"))["status"] == "in_progress"
        ),
        60,
        "the batch to start",
    )
    # Interrupting a wait leaves the batch running and says how to follow it.
    waiting = subprocess.Popen(
        command(stack, "batches", "wait", batch_id, "--poll", "0.2"),
        env=cli_env(stack),
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a test run started in the background of a shell without job
        # control ignores SIGINT, and its children would inherit that (Python then installs no
        # KeyboardInterrupt handler).
        preexec_fn=_sigint_default,
    )
    assert waiting.stderr is not None
    assert batch_id in waiting.stderr.readline()  # its first progress line: it is waiting
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(30) == 130
    assert f"batchstream batches wait {batch_id}" in waiting.stderr.read()

    listed = read_json(batchstream(stack, "batches", "list", "--json"))
    assert batch_id in [b["id"] for b in listed["data"]]
    cancelled = read_json(batchstream(stack, "batches", "cancel", batch_id, "--json"))
    assert cancelled["status"] in ("cancelling", "cancelled")

    done = batchstream(stack, "batches", "wait", batch_id, "--poll", "0.2", "--json")
    assert done.returncode == 4, done.stderr
    assert json.loads(done.stdout)["status"] == "cancelled"


def test_a_key_revoked_by_its_id_is_refused_by_every_replica_within_a_second(stack: Stack) -> None:
    made = read_json(batchstream(stack, "keys", "create", "--project", "cli-team", "--json"))
    key, key_id = made["key"], made["id"]
    assert made["project"] == "cli-team" and key.startswith("sk-bs-") and key_id.startswith("key_")
    listed = read_json(batchstream(stack, "keys", "list", "--project", "cli-team", "--json"))["data"]
    assert [(k["id"], k["revoked_at"]) for k in listed] == [(key_id, None)]
    assert key not in json.dumps(listed)  # a listing never shows a key
    with extra_api(stack) as replica:
        bases = [stack.base_url.removesuffix("/v1"), replica]

        def answers(base: str) -> int:
            return httpx.get(
                f"{base}/v1/files", headers={"Authorization": f"Bearer {key}"}, timeout=5
            ).status_code

        assert [answers(b) for b in bases] == [200, 200]  # each replica has the key cached now
        assert batchstream(stack, "keys", "revoke", key_id).returncode == 0
        revoked = time.monotonic()
        wait_until(lambda: [answers(b) for b in bases] == [401, 401], 5, "every replica to refuse the key")
        print(f"\nrefused by both replicas {time.monotonic() - revoked:.2f} s after the revoke")
    listed = read_json(batchstream(stack, "keys", "list", "--project", "cli-team", "--json"))["data"]
    assert listed[0]["revoked_at"] is not None
    assert batchstream(stack, "keys", "revoke", "sk-bs-never-made").returncode == 1
    assert batchstream(stack, "keys", "revoke", "key_00000000000000000000").returncode == 1


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_retry_makes_a_batch_of_the_failed_lines_and_waits_for_it(
    stack: Stack, model_id: str, tmp_path: Path
) -> None:
    source = tmp_path / "mixed.jsonl"
    write_chat_lines(source, model_id, ["fine"], max_tokens=2)
    too_long = {"custom_id": "long", "method": "POST", "url": "/v1/chat/completions"}
    too_long["body"] = {
        "model": model_id,
        "messages": [{"role": "user", "content": "hi " * 5000}],
        "max_tokens": 2,
    }
    with source.open("a") as handle:
        handle.write(json.dumps(too_long) + "\n")
    parent = read_json(batchstream(stack, "submit", str(source), "--json"))
    assert parent["request_counts"]["failed"] == 1
    done = batchstream(stack, "retry", parent["id"], "--code", "400", "--wait", "--json")
    assert done.returncode == 0, done.stderr  # completed: its one line failed again, as it must
    child = json.loads(done.stdout)
    assert child["metadata"]["retry_of"] == parent["id"]
    assert child["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    nothing = batchstream(stack, "retry", parent["id"], "--code", "batch_expired")
    assert nothing.returncode == 5 and "no error lines with code batch_expired" in nothing.stderr


def test_messages_submits_a_message_batch_file_and_writes_its_results(
    stack: Stack, model_id: str, tmp_path: Path
) -> None:
    ask = {"model": model_id, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    path = tmp_path / "claude.jsonl"
    path.write_text("".join(json.dumps({"custom_id": f"m{i}", "params": ask}) + "\n" for i in range(3)))
    done = batchstream(stack, "messages", str(path))
    assert done.returncode == 0, done.stderr
    assert "completed: 3 results to" in done.stderr
    results = [json.loads(line) for line in (tmp_path / "claude.results.jsonl").read_text().splitlines()]
    assert sorted(r["custom_id"] for r in results) == ["m0", "m1", "m2"]
    assert {r["result"]["type"] for r in results} == {"succeeded"}
    assert results[0]["result"]["message"]["type"] == "message"

    path.write_text(json.dumps({"custom_id": "bad one", "params": ask}) + "\n")
    refused = batchstream(stack, "messages", str(path))
    assert refused.returncode == 5
    assert (
        "error: 400 1 invalid request: requests[0] (custom_id 'bad one'): custom_id must be" in refused.stderr
    )
