"""A batch's dispatch order: lines that share a long prompt prefix go together.

vLLM's prefix cache reuses a prefix only while it is still cached, so lines that share one should
run close together (and on one worker). Only a batch service sees the whole file before it runs:
validation makes the order, the dispatcher sends in it, the output keeps the input's order.

**The prefix key.** Each line's prompt, as a canonical text (``prompt_text``: the tools, then each
message's role and text, in the order a chat template renders them), is cut into blocks of
``BLOCK_CHARS`` characters; the key is the sequence of chained hashes of those blocks (the hash of
block ``i`` covers blocks ``0..i``, as vLLM hashes its KV blocks), at most ``MAX_BLOCKS`` of them.
Sorted, these keys are a depth-first walk of the trie of the prompts: lines that share ``k``
blocks lie together, and within them those sharing more lie closer still.

**Groups.** In that walk, a run of lines in which each shares at least ``min_shared_chars`` with
the one before is a *group*; its id is the chained hash of the prefix every line of it shares
(the same text gives the same id in any batch, so it names a cache's content). The order sends
groups by their first line in the file and a group's lines in trie order; a line that shares no
such prefix keeps its place in the file, so a file without shared prefixes is sent in file order.

**Bounded memory.** Both sorts are external: at most ``RUN_LINES`` records are held, sorted runs
spill to a temporary file and are merged (``heapq.merge``); the group table holds 12 bytes per
group. The order is an object beside the input (``dispatch_order_key``): ``RECORD`` bytes per line.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import struct
import tempfile
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import IO, Any

import orjson

from services.api.dispatch.reader import read_lines
from shared.input_lines import InputLine
from shared.kafka import key_partition
from shared.storage import ObjectStore

BLOCK_CHARS = 64
MAX_BLOCKS = 64  # 4,096 characters of a prompt take part in the key
DIGEST = 8
KEY_BYTES = MAX_BLOCKS * DIGEST
RUN_LINES = 16_384
# Each line of the order: input byte offset, length, line number, group id (0: none), rank in group.
RECORD = struct.Struct("<QIIQI")
# What the sorts compare, packed big-endian so that the bytes compare as the values do.
_KEYED = struct.Struct(f">{KEY_BYTES}sIQI")  # prefix key, number, start, length
_PLACED = struct.Struct(">IIQIIQ")  # the group's first number, rank, start, length, number, group


# ------------------------------------------------------------------------------------ prompt text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(orjson.dumps(part, option=orjson.OPT_SORT_KEYS).decode())
        return "".join(parts)
    return "" if content is None else orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return _content_text(messages)
    out = []
    for message in messages:
        if isinstance(message, dict):
            out.append(f"{message.get('role', '')}\x1f{_content_text(message.get('content'))}\x1e")
        else:
            out.append(_content_text(message))
    return "".join(out)


def prompt_text(url: str, body: dict[str, Any]) -> str | None:
    """The canonical prompt of a line, in the order the engine sees it; None where prefix caching
    does not apply (embeddings run on the pooling runner)."""
    if url == "/v1/chat/completions":
        tools = body.get("tools")
        head = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode() + "\x1d" if tools else ""
        return head + _messages_text(body.get("messages"))
    if url == "/v1/completions":
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()
    if url == "/v1/responses":
        instructions = body.get("instructions")
        head = f"{instructions}\x1d" if isinstance(instructions, str) else ""
        return head + _messages_text(body.get("input"))
    return None


def prefix_key(text: str) -> bytes:
    """The chained block hashes of ``text`` (``KEY_BYTES``, zero-padded)."""
    out = bytearray()
    previous = b""
    for i in range(0, min(len(text), BLOCK_CHARS * MAX_BLOCKS), BLOCK_CHARS):
        previous = hashlib.blake2b(
            previous + text[i : i + BLOCK_CHARS].encode("utf-8", "surrogatepass"), digest_size=DIGEST
        ).digest()
        out += previous
    return bytes(out).ljust(KEY_BYTES, b"\0")


def shared_blocks(a: bytes, b: bytes) -> int:
    """How many leading blocks two keys share (zero padding is no block)."""
    blocks = 0
    for i in range(0, KEY_BYTES, DIGEST):
        digest = a[i : i + DIGEST]
        if digest != b[i : i + DIGEST] or digest == b"\0" * DIGEST:
            break
        blocks += 1
    return blocks


# --------------------------------------------------------------------------------- external sort


class _Runs:
    """Records of a fixed size sorted in runs of ``RUN_LINES`` spilled to one temporary file,
    then merged: memory holds one run, plus a read buffer per run while merging."""

    def __init__(self, item: struct.Struct, run_lines: int) -> None:  # item: the record's layout
        self.item, self.run_lines = item, run_lines
        self._pending: list[bytes] = []
        self._spill: IO[bytes] | None = None
        self._runs: list[tuple[int, int]] = []  # (offset, count) in the spill file

    def add(self, record: bytes) -> None:
        self._pending.append(record)
        if len(self._pending) >= self.run_lines:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._spill is None:
            self._spill = tempfile.TemporaryFile()
        self._pending.sort()
        offset = self._spill.seek(0, os.SEEK_END)
        self._spill.write(b"".join(self._pending))
        self._runs.append((offset, len(self._pending)))
        self._pending = []

    def _read_run(self, offset: int, count: int) -> Iterator[bytes]:
        assert self._spill is not None
        size = self.item.size
        step = max(1, 65_536 // size)
        for first in range(0, count, step):
            n = min(step, count - first)
            self._spill.seek(offset + first * size)
            block = self._spill.read(n * size)
            for j in range(n):
                yield block[j * size : (j + 1) * size]

    def sorted(self) -> Iterator[bytes]:
        """Every record in byte order (records compare as their packed bytes)."""
        if self._spill is None:
            self._pending.sort()
            yield from self._pending
            return
        self._flush()
        yield from heapq.merge(*(self._read_run(o, c) for o, c in self._runs))

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None


# --------------------------------------------------------------------------------------- builder


@dataclass
class OrderStats:
    lines: int = 0
    grouped: int = 0  # lines in a group
    groups: int = 0


class OrderBuilder:
    """Collects each request line's prefix key during validation; ``write`` makes the order file.

    ``add`` takes the lines in file order. ``write`` walks the sorted keys twice: once to find
    each group's first line and shared prefix (12 bytes per group), once to place the lines.
    """

    def __init__(self, min_shared_chars: int, run_lines: int = RUN_LINES) -> None:
        self.min_blocks = max(1, -(-min_shared_chars // BLOCK_CHARS))
        self._run_lines = run_lines
        self._keys = _Runs(_KEYED, run_lines)
        self.stats = OrderStats()

    def add(self, line: InputLine, text: str | None) -> None:
        key = prefix_key(text) if text else b"\0" * KEY_BYTES
        self._keys.add(_KEYED.pack(key, line.number, line.start, len(line.raw)))
        self.stats.lines += 1

    def _runs(self) -> Iterator[tuple[bool, bytes, int, int, int]]:
        """The sorted lines as ``(starts a run, key, number, start, length)``."""
        previous: bytes | None = None
        for record in self._keys.sorted():
            key, number, start, length = _KEYED.unpack(record)
            fresh = previous is None or shared_blocks(previous, key) < self.min_blocks
            previous = key
            yield fresh, key, number, start, length

    def write(self, out: IO[bytes]) -> OrderStats:
        """Write the order (``RECORD`` per line) to ``out``; returns what it found."""
        firsts, ids, sizes = array("I"), array("Q"), array("I")
        head = b""
        common = 0
        for fresh, key, number, _, _ in self._runs():
            if fresh:
                if sizes:
                    ids.append(_group_id(head, common, sizes[-1]))
                firsts.append(number)
                sizes.append(1)
                head, common = key, MAX_BLOCKS
            else:
                sizes[-1] += 1
                firsts[-1] = min(firsts[-1], number)
                common = min(common, shared_blocks(head, key))
        if sizes:
            ids.append(_group_id(head, common, sizes[-1]))
        places = _Runs(_PLACED, self._run_lines)
        try:
            group, rank = -1, 0
            for fresh, _, number, start, length in self._runs():
                group, rank = (group + 1, 0) if fresh else (group, rank + 1)
                places.add(_PLACED.pack(firsts[group], rank, start, length, number, ids[group]))
            for record in places.sorted():
                _, rank, start, length, number, group_id = _PLACED.unpack(record)
                out.write(RECORD.pack(start, length, number, group_id, rank))
        finally:
            places.close()
            self._keys.close()
        grouped = [size for size in sizes if size > 1]
        self.stats.groups, self.stats.grouped = len(grouped), sum(grouped)
        return self.stats


def _group_id(head: bytes, common: int, size: int) -> int:
    """A group's id: the chained hash of the prefix all its lines share (0: a line alone)."""
    if size < 2 or common < 1:
        return 0
    return int.from_bytes(head[(common - 1) * DIGEST : common * DIGEST], "little") or 1


