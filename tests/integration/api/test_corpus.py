"""The bad-input corpus (tests/integration/api/corpus.py) against a running api.

Every malformed request gets its exact status and error code in OpenAI's shape; every malformed
input file makes its batch end ``failed`` with exactly the line errors listed (a valid one
completes); and after the whole corpus the same api process is healthy and completes a batch.
The stack is the api, the aggregator and a worker on the instant fake engine: no vLLM.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from deploy.local import ModelSpec, Stack
from tests.integration.api.corpus import (
    BATCH_BYTE_CAP,
    BYTE_CAP,
    CHAT,
    ECHOED_BYTES,
    FILE_CASES,
    LINE_BYTE_CAP,
    LINE_CAP,
    LIST_BYTES,
    MESSAGE_CAP,
    MODEL,
    OTHER_MODEL,
    REQUEST_CASES,
    FileCase,
    MiB,
    RequestCase,
    body,
    dump,
    line,
)
from tests.support.http_batches import assert_error, upload, wait_http_terminal
from tests.support.stacks import FAKE_STACK_ENV, OwnStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def corpus_stack(own_stack: OwnStack) -> Iterator[Stack]:
    models = [ModelSpec("", MODEL, engine="fake"), ModelSpec("", OTHER_MODEL, engine="fake")]
    env = {
        **FAKE_STACK_ENV,
        "BATCHSTREAM_API_MAX_BATCH_INPUT_BYTES": str(BATCH_BYTE_CAP),
        "BATCHSTREAM_API_MAX_BATCH_LINES": str(LINE_CAP),
        "BATCHSTREAM_API_MAX_FILE_BYTES": str(BYTE_CAP),
        "BATCHSTREAM_API_MAX_LIST_BYTES": str(LIST_BYTES),
        "BATCHSTREAM_API_MAX_LINE_BYTES": str(LINE_BYTE_CAP),
        "BATCHSTREAM_KAFKA_MAX_REQUEST_BYTES": str(MESSAGE_CAP),
    }
    components = ["api", "aggregator", *(m.component for m in models)]
    with own_stack("corpus", components, models=models, extra_env=env) as stack:
        yield stack


@pytest.fixture(scope="module")
def api(corpus_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=corpus_stack.base_url.removesuffix("/v1"), timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def keys(corpus_stack: Stack) -> dict[str, str]:
    return {"own": corpus_stack.api_key, "other": corpus_stack.create_key("corpus-other-team")}


@pytest.fixture(scope="module")
def api_pid(corpus_stack: Stack) -> int:
    """The api's PID before the corpus: the same process must answer after it."""
    pid = corpus_stack.pid("api")
    assert pid is not None
    return pid


def own_upload(api: httpx.Client, keys: dict[str, str], data: bytes, purpose: str = "batch") -> str:
    return str(upload(api, data, purpose=purpose, headers=auth(keys, "own"))["id"])


def auth(keys: dict[str, str], who: str | None) -> dict[str, str]:
    if who is None:
        return {}
    return {"Authorization": f"Bearer {keys[who]}" if who in keys else who}


@pytest.fixture(scope="module")
def ids(api: httpx.Client, keys: dict[str, str], api_pid: int) -> dict[str, str]:
    """Ids the request cases refer to: a user_data file, a batch input file and a running batch."""
    batch_file = own_upload(api, keys, dump(line()))
    batch = api.post(
        "/v1/batches",
        headers=auth(keys, "own"),
        json={"input_file_id": batch_file, "endpoint": CHAT, "completion_window": "24h"},
    )
    assert batch.status_code == 200, batch.text
    return {
        "own_file": own_upload(api, keys, b"notes", purpose="user_data"),
        "batch_file": batch_file,
        "own_batch": batch.json()["id"],
    }


def fill(value: Any, ids: dict[str, str]) -> Any:
    """Put the fixture's ids into a case's path or body (placeholders like ``{own_file}``)."""
    if isinstance(value, str):
        for name, real in ids.items():
            value = value.replace("{" + name + "}", real)
        return value
    if isinstance(value, dict):
        return {k: fill(v, ids) for k, v in value.items()}
    return value


def _marks(reason: str | None) -> list[pytest.MarkDecorator]:
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c.xfail)) for c in REQUEST_CASES])
def test_a_malformed_request_gets_its_status_and_code(
    api: httpx.Client, keys: dict[str, str], ids: dict[str, str], case: RequestCase
) -> None:
    kwargs = fill(case.kwargs, ids)
    headers = {**auth(keys, case.auth), **kwargs.pop("headers", {})}
    started = time.monotonic()
    response = api.request(case.method, fill(case.path, ids), headers=headers, **kwargs)
    assert time.monotonic() - started < 10, "a bad request must be answered at once"
    assert_error(response, case.status, case.code, case.param)
    assert len(response.content) <= ECHOED_BYTES, "an answer quotes a client's value only cut short"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c.xfail)) for c in FILE_CASES])
def test_a_malformed_input_file_fails_its_batch_with_its_line_errors(
    api: httpx.Client, keys: dict[str, str], api_pid: int, case: FileCase
) -> None:
    file_id = own_upload(api, keys, case.make())
    created = api.post(
        "/v1/batches",
        headers=auth(keys, "own"),
        json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
    )
    assert created.status_code == 200, created.text
    beside = small_batch(api, keys, "other", MODEL) if case.beside else None
    batch = wait_http_terminal(api, created.json()["id"], case.timeout_s, headers=auth(keys, "own"))
    if beside is not None:
        other = wait_http_terminal(api, beside, 30, headers=auth(keys, "other"))
        assert other["status"] == "completed" and other["request_counts"]["completed"] == 3, other
    if case.codes is None:
        assert batch["status"] == "completed", batch
        counts = batch["request_counts"]
        assert (counts["completed"], counts["failed"]) == (case.completed, 0), batch
        return
    assert batch["status"] == "failed", batch
    assert all(len(json.dumps(e)) <= ECHOED_BYTES for e in batch["errors"]["data"]), batch["errors"]
    found = [(e["line"], e["code"]) for e in batch["errors"]["data"]]
    assert found[: len(case.codes)] == case.codes, batch["errors"]
    if case.message is not None:
        assert case.message in batch["errors"]["data"][0]["message"], batch["errors"]


