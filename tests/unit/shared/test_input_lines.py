"""How every service splits an input file into numbered lines (shared/input_lines.py): the same
lines whatever the chunking, a line over the limit counted but never held, linear time."""

from __future__ import annotations

import random
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterable

import pytest

from shared.input_lines import InputLine, numbered_lines, request_lines, split_lines

MiB = 1024 * 1024


async def chunks_of(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def cut(data: bytes, sizes: Iterable[int]) -> list[bytes]:
    out, at = [], 0
    for size in sizes:
        out.append(data[at : at + size])
        at += size
    if at < len(data):
        out.append(data[at:])
    return out


def expected(data: bytes, limit: int | None) -> list[InputLine]:
    """The rule, written the obvious way over the whole file."""
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    lines, start = [], 0
    for number, raw in enumerate(pieces, 1):
        over = limit is not None and len(raw) > limit
        lines.append(InputLine(number, start, b"" if over else raw, len(raw) if over else 0))
        start += len(raw) + 1
    return lines


async def read(parts: list[bytes], limit: int | None = None) -> list[InputLine]:
    return [line async for line in numbered_lines(chunks_of(parts), max_line_bytes=limit)]


@pytest.mark.parametrize("limit", [None, 0, 3, 4, 5, 9])
async def test_any_chunking_gives_the_same_lines_as_the_whole_file(limit: int | None) -> None:
    rng = random.Random(limit)
    for _ in range(300):
        data = bytes(rng.choice(b"ab\n") for _ in range(rng.randrange(0, 40)))
        sizes = [rng.randrange(0, 7) for _ in range(rng.randrange(0, 12))]
        assert await read(cut(data, sizes), limit) == expected(data, limit), (data, sizes)


async def test_a_line_of_exactly_the_limit_is_kept_and_one_byte_more_is_not() -> None:
    data = b"x" * 8 + b"\n" + b"y" * 9 + b"\n" + b"z" * 8
    for parts in ([data], cut(data, [3] * 9), cut(data, [8, 1, 9, 1])):
        lines = await read(parts, limit=8)
        assert [(line.number, line.start, line.raw, line.oversize) for line in lines] == [
            (1, 0, b"x" * 8, 0),
            (2, 9, b"", 9),
            (3, 19, b"z" * 8, 0),
        ]
        assert [line.size for line in lines] == [8, 9, 8]


async def test_an_oversized_line_is_a_request_line_and_numbering_goes_on_after_it() -> None:
    data = b'{"a": 1}\n\n' + b"q" * 100 + b'\n  \n{"b": 2}'
    lines = [line async for line in request_lines(chunks_of(cut(data, [7] * 30)), max_line_bytes=50)]
    assert [(line.number, line.raw, line.oversize) for line in lines] == [
        (1, b'{"a": 1}', 0),
        (3, b"", 100),
        (5, b'{"b": 2}', 0),
    ]


async def test_split_lines_keeps_blank_lines_and_a_last_line_without_newline() -> None:
    got = [raw async for raw in split_lines(chunks_of([b"a\n", b"\nb", b"c"]))]
    assert got == [b"a", b"", b"bc"]


async def test_a_64_mb_line_without_newline_is_never_held_over_the_limit() -> None:
    chunk = b"x" * (256 * 1024)  # the same object each time: only what the reader keeps counts
    tracemalloc.start()
    try:
        lines = await read([b'{"ok": 1}\n', *([chunk] * 256)], limit=1 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(line.number, line.oversize) for line in lines] == [(1, 0), (2, 64 * MiB)]
    assert lines[1].start == 10
    assert peak < 3 * MiB, f"held {peak} bytes for a line over a 1 MiB limit"


async def test_a_long_line_is_read_in_linear_time() -> None:
    # Adding each chunk to the pending bytes made this quadratic: 64 MB took 5.4 s in 256 KB chunks.
    chunk = b"y" * (64 * 1024)
    started = time.monotonic()
    lines = await read([chunk] * 1024 + [b"\nend"])
    took = time.monotonic() - started
    assert [line.size for line in lines] == [64 * MiB, 3]
    assert took < 3.0, f"a 64 MiB line took {took:.1f} s"
