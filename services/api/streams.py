"""Streamed downloads read their first chunk before the status line goes out.

A ``StreamingResponse`` sends ``200`` before its body is read; if object storage is down by then,
the client gets a 200 and a broken or hanging body. Reading the first chunk inside the route makes
an outage a 503 with ``Retry-After`` (errors.py), like every other call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator


async def opened(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` with its first chunk already read; the same bytes, in the same order."""
    first = await anext(chunks, None)

    async def stream() -> AsyncIterator[bytes]:
        if first is not None:
            yield first
        async for chunk in chunks:
            yield chunk

    return stream()
