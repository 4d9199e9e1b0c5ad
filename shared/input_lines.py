"""How a batch input file is split and numbered: the one rule every service follows.

Line ``n`` is the ``n``-th line of the file, 1-based, blank lines counted; a line holding only
whitespace is no request: it is skipped (no message, no output or error line) but keeps its
number, so the validator's error lines, the dispatcher's messages, the aggregator's fill lines and
the partial output all name a line the same way. ``start`` is the line's byte offset in the file.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InputLine:
    number: int  # 1-based line of the input file, blank lines included
    start: int  # byte offset of the line in the file
    raw: bytes  # without the newline


def is_request(raw: bytes) -> bool:
    """Whether a line is a request line (blank lines are skipped, their numbers kept)."""
    return bool(raw) and not raw.isspace()  # as ``raw.strip()``, without copying the line


async def split_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes]:
    """The lines of a stream of chunks (without the newline), holding one line at a time."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line
    if pending:
        yield pending


async def numbered_lines(
    chunks: AsyncIterator[bytes], number: int = 1, start: int = 0
) -> AsyncGenerator[InputLine]:
    """Every line of a file read from line ``number`` at byte ``start`` (blank lines included)."""
    async for raw in split_lines(chunks):
        yield InputLine(number, start, raw)
        number, start = number + 1, start + len(raw) + 1


async def request_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[InputLine]:
    """The request lines of a whole file, numbered by the rule above."""
    async for line in numbered_lines(chunks):
        if is_request(line.raw):
            yield line
