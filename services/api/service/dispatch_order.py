"""A batch's dispatch order, made at validation: lines that share a long prompt prefix go together.

vLLM's prefix cache reuses a prefix only while it is still cached, so lines that share one should
run close together (and on one worker). Only a batch service sees the whole file before it runs:
validation makes the order (this module, from each line's prefix key: ``prompt_keys.py``), the
dispatcher sends in it (``services/api/dispatch/order.py``), the output keeps the input's order.

**Groups.** In the sorted walk of the lines' prefix keys, a run of lines in which each shares at
least ``min_shared_chars`` with the one before is a *group*; its id is the digest of the prefix
every line of it shares (the same text gives the same id in any batch, so it names a cache's
content). The order sends groups by their first line in the file and a group's lines in trie
order; a line that shares no such prefix keeps its place in the file, so a file without shared
prefixes is sent in file order.

**Longest first.** On a GPU a decode step costs about as much for one sequence as for dozens,
so a long line that starts last runs nearly alone and the batch waits for it (the tail). With
``longest_first`` the order sends the groups by their longest line, longest first, and a group's
lines longest first (lines that share more than the group's prefix stay together); a line's
expected length is its output cap, else the batch's ``max_decoding_length``, else the longest of
all, and an embedding, score or rerank line is short (``shared/expected_output.py``). Equal
lengths keep the order above. The order is made once, before any line runs: what finished lines
show is not fed back.

**The order object** (``dispatch_order_key``) holds the request lines themselves, in dispatch
order, each behind a ``HEADER`` (its byte offset and length in the input, its line number, group
and rank), so the dispatcher reads it front to back like the input: no ranged read per line.

**Tags.** A line may carry a tag (a mixed batch's: which of the part's models or LoRA adapters it
names, numbered by first appearance): the order sends the lines of one tag together, tag by tag,
so a worker swaps adapters as rarely as it can; no group spans two tags. Untagged lines are tag 0.

**Bounded memory.** Validation keeps a small record per line (its key, number and place), not
the line. Both sorts are external: runs of at most ``RUN_BYTES`` are sorted in memory, spilled to
a temporary file and merged (``heapq.merge``); the run table (20 bytes per run of the walk) is a
temporary file too, written by the first walk and read back by the second. The lines
are then copied in dispatch order from a local copy of the input. An order that changes nothing
(every line in file order, one group at most) is not stored: the batch goes in file order.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from services.api.dispatch.order import HEADER
from services.api.prompt_keys import BLOCK_BYTES, DIGEST, KEY_BYTES, MAX_BLOCKS, prefix_key, shared_blocks
from services.api.sorted_runs import SortedRuns
from shared.expected_output import LONGEST
from shared.input_lines import InputLine
from shared.storage import ObjectStore, dispatch_order_key

log = logging.getLogger(__name__)

RUN_BYTES = 4 * 1024 * 1024
"""Memory for the records sorted at a time: validating a million lines grows the process by about
five times this, and a larger run sorts no faster (docs/benchmarks.md)."""
# What the sorts compare, packed big-endian so that the bytes compare as the values do.
_KEYED = struct.Struct(f">I{KEY_BYTES}sIQI")  # tag, prefix key, number, start, length
# The tag, the group's rank by length, its first number, the line's key up to what it shares with
# a neighbour, the line's rank by length, number, start, length, group id.
_PLACED = struct.Struct(f">III{KEY_BYTES}sIIQIQ")
_RUN = struct.Struct("<IQI")  # a run's first line number, group id, longest line (the run table)
# A line's expected length, stored beside its record: what the sorts compare is its complement
# (longest first).
_LENGTH = struct.Struct("<I")
RUN_TABLE_BUFFER = 64 * 1024


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
        return self.groups > 1 or not self.in_file_order


class OrderBuilder:
    """Collects each request line's prefix key during validation (small records: not the lines);
    ``plan`` finds the order, ``write`` writes the order object with the lines it reads.

    ``add`` takes the lines in file order. ``plan`` walks the sorted keys to find each run's
    first line, shared prefix and longest line (20 bytes per run, a lone line being a run of
    one); a second walk places the lines, the placed entries going to a temporary file in
    dispatch order. When the lines carry one tag and one expected length (or ``longest_first`` is
    off) and the first walk finds no group, or one group of every line with one key, the order is
    the file's own and nothing is placed until ``write`` asks for it (a mixed batch's parts are
    always written).
    """

    def __init__(
        self, min_shared_chars: int, run_bytes: int = RUN_BYTES, longest_first: bool = False
    ) -> None:
        self.min_blocks = max(1, -(-min_shared_chars // BLOCK_BYTES))
        self._run_bytes = run_bytes
        self.longest_first = longest_first
        self._lengths: set[int] = set()  # up to two: whether lengths differ at all
        self._keys = SortedRuns(run_bytes)
        self._runs: IO[bytes] | None = None
        self._plan: IO[bytes] | None = None
        self._tags: set[int] = set()
        self.stats = OrderStats()

    def add(self, line: InputLine, text: str | None, tag: int = 0, length: int = LONGEST) -> None:
        """A line (in file order), its prompt text and its expected length (``expected_length``)."""
        key = prefix_key(text) if text else b"\0" * KEY_BYTES
        length = length if self.longest_first else 0
        self._keys.add(_KEYED.pack(tag, key, line.number, line.start, len(line.raw)) + _LENGTH.pack(length))
        self._tags.add(tag)
        if len(self._lengths) < 2:
            self._lengths.add(length)
        self.stats.lines += 1

    def _walk(self) -> Iterator[tuple[bool, int, bytes, int, int, int, int]]:
        """The sorted lines as ``(starts a run, tag, key, number, start, length, expected length)``."""
        previous: bytes = b""
        last_tag = -1
        head = self.min_blocks * DIGEST  # keys that differ here share too little (most lines)
        for record in self._keys.sorted():
            tag, key, number, start, length = _KEYED.unpack_from(record)
            (expected,) = _LENGTH.unpack_from(record, _KEYED.size)
            fresh = (
                tag != last_tag
                or previous[:head] != key[:head]
                or shared_blocks(previous, key) < self.min_blocks
            )
            previous, last_tag = key, tag
            yield fresh, tag, key, number, start, length, expected

    def _depths(self) -> Iterator[tuple[bool, int, bytes, int, int, int, int, int]]:
        """``_walk`` with how many blocks each line shares with the nearer of its neighbours (of
        its tag)."""
        before = 0
        held: tuple[bool, int, bytes, int, int, int, int] | None = None
        for item in self._walk():
            if held is not None:
                after = shared_blocks(held[2], item[2]) if held[1] == item[1] else 0
                yield held[0], held[1], held[2], max(before, after), *held[3:]
                before = after
            held = item
        if held is not None:
            yield held[0], held[1], held[2], before, *held[3:]

    def plan(self) -> OrderStats:
        """Find the order (kept in a temporary file for ``write``); returns what it found."""
        # The run table: (first line, group id) per run, written by the first walk, read back in
        # the same order by the second.
        self._runs = tempfile.TemporaryFile(buffering=RUN_TABLE_BUFFER)
        try:
            uniform = self._find_runs(self._runs)
            if (
                len(self._tags) <= 1
                and len(self._lengths) <= 1
                and (
                    self.stats.groups == 0
                    or (self.stats.groups == 1 and uniform and self.stats.grouped == self.stats.lines)
                )
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
            first = group_id = longest = 0
            for fresh, tag, key, depth, number, start, length, expected in self._depths():
                if fresh:
                    first, group_id, longest = _RUN.unpack(runs.read(_RUN.size))
                # Within a group, lines sharing more than the group's prefix stay together (their
                # key up to what they share with a neighbour); the rest keep their file order, or
                # go longest first. Groups go by their first line, or their longest first.
                sub = key[: depth * DIGEST].ljust(KEY_BYTES, b"\0")
                places.add(
                    _PLACED.pack(
                        tag,
                        LONGEST - longest,
                        first,
                        sub,
                        LONGEST - expected,
                        number,
                        start,
                        length,
                        group_id,
                    )
                )
            previous, rank, last_group = 0, 0, (-1, -1)
            for record in places.sorted():
                tag, _, first, _, _, number, start, length, group_id = _PLACED.unpack(record)
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
        head, common, first, size, longest = b"", 0, 0, 0, 0
        uniform = True

        def end_run() -> None:
            shared = min(common, shared_blocks(head, head)) if size > 1 else 0  # equal keys: all of it
            table.write(_RUN.pack(first, _group_id(head, shared, size), longest))
            if size > 1:
                self.stats.groups += 1
                self.stats.grouped += size

        for fresh, _, key, number, _, _, expected in self._walk():
            if fresh:
                if size:
                    end_run()
                first, size, head, common, longest = number, 1, key, MAX_BLOCKS, expected
            else:
                size += 1
                first = min(first, number)
                longest = max(longest, expected)
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

    def __init__(
        self, min_shared_chars: int, run_bytes: int = RUN_BYTES, longest_first: bool = False
    ) -> None:
        self.min_shared_chars, self._run_bytes = min_shared_chars, run_bytes
        self.longest_first = longest_first
        self.parts: dict[str | None, OrderBuilder] = {}
        self._tags: dict[str | None, dict[str, int]] = {}  # per served base model

    def add(
        self, base: str | None, model: str, line: InputLine, text: str | None, length: int = LONGEST
    ) -> None:
        """A line naming ``model`` (served by ``base``; None: no served model, tag 0, so the
        names of unserved models are never kept), with its expected length."""
        builder = self.parts.get(base)
        if builder is None:
            builder = self.parts[base] = OrderBuilder(
                self.min_shared_chars, self._run_bytes, self.longest_first
            )
            self._tags[base] = {}
        tags = self._tags[base]
        tag = 0 if base is None else tags.setdefault(model, len(tags))
        builder.add(line, text, tag, length)

    def close(self) -> None:
        for builder in self.parts.values():
            builder.close()


def _group_id(head: bytes, common: int, size: int) -> int:
    """A group's id: the digest of the prefix all its lines share (0: a line alone)."""
    if size < 2 or common < 1:
        return 0
    return int.from_bytes(head[(common - 1) * DIGEST : common * DIGEST], "big") or 1


