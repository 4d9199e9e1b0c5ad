"""The tenants benchmark's input files: batches of short lines, and lines of an exact size in
bytes (a huge line among short ones, a giant one-line file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import chat_line

LINE_MAX_TOKENS = 16  # the paced engine takes seconds_per_token x max_tokens per line
MB = 1_000_000
WORD = "word "  # a prompt of words: any engine counts it as many tokens (over the context)


def write_lines(path: Path, lines: int, model: str, prefix: str) -> Path:
    with path.open("w") as out:
        for i in range(lines):
            out.write(
                chat_line(f"{prefix}-{i}", model, f"Say hello to {prefix} {i}.", max_tokens=LINE_MAX_TOKENS)
                + "\n"
            )
    return path


def write_long_line(out: Any, size: int, model: str, custom_id: str) -> None:
    """One chat request line of exactly ``size`` bytes (no newline): its prompt is words."""
    head, tail = chat_line(custom_id, model, "\0", max_tokens=LINE_MAX_TOKENS).encode().split(b"\\u0000")
    pad = size - len(head) - len(tail)
    if pad < 0:
        raise ValueError(f"a line of {size} bytes cannot hold a request")
    out.write(head)
    chunk = (WORD * (2**20 // len(WORD))).encode()
    while pad >= len(chunk):
        out.write(chunk)
        pad -= len(chunk)
    out.write(chunk[:pad])
    out.write(tail)


def write_huge_line_file(path: Path, line_bytes: int, short_lines: int, model: str, last: bool) -> Path:
    """Short lines and one of ``line_bytes``: in the middle, or ``last`` with no newline after it."""
    with path.open("wb") as out:
        for i in range(short_lines):
            if i == short_lines // 2 and not last:
                write_long_line(out, line_bytes, model, "huge")
                out.write(b"\n")
            out.write(
                chat_line(f"short-{i}", model, f"Say hello {i}.", max_tokens=LINE_MAX_TOKENS).encode() + b"\n"
            )
        if last:
            write_long_line(out, line_bytes, model, "huge")
    return path
