"""A batch's dispatch order: lines that share a long prompt prefix go together.

vLLM's prefix cache reuses a prefix only while it is still cached, so lines that share one should
run close together (and on one worker). Only a batch service sees the whole file before it runs:
validation makes the order, the dispatcher sends in it, the output keeps the input's order.

**The prefix key.** Each line's prompt, as a canonical text (``prompt_text``: the tools, then each
message's role and text, in the order a chat template renders them), UTF-8 encoded, is cut into
blocks of ``BLOCK_BYTES``; the key is the sequence of the CRC-32s of the prompt up to each block
(each run on from the previous block's: one pass, in C), at most ``MAX_BLOCKS`` of them. Sorted,
these keys are a depth-first walk of the trie of the prompts: lines that share ``k`` blocks lie
together, and within them those sharing more lie closer still.
A collision (two prefixes with one CRC, about one in 4 billion pairs) only moves a line in the
order or joins two groups; nothing else depends on it.

**Groups.** In that walk, a run of lines in which each shares at least ``min_shared_chars`` with
the one before is a *group*; its id is the digest of the prefix every line of it shares (the same
text gives the same id in any batch, so it names a cache's content). The order sends groups by
their first line in the file and a group's lines in trie order; a line that shares no such
prefix keeps its place in the file, so a file without shared prefixes is sent in file order.

**The order object** (``dispatch_order_key``) holds the request lines themselves, in dispatch
order, each behind a ``HEADER`` (its byte offset and length in the input, its line number, group
and rank), so the dispatcher reads it front to back like the input: no ranged read per line.

**Tags.** A line may carry a tag (a mixed batch's: which of the part's models or LoRA adapters it
names, numbered by first appearance): the order sends the lines of one tag together, tag by tag,
so a worker swaps adapters as rarely as it can; no group spans two tags. Untagged lines are tag 0.

**Bounded memory.** Validation keeps a small record per line (its key, number and place), not
the line. Both sorts are external: runs of at most ``RUN_BYTES`` are sorted in memory, spilled to
a temporary file and merged (``heapq.merge``); the run table (16 bytes per run of the walk) is a
temporary file too, written by the first walk and read back by the second. The lines
are then copied in dispatch order from a local copy of the input. An order that changes nothing
(every line in file order, one group at most) is not stored: the batch goes in file order.
"""

from __future__ import annotations

import struct
import tempfile
import zlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import IO, Any

import orjson

from services.api.spill import SortedRuns
from shared.input_lines import InputLine
from shared.kafka import key_partition
from shared.protocol.anthropic import MESSAGES
from shared.storage import ObjectStore

BLOCK_BYTES = 256
MAX_BLOCKS = 16  # 4 KiB of a prompt take part in the key
DIGEST = 4  # CRC-32 of the prefix
KEY_BYTES = MAX_BLOCKS * DIGEST
RUN_BYTES = 4 * 1024 * 1024
"""Memory for the records sorted at a time. Validating 1,000,000 lines (custom_id check and
order) in a process of its own grew its RSS by 19 MiB at 4 MiB and 35 MiB at 8 MiB, in the same
16 s."""
# Before each line of the order: input byte offset, length, line number, group id (0: none), rank.
HEADER = struct.Struct("<QIIQI")
_KEY_TEXT = BLOCK_BYTES * MAX_BLOCKS
_DIGESTS = [struct.Struct(f">{n}I{KEY_BYTES - n * DIGEST}x") for n in range(MAX_BLOCKS + 1)]
_crc32 = zlib.crc32
# What the sorts compare, packed big-endian so that the bytes compare as the values do.
_KEYED = struct.Struct(f">I{KEY_BYTES}sIQI")  # tag, prefix key, number, start, length
# The tag, the group's first number, the line's key up to what it shares with a neighbour,
# number, start, length, group id.
_PLACED = struct.Struct(f">II{KEY_BYTES}sIQIQ")
_RUN = struct.Struct("<IQ")  # a run's first line number and group id (the run table)
RUN_TABLE_BUFFER = 64 * 1024


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
    does not apply (embeddings, score and rerank run on the pooling runner)."""
    if url in ("/v1/chat/completions", MESSAGES):
        tools = body.get("tools")
        head = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode() + "\x1d" if tools else ""
        system = body.get("system") if url == MESSAGES else None  # Messages: rendered first
        head += f"system\x1f{_content_text(system)}\x1e" if system else ""
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
    """The digests of ``text``'s prefixes up to each block (``KEY_BYTES``, zero-padded)."""
    # A character is at least one byte: the first KEY_TEXT characters hold the key's bytes.
    data = memoryview(text[:_KEY_TEXT].encode("utf-8", "surrogatepass"))[:_KEY_TEXT]
    crc = 0
    digests = [crc := _crc32(data[i : i + BLOCK_BYTES], crc) for i in range(0, len(data), BLOCK_BYTES)]
    return _DIGESTS[len(digests)].pack(*digests)