def small_batch(api: httpx.Client, keys: dict[str, str], who: str, model: str, *lines: bytes) -> str:
    """A batch of ``who``'s (three small lines of ``model`` unless ``lines`` are given): its id."""
    items = lines or tuple(dump(line(f"{who}-{n}", body=body(model=model))) for n in range(3))
    file_id = upload(api, b"\n".join(items), headers=auth(keys, who))["id"]
    created = api.post(
        "/v1/batches",
        headers=auth(keys, who),
        json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
    )
    assert created.status_code == 200, created.text
    return str(created.json()["id"])


def test_a_line_the_producer_refuses_is_its_own_error_while_the_batch_and_another_model_complete(
    api: httpx.Client, keys: dict[str, str]
) -> None:
    # Under the line cap, over the producers' largest message (MESSAGE_CAP): it validates, then
    # cannot be sent; the lines around it and another project's batch of another model run.
    big = dump(line("big", body=body(messages=[{"role": "user", "content": "w" * (MESSAGE_CAP + 1000)}])))
    assert MESSAGE_CAP < len(big) <= LINE_BYTE_CAP
    refused = small_batch(api, keys, "own", MODEL, dump(line("before")), big, dump(line("after")))
    other = small_batch(api, keys, "other", OTHER_MODEL)
    batch = wait_http_terminal(api, refused, 30, headers=auth(keys, "own"))
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}, batch
    errors = api.get(f"/v1/files/{batch['error_file_id']}/content", headers=auth(keys, "own")).text
    [error_line] = [json.loads(x) for x in errors.split("\n") if x]
    assert error_line["custom_id"] == "big"
    assert error_line["error"]["code"] == "line_undeliverable", error_line
    assert f"the largest message sent is {MESSAGE_CAP} bytes" in error_line["error"]["message"]
    assert wait_http_terminal(api, other, 30, headers=auth(keys, "other"))["status"] == "completed"


def test_a_body_over_the_largest_upload_is_refused_while_it_streams(
    api: httpx.Client, keys: dict[str, str], corpus_stack: Stack
) -> None:
    """No Content-Length (a chunked body): the api counts the bytes as they come and answers 413
    once they pass the largest upload; it writes (spools) no more of the body than that."""

    def body_chunks() -> Iterator[bytes]:
        yield b'--xyz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
        for _ in range(2 * BATCH_BYTE_CAP // MiB):
            yield b"x" * MiB

    api_process = psutil.Process(corpus_stack.pid("api"))
    written = api_process.io_counters().write_chars
    headers = {**auth(keys, "own"), "content-type": "multipart/form-data; boundary=xyz"}
    response = api.post("/v1/files", content=body_chunks(), headers=headers)
    assert_error(response, 413, "file_too_large", "file")
    assert str(BATCH_BYTE_CAP) in response.json()["error"]["message"]
    written = api_process.io_counters().write_chars - written
    assert written < BATCH_BYTE_CAP + 8 * MiB, f"the api wrote {written} bytes of a body it refused"


def pages(api: httpx.Client, keys: dict[str, str], path: str, limit: int) -> list[list[dict[str, Any]]]:
    """Every page of a list, each read ``after`` the last one's ``last_id``."""
    found, after = [], None
    while True:
        params = {"limit": limit, **({"after": after} if after else {})}
        listed = api.get(path, params=params, headers=auth(keys, "own")).json()
        found.append(listed["data"])
        if not listed["has_more"]:
            return found
        after = listed["last_id"]


@pytest.mark.parametrize(("path", "limit"), [("/v1/batches", 100), ("/v1/files", 10_000)])
def test_the_corpus_lists_in_pages_within_the_budget_that_reach_every_item(
    api: httpx.Client, keys: dict[str, str], api_pid: int, path: str, limit: int
) -> None:
    budgeted = pages(api, keys, path, limit)
    assert len(budgeted) > 1, "the corpus's objects should take more than one page of LIST_BYTES"
    for page in budgeted:
        size = len(json.dumps(page, ensure_ascii=False, separators=(",", ":")).encode())
        assert len(page) == 1 or size <= LIST_BYTES, (len(page), size)
    one_by_one = pages(api, keys, path, 1)
    assert [item["id"] for page in budgeted for item in page] == [
        item["id"] for page in one_by_one for item in page
    ]


def test_after_the_corpus_the_same_api_is_healthy_and_completes_a_batch(
    api: httpx.Client, keys: dict[str, str], api_pid: int, corpus_stack: Stack
) -> None:
    assert corpus_stack.pid("api") == api_pid, "the api process was restarted during the corpus"
    assert api.get("/health").json() == {"status": "healthy"}
    file_id = own_upload(api, keys, dump(*(line(f"after-{n}") for n in range(20))))
    created = api.post(
        "/v1/batches",
        headers=auth(keys, "own"),
        json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
    )
    batch = wait_http_terminal(api, created.json()["id"], 60, headers=auth(keys, "own"))
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
    output = api.get(f"/v1/files/{batch['output_file_id']}/content", headers=auth(keys, "own")).text
    found = sorted(json.loads(x)["custom_id"] for x in output.split("\n") if x)
    assert found == sorted(f"after-{n}" for n in range(20))