# ---------------------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class OrderEntry:
    start: int
    length: int
    number: int
    group: int  # 0: the line shares no long prefix
    rank: int  # its place within the group


def read_entries(data: bytes) -> list[OrderEntry]:
    size = RECORD.size
    return [OrderEntry(*RECORD.unpack_from(data, i)) for i in range(0, len(data) - size + 1, size)]


async def iter_entries(store: ObjectStore, key: str, first: int = 0) -> AsyncIterator[list[OrderEntry]]:
    """The order's entries from entry ``first`` on, a chunk at a time."""
    pending = b""
    async for chunk in store.iter_chunks(key, offset=first * RECORD.size):
        pending += chunk
        whole = len(pending) - len(pending) % RECORD.size
        if whole:
            yield read_entries(pending[:whole])
            pending = pending[whole:]


class OrderCursor:
    """Reads a batch's lines in its dispatch order, from entry ``line - 1`` on; the same surface
    as ``reader.InputCursor``. Its position counts entries of the order: ``line`` is the next
    entry's index + 1, ``byte`` its offset in the order object. ``placed`` holds the order
    entries of the lines the last ``take`` returned (their prefix group and rank)."""

    def __init__(self, store: ObjectStore, key: str, input_key: str, line: int = 1) -> None:
        self.store, self.key, self.input_key = store, key, input_key
        self.line = max(1, line)
        self.byte = (self.line - 1) * RECORD.size
        self.exhausted = False
        self.placed: dict[int, OrderEntry] = {}
        self._entries: AsyncIterator[list[OrderEntry]] | None = None
        self._buffer: list[OrderEntry] = []

    async def take(self, count: int) -> list[InputLine]:
        if self._entries is None:
            self._entries = iter_entries(self.store, self.key, self.line - 1)
        taken: list[OrderEntry] = []
        while len(taken) < count and not self.exhausted:
            if not self._buffer:
                chunk = await anext(self._entries, None)
                if chunk is None:
                    self.exhausted = True
                    break
                self._buffer = chunk[::-1]
            taken.append(self._buffer.pop())
        raws = await read_lines(self.store, self.input_key, [(e.start, e.length) for e in taken])
        self.line += len(taken)
        self.byte = (self.line - 1) * RECORD.size
        self.placed = {e.number: e for e in taken}
        return [InputLine(e.number, e.start, raw) for e, raw in zip(taken, raws, strict=True)]

    async def close(self) -> None:
        entries, self._entries = self._entries, None
        self._buffer = []
        if entries is not None:
            await entries.aclose()  # type: ignore[attr-defined]