def shared_blocks(a: bytes, b: bytes) -> int:
    """How many leading blocks two keys share (zero padding is no block)."""
    # The first differing byte, from the highest set bit of the XOR: no loop in Python.
    equal = KEY_BYTES - ((int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).bit_length() + 7) // 8
    filled = -(-len(a.rstrip(b"\0")) // DIGEST)
    return min(equal // DIGEST, filled)


# --------------------------------------------------------------------------------- external sort


# --------------------------------------------------------------------------------------- builder


@dataclass
class OrderStats:
    lines: int = 0
    grouped: int = 0  # lines in a group
    groups: int = 0
    in_file_order: bool = True  # the order is the file's own

    @property
    def worth_storing(self) -> bool:
        """Whether an order changes anything: lines move, or several groups (affinity) exist."""
        return self.groups > 1 or (self.groups == 1 and not self.in_file_order)


class OrderBuilder:
    """Collects each request line's prefix key during validation (small records: not the lines);
    ``plan`` finds the order, ``write`` writes the order object with the lines it reads.

    ``add`` takes the lines in file order. ``plan`` walks the sorted keys to find each run's
    first line and shared prefix (16 bytes per run, a lone line being a run of one); a second
    walk places the lines, the placed entries going to a temporary file in dispatch order. When
    the lines carry one tag and the first walk finds no group, or one group of every line with
    one key, the order is the file's own and nothing is placed until ``write`` asks for it (a
    mixed batch's parts are always written).
    """

    def __init__(self, min_shared_chars: int, run_bytes: int = RUN_BYTES) -> None:
        self.min_blocks = max(1, -(-min_shared_chars // BLOCK_BYTES))
        self._run_bytes = run_bytes
        self._keys = SortedRuns(run_bytes)
        self._runs: IO[bytes] | None = None
        self._plan: IO[bytes] | None = None
        self._tags: set[int] = set()
        self.stats = OrderStats()

    def add(self, line: InputLine, text: str | None, tag: int = 0) -> None:
        key = prefix_key(text) if text else b"\0" * KEY_BYTES
        self._keys.add(_KEYED.pack(tag, key, line.number, line.start, len(line.raw)))
        self._tags.add(tag)
        self.stats.lines += 1

    def _walk(self) -> Iterator[tuple[bool, int, bytes, int, int, int]]:
        """The sorted lines as ``(starts a run, tag, key, number, start, length)``."""
        previous: bytes = b""
        last_tag = -1
        head = self.min_blocks * DIGEST  # keys that differ here share too little (most lines)
        for record in self._keys.sorted():
            tag, key, number, start, length = _KEYED.unpack(record)
            fresh = (
                tag != last_tag
                or previous[:head] != key[:head]
                or shared_blocks(previous, key) < self.min_blocks
            )
            previous, last_tag = key, tag
            yield fresh, tag, key, number, start, length

    def _depths(self) -> Iterator[tuple[bool, int, bytes, int, int, int, int]]:
        """``_walk`` with how many blocks each line shares with the nearer of its neighbours (of
        its tag)."""
        before = 0
        held: tuple[bool, int, bytes, int, int, int] | None = None
        for item in self._walk():
            if held is not None:
                after = shared_blocks(held[2], item[2]) if held[1] == item[1] else 0
                yield held[0], held[1], held[2], max(before, after), held[3], held[4], held[5]
                before = after
            held = item
        if held is not None:
            yield held[0], held[1], held[2], before, held[3], held[4], held[5]

    def plan(self) -> OrderStats:
        """Find the order (kept in a temporary file for ``write``); returns what it found."""
        # The run table: (first line, group id) per run, written by the first walk, read back in
        # the same order by the second.
        self._runs = tempfile.TemporaryFile(buffering=RUN_TABLE_BUFFER)
        try:
            uniform = self._find_runs(self._runs)
            if len(self._tags) <= 1 and (
                self.stats.groups == 0
                or (self.stats.groups == 1 and uniform and self.stats.grouped == self.stats.lines)
            ):
                return self.stats  # every line alone, or one group of equal keys: the file's order
            self._place()
        except BaseException:
            self.close()
            raise
        return self.stats

    def _place(self) -> None:
        """The second walk: each line's place, then the placed entries sorted into ``_plan``."""
        assert self._runs is not None, "plan() first"
        runs, self._runs = self._runs, None
        places = SortedRuns(self._run_bytes)
        self._plan = tempfile.TemporaryFile()
        try:
            runs.seek(0)
            first = group_id = 0
            for fresh, tag, key, depth, number, start, length in self._depths():
                if fresh:
                    first, group_id = _RUN.unpack(runs.read(_RUN.size))
                # Within a group, lines sharing more than the group's prefix stay together (their
                # key up to what they share with a neighbour); the rest keep their file order.
                sub = key[: depth * DIGEST].ljust(KEY_BYTES, b"\0")
                places.add(_PLACED.pack(tag, first, sub, number, start, length, group_id))
            previous, rank, last_group = 0, 0, (-1, -1)
            for record in places.sorted():
                tag, first, _, number, start, length, group_id = _PLACED.unpack(record)
                rank = rank + 1 if (tag, first) == last_group else 0
                last_group = (tag, first)
                self._plan.write(HEADER.pack(start, length, number, group_id, rank))
                self.stats.in_file_order &= number > previous
                previous = number
        finally:
            runs.close()
            places.close()
            self._keys.close()

    def _find_runs(self, table: IO[bytes]) -> bool:
        """The first walk: each run's first line and group id, to ``table`` in walk order (16
        bytes per run on disk, none in memory); the group counts to ``stats``. True when every
        line of a run has its run's key (lines sharing their first 4 KiB): such a run's lines
        are placed in file order."""
        head, common, first, size = b"", 0, 0, 0
        uniform = True

        def end_run() -> None:
            shared = min(common, shared_blocks(head, head)) if size > 1 else 0  # equal keys: all of it
            table.write(_RUN.pack(first, _group_id(head, shared, size)))
            if size > 1:
                self.stats.groups += 1
                self.stats.grouped += size

        for fresh, _, key, number, _, _ in self._walk():
            if fresh:
                if size:
                    end_run()
                first, size, head, common = number, 1, key, MAX_BLOCKS
            else:
                size += 1
                first = min(first, number)
                if key != head:
                    uniform = False
                    common = min(common, shared_blocks(head, key))
        if size:
            end_run()
        return uniform

    def write(self, out: IO[bytes], source: IO[bytes]) -> None:
        """Write the order object to ``out``: each line (read from ``source``, a seekable copy of
        the input) behind its header, in dispatch order."""
        if self._plan is None:
            self._place()
        assert self._plan is not None
        plan, self._plan = self._plan, None
        try:
            plan.seek(0)
            while block := plan.read(HEADER.size * 4096):
                for at in range(0, len(block), HEADER.size):
                    header = block[at : at + HEADER.size]
                    start, length, _, _, _ = HEADER.unpack(header)
                    source.seek(start)
                    out.write(header + source.read(length))
        finally:
            plan.close()

    def close(self) -> None:
        self._keys.close()
        for made in (self._runs, self._plan):
            if made is not None:
                made.close()
        self._runs = self._plan = None


NO_GROUPS = 1 << 30
"""``min_shared_chars`` that makes no prefix group (a mixed batch sent without prefix order)."""


class PartOrders:
    """A mixed batch's dispatch orders, one per part: the lines of one base model (each tagged
    with the model or adapter it names, so each adapter's lines go together), and a part of base
    None for the lines that name no served model. Parts are numbered by first appearance."""

    def __init__(self, min_shared_chars: int, run_bytes: int = RUN_BYTES) -> None:
        self.min_shared_chars, self._run_bytes = min_shared_chars, run_bytes
        self.parts: dict[str | None, OrderBuilder] = {}
        self._tags: dict[str | None, dict[str, int]] = {}  # per served base model

    def add(self, base: str | None, model: str, line: InputLine, text: str | None) -> None:
        """A line naming ``model`` (served by ``base``; None: no served model, tag 0, so the
        names of unserved models are never kept)."""
        builder = self.parts.get(base)
        if builder is None:
            builder = self.parts[base] = OrderBuilder(self.min_shared_chars, self._run_bytes)
            self._tags[base] = {}
        tags = self._tags[base]
        tag = 0 if base is None else tags.setdefault(model, len(tags))
        builder.add(line, text, tag)

    def close(self) -> None:
        for builder in self.parts.values():
            builder.close()


def _group_id(head: bytes, common: int, size: int) -> int:
    """A group's id: the digest of the prefix all its lines share (0: a line alone)."""
    if size < 2 or common < 1:
        return 0
    return int.from_bytes(head[(common - 1) * DIGEST : common * DIGEST], "big") or 1


# ---------------------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class OrderEntry:
    start: int  # the line's byte offset in the input file
    length: int
    number: int
    group: int  # 0: the line shares no long prefix
    rank: int  # its place within the group
    raw: bytes = b""


def read_entries(data: bytes) -> tuple[list[OrderEntry], int]:
    """The whole entries at the front of ``data``, and how many bytes they took."""
    entries: list[OrderEntry] = []
    at, size = 0, HEADER.size
    while len(data) - at >= size:
        start, length, number, group, rank = HEADER.unpack_from(data, at)
        if len(data) - at - size < length:
            break
        entries.append(OrderEntry(start, length, number, group, rank, data[at + size : at + size + length]))
        at += size + length
    return entries, at


class OrderCursor:
    """Reads a batch's lines in its dispatch order, from the order object's entry ``line - 1``
    at byte ``byte`` on; the same surface as ``reader.InputCursor``. ``placed`` holds the entries
    of the lines the last ``take`` returned (their prefix group and rank)."""

    def __init__(self, store: ObjectStore, key: str, line: int = 1, byte: int = 0) -> None:
        self.store, self.key = store, key
        self.line, self.byte = max(1, line), byte
        self.exhausted = False
        self.placed: dict[int, OrderEntry] = {}
        self._chunks: AsyncGenerator[bytes] | None = None
        self._pending = b""
        self._buffer: list[OrderEntry] = []

    async def take(self, count: int) -> list[InputLine]:
        if self._chunks is None:
            self._chunks = self.store.iter_chunks(self.key, offset=self.byte)
        taken: list[OrderEntry] = []
        while len(taken) < count and not self.exhausted:
            if not self._buffer:
                chunk = await anext(self._chunks, None)
                if chunk is None:
                    self.exhausted = True
                    break
                self._pending += chunk
                entries, used = read_entries(self._pending)
                self._pending = self._pending[used:]
                self._buffer = entries[::-1]
                continue
            taken.append(self._buffer.pop())
        self.line += len(taken)
        self.byte += sum(HEADER.size + e.length for e in taken)
        self.placed = {e.number: e for e in taken}
        return [InputLine(e.number, e.start, e.raw) for e in taken]

    async def close(self) -> None:
        chunks, self._chunks = self._chunks, None
        self._pending, self._buffer = b"", []
        if chunks is not None:
            await chunks.aclose()


async def scan_order(store: ObjectStore, key: str, upto_line: int) -> AsyncGenerator[InputLine]:
    """The lines of the order's first ``upto_line - 1`` entries (those an earlier dispatcher sent)."""
    cursor = OrderCursor(store, key)
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
