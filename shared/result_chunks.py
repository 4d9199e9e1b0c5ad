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

from shared.protocol.messages import ResultMessage, TokenUsage
from shared.protocol.result_message import NOT_RUN_MESSAGES, NotRunCode
from shared.seen_lines import SeenLines


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


_NOT_RUN_NEEDLES = tuple((code, b'"code":"%s"' % code.encode()) for code in NOT_RUN_MESSAGES)


def not_run_code(payload: bytes) -> NotRunCode | None:
    """The code of a failed line that never ran (``NOT_RUN_MESSAGES``), else None: a byte search
    first, then the line's ``error.code`` read to be sure (a response body may quote any text)."""
    for code, needle in _NOT_RUN_NEEDLES:
        if needle in payload:
            error = json.loads(payload).get("error") or {}
            return code if error.get("code") == code else None
    return None


USAGE_KEYS = ("input_tokens", "output_tokens", "total_tokens", "cached_tokens", "reasoning_tokens")
"""A batch's usage, flat: the aggregator's running sums and ``usage_document``'s input."""


def token_sums(usage: TokenUsage | None) -> dict[str, int]:
    """A line's usage as the batch sums it (``USAGE_KEYS``); empty without usage."""
    if usage is None:
        return {}
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "cached_tokens": usage.cached_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
    }


def usage_document(flat: dict[str, int]) -> dict[str, Any]:
    """The Batch object's ``usage`` field from the flat sums (``USAGE_KEYS``)."""
    return {
        "input_tokens": flat.get("input_tokens", 0),
        "input_tokens_details": {"cached_tokens": flat.get("cached_tokens", 0)},
        "output_tokens": flat.get("output_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": flat.get("reasoning_tokens", 0)},
        "total_tokens": flat.get("total_tokens", 0),
    }


def usage_flat(document: dict[str, Any] | None) -> dict[str, int]:
    """The flat sums back from a stored ``usage`` field."""
    doc = document or {}
    return {
        "input_tokens": int(doc.get("input_tokens") or 0),
        "output_tokens": int(doc.get("output_tokens") or 0),
        "total_tokens": int(doc.get("total_tokens") or 0),
        "cached_tokens": int((doc.get("input_tokens_details") or {}).get("cached_tokens") or 0),
        "reasoning_tokens": int((doc.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
    }


class ChunkTally:
    """What a batch's stored chunks say: the lines with a result (each once), counts and usage.

    How a batch resumes after its messages were lost (``deploy/provision.py``): these become its
    counts, and its lines with a result are not sent again.
    """

    def __init__(self) -> None:
        self.seen = SeenLines()
        self.completed = self.failed = 0
        self.usage = dict.fromkeys(USAGE_KEYS, 0)

    def add(self, raw: bytes) -> None:
        record = parse_record(raw)
        if record.line < 1 or record.line in self.seen:
            return  # a fill line's placeholder, or a line stored twice (a redelivery)
        self.seen.add(record.line)
        if not record.succeeded:
            self.failed += 1
            return
        self.completed += 1
        try:
            body = (json.loads(record.payload).get("response") or {}).get("body")
        except (ValueError, AttributeError):
            return
        usage = TokenUsage.from_body_usage(body.get("usage") if isinstance(body, dict) else None)
        for key, value in token_sums(usage).items():
            self.usage[key] += value


class UsageByModel:
    """A mixed batch's usage per model (each answer's ``body.model``: a model or an adapter), from
    its output file's lines; ``documents`` gives the Batch object's ``usage_by_model``."""

    def __init__(self) -> None:
        self.sums: dict[str, dict[str, int]] = {}

    def add(self, output_line: bytes) -> None:
        try:
            body = (json.loads(output_line).get("response") or {}).get("body")
        except (ValueError, AttributeError):
            return
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return
        sums = self.sums.setdefault(body["model"], dict.fromkeys(USAGE_KEYS, 0))
        for key, value in token_sums(TokenUsage.from_body_usage(body.get("usage"))).items():
            sums[key] += value

    def documents(self) -> dict[str, dict[str, Any]]:
        return {model: usage_document(flat) for model, flat in sorted(self.sums.items())}
