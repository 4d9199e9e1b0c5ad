"""The result chunk format: how the aggregator stores results as they arrive, and the api reads them.

A chunk object (under ``shared.storage.result_chunk_prefix``) holds one line per result, sorted by
line number::

    <line> <1 if succeeded else 0> <the output line as compact JSON>\\n

The small header lets readers order, dedupe and split lines without parsing the JSON, and compact
JSON never holds a raw newline, so a record is exactly one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

from shared.protocol.messages import ResultMessage


class Record(NamedTuple):
    """One line of a chunk; every writer (results, merges, fill lines) encodes through it."""

    line: int
    succeeded: bool
    payload: bytes  # the output line, compact JSON, without the newline

    def encode(self) -> bytes:
        return b"%d %d %s\n" % (self.line, int(self.succeeded), self.payload)


def compact_json(value: Any) -> bytes:
    """An output line as a chunk stores it: compact JSON, never a raw newline."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def encode_record(result: ResultMessage) -> bytes:
    """The record of one result; its response body is spliced in as it came, never re-parsed."""
    return Record(result.line or 0, result.succeeded, result.output_line_json()).encode()


def encode_chunk(results: Iterable[ResultMessage]) -> bytes:
    """One chunk object's bytes; ``results`` must already be sorted by line."""
    return b"".join(encode_record(r) for r in results)


def parse_record(raw: bytes) -> Record:
    line, succeeded, payload = raw.rstrip(b"\n").split(b" ", 2)
    return Record(int(line), succeeded == b"1", payload)