async def scan_order(
    store: ObjectStore, key: str, input_key: str, upto_line: int
) -> AsyncIterator[InputLine]:
    """The lines of the first ``upto_line - 1`` entries (those an earlier dispatcher sent)."""
    cursor = OrderCursor(store, key, input_key)
    try:
        while cursor.line < upto_line and not cursor.exhausted:
            for item in await cursor.take(min(256, upto_line - cursor.line)):
                yield item
    finally:
        await cursor.close()


class Affinity:
    """Which partition of a model's requests topic a prefix group's lines go to.

    A group is cut into slices of ``slice_lines`` (by rank); a slice goes to the partition its
    group id and slice number hash to (the same in every batch and after any restart, so a
    prefix keeps meeting the worker whose cache holds it), unless that partition holds more than
    ``slack_lines`` more of our lines than the emptiest one: then to the emptiest. The choice is
    remembered for the slice's later lines (at most ``max_slices`` choices, least recent first
    forgotten). Lines of no group go where the producer puts them.
    """

    def __init__(self, slice_lines: int, slack_lines: int, max_slices: int = 4096) -> None:
        self.slice_lines, self.slack_lines, self.max_slices = max(1, slice_lines), slack_lines, max_slices
        self._chosen: OrderedDict[tuple[int, int], int] = OrderedDict()

    def partition(self, entry: OrderEntry | None, partitions: int, load: dict[int, int]) -> int | None:
        """The partition for a line (``load``: our lines in each partition, this round's too)."""
        if entry is None or entry.group == 0 or partitions < 2:
            return None
        key = (entry.group, entry.rank // self.slice_lines)
        chosen = self._chosen.get(key)
        if chosen is not None and chosen < partitions:
            self._chosen.move_to_end(key)
            return chosen
        chosen = key_partition(b"%d:%d" % key, partitions)
        emptiest = min(range(partitions), key=lambda p: load.get(p, 0))
        if load.get(chosen, 0) > load.get(emptiest, 0) + self.slack_lines:
            chosen = emptiest
        self._chosen[key] = chosen
        if len(self._chosen) > self.max_slices:
            self._chosen.popitem(last=False)
        return chosen
