"""The line spool gives back exactly the lines validation read, blank and odd ones included."""

from __future__ import annotations

from collections.abc import AsyncIterator

from services.api.service.spool import LineSpool


async def _lines(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def test_the_spool_returns_every_line_as_read() -> None:
    items = [b'{"a": 1}', b"", b"  ", b"trailing\r", b"\xff\xfe bytes", b'{"b": 2}'] * 700
    with LineSpool() as spool:
        passed = [line async for line in spool.tee(_lines(items))]
        again = [line async for line in spool.lines()]
    assert passed == items and again == items
