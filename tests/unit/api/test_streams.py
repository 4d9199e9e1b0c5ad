"""``opened`` reads the first chunk at once and then streams the same bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.api.streams import opened


async def chunks(log: list[str], parts: list[bytes], fail_at: int | None = None) -> AsyncIterator[bytes]:
    for n, part in enumerate(parts):
        if n == fail_at:
            raise ConnectionError("storage down")
        log.append(f"read {n}")
        yield part


async def test_the_first_chunk_is_read_before_the_stream_is_returned() -> None:
    log: list[str] = []
    stream = await opened(chunks(log, [b"a", b"b", b"c"]))
    assert log == ["read 0"]
    assert [part async for part in stream] == [b"a", b"b", b"c"]


async def test_a_failure_opening_the_source_raises_in_the_route() -> None:
    with pytest.raises(ConnectionError):
        await opened(chunks([], [b"a"], fail_at=0))


async def test_an_empty_source_streams_nothing() -> None:
    assert [part async for part in await opened(chunks([], []))] == []