async def save_order(store: ObjectStore, batch_id: str, input_key: str, order: OrderBuilder) -> bool:
    """Write the batch's dispatch order beside its input (the lines in that order); False when it
    would change nothing (``OrderStats.worth_storing``): the dispatcher then reads the input in
    file order."""
    stats = await asyncio.to_thread(order.plan)
    if not stats.worth_storing:
        return False
    with tempfile.TemporaryFile() as source:
        await _copy_input(store, input_key, source)
        await _write_order(store, dispatch_order_key(batch_id), source, order)
    log.info(
        "dispatch order made",
        extra={"batch_id": batch_id, "groups": stats.groups, "grouped_lines": stats.grouped},
    )
    return True


async def save_parts(
    store: ObjectStore, batch_id: str, input_key: str, parts: PartOrders
) -> tuple[list[dict[str, Any]], bool]:
    """Write each part's dispatch order of a mixed batch; returns the parts to store
    (``shared/documents.py``) and whether any part has prefix groups (``prefix_order``)."""
    stored, grouped = [], False
    with tempfile.TemporaryFile() as source:
        await _copy_input(store, input_key, source)
        for i, (base, order) in enumerate(parts.parts.items()):
            stats = await asyncio.to_thread(order.plan)
            await _write_order(store, dispatch_order_key(batch_id, i), source, order)
            stored.append({"model": base, "lines": stats.lines})
            grouped = grouped or stats.groups > 0
    log.info("mixed batch split", extra={"batch_id": batch_id, "parts": stored})
    return stored, grouped


async def _copy_input(store: ObjectStore, input_key: str, source: IO[bytes]) -> None:
    async for chunk in store.iter_chunks(input_key):  # a local copy when it has one
        await asyncio.to_thread(source.write, chunk)


async def _write_order(store: ObjectStore, key: str, source: IO[bytes], order: OrderBuilder) -> None:
    """The order object at ``key``, its lines read from ``source`` (a copy of the input)."""
    with tempfile.NamedTemporaryFile(suffix=".order") as out:
        await asyncio.to_thread(order.write, out, source)
        out.flush()
        await store.put_file(key, out.name)
