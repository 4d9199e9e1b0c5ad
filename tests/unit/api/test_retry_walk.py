"""Retry's walk of the error lines beside the input (fake services: the HTTP tests run it on the
real stack); what it selects, in what order, and that it stops reading once every line is found."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import IO, Any, cast

import pytest

from services.api.service.retry import RetryService
from shared.errors import InvalidRequest

BOM = b"\xef\xbb\xbf"


def line(custom_id: str) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": custom_id}]}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    ).encode()


def error(custom_id: str, code: str) -> bytes:
    return json.dumps(
        {"custom_id": custom_id, "response": None, "error": {"code": code, "message": "x"}}
    ).encode()


class FakeStreams:
    """The parent's input and error file, served in 5-byte chunks; records what was read."""

    def __init__(self, input_bytes: bytes, error_bytes: bytes) -> None:
        self.objects = {"input": input_bytes, "errors": error_bytes}
        self.closed: list[str] = []
        self.read_to: dict[str, int] = {}

    async def iter_chunks(self, key: str) -> AsyncIterator[bytes]:
        data = self.objects[key]
        try:
            for at in range(0, len(data), 5):
                self.read_to[key] = at + 5
                yield data[at : at + 5]
        finally:
            self.closed.append(key)


class FakeServices:
    """The three services RetryService calls, answering from memory."""

    def __init__(self, streams: FakeStreams) -> None:
        self.store = streams
        self.uploaded = b""
        self.created: Any = None

    # BatchService
    async def document(self, project: str, object_id: str) -> Any:
        if object_id == "batch_1":
            return SimpleNamespace(
                status="completed",
                input_file_id="file-in",
                error_file_id="file-err",
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={"team": "a"},
                priority=0,
                mixed_models=False,
                defaults=SimpleNamespace(model_dump=dict),
            )
        return SimpleNamespace(object_key="input")

    async def create(self, project: str, params: Any) -> Any:
        self.created = params
        return params

    # FileService
    async def upload(self, project: str, stream: IO[bytes], size: int, name: str, purpose: str) -> Any:
        self.uploaded = stream.read(size)
        return SimpleNamespace(id="file-retry")

    # PartialOutputService
    async def open(self, project: str, batch_id: str, kind: str) -> AsyncIterator[bytes]:
        return self.store.iter_chunks("errors")


def retry_service(input_lines: list[bytes], error_lines: list[bytes]) -> tuple[RetryService, FakeServices]:
    streams = FakeStreams(b"\n".join(input_lines) + b"\n", b"\n".join(error_lines) + b"\n")
    fake = FakeServices(streams)
    return RetryService(cast(Any, fake), cast(Any, fake), cast(Any, fake)), fake


async def test_the_failed_lines_are_selected_in_input_order_byte_for_byte() -> None:
    lines = [BOM + line("a"), line("b"), b"", line("c"), line("d"), line("e")]
    errors = [b"not json", error("a", "400"), error("c", "batch_expired"), error("e", "400")]
    service, fake = retry_service(lines, errors)
    await service.retry("p", "batch_1", None)
    assert fake.uploaded == line("a") + b"\n" + line("c") + b"\n" + line("e") + b"\n"  # no BOM
    assert fake.created.metadata == {"team": "a", "retry_of": "batch_1"}
    service, fake = retry_service(lines, errors)
    await service.retry("p", "batch_1", ["batch_expired"])
    assert fake.uploaded == line("c") + b"\n"


async def test_the_input_is_read_only_up_to_the_last_failed_line_and_closed() -> None:
    lines = [line(f"id-{i}") for i in range(200)]
    service, fake = retry_service(lines, [error("id-3", "400")])
    await service.retry("p", "batch_1", None)
    assert fake.uploaded == line("id-3") + b"\n"
    assert fake.store.read_to["input"] < len(fake.store.objects["input"]) // 10
    assert sorted(fake.store.closed) == ["errors", "input"]


async def test_no_matching_error_line_is_a_clear_400() -> None:
    service, _ = retry_service([line("a")], [b"not json", error("a", "400")])
    with pytest.raises(InvalidRequest, match="no error lines with code 500"):
        await service.retry("p", "batch_1", ["500"])
