"""The dispatch order: lines sharing a long prompt prefix together, the rest in file order."""

from __future__ import annotations

import io
import random
from collections.abc import AsyncIterator
from typing import cast

import pytest

from services.api.dispatch.order import HEADER, Affinity, OrderCursor, OrderEntry, read_entries, scan_order
from services.api.prompt_keys import prefix_key, prompt_text, shared_blocks
from services.api.service.dispatch_order import OrderBuilder, OrderStats, PartOrders
from shared.expected_output import LONGEST, SHORT, expected_length
from shared.input_lines import InputLine
from shared.storage import ObjectStore

DOCS = [f"Document {d}: " + " ".join(f"w{d}x{i}" for i in range(120)) for d in range(6)]


def chat(system: str, user: str) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }


def build(
    texts: list[str | None],
    run_bytes: int = 1 << 30,
    lengths: list[int] | None = None,
    longest_first: bool = True,
) -> list[OrderEntry]:
    """The order of a file whose lines are ``texts`` (each line's prompt is its text), with
    their expected ``lengths`` (all alike when not given)."""
    builder = OrderBuilder(min_shared_chars=256, run_bytes=run_bytes, longest_first=longest_first)
    source = io.BytesIO()
    for number, text in enumerate(texts, 1):
        raw = (text or "").encode()
        length = lengths[number - 1] if lengths else LONGEST
        builder.add(InputLine(number, source.tell(), raw), text, length=length)
        source.write(raw + b"\n")
    builder.plan()
    out = io.BytesIO()
    builder.write(out, source)
    builder.close()
    entries, used = read_entries(out.getvalue())
    assert used == len(out.getvalue()) == sum(HEADER.size + len(t or "") for t in texts)
    for entry in entries:  # each line is stored in full behind its header
        assert entry.raw == (texts[entry.number - 1] or "").encode() and entry.length == len(entry.raw)
    return entries


def stats(texts: list[str], lengths: list[int] | None = None) -> OrderStats:
    builder = OrderBuilder(min_shared_chars=256, longest_first=True)
    start = 0
    for number, text in enumerate(texts, 1):
        length = lengths[number - 1] if lengths else LONGEST
        builder.add(InputLine(number, start, text.encode()), text, length=length)
        start += len(text) + 1
    found = builder.plan()
    builder.close()
    return found


def shuffled_questions(seed: int = 7) -> list[str]:
    lines = [f"{doc}\nQuestion {q}: what about {q}?" for doc in DOCS for q in range(5)]
    random.Random(seed).shuffle(lines)
    return lines


def test_lines_of_one_document_are_sent_together_and_every_line_once() -> None:
    texts = shuffled_questions()
    entries = build(texts)
    assert sorted(e.number for e in entries) == list(range(1, len(texts) + 1))
    docs = [texts[e.number - 1].split(":")[0] for e in entries]
    runs = [d for i, d in enumerate(docs) if i == 0 or docs[i - 1] != d]
    assert len(runs) == len(DOCS), docs  # each document's lines form one run
    groups = {e.group for e in entries}
    assert len(groups) == len(DOCS) and 0 not in groups
    by_doc = {texts[e.number - 1].split(":")[0]: e.group for e in entries}
    assert len(set(by_doc.values())) == len(DOCS)
    for doc_group in groups:
        assert sorted(e.rank for e in entries if e.group == doc_group) == list(range(5))


def test_groups_go_by_their_first_line_and_unshared_lines_keep_their_place() -> None:
    texts: list[str | None] = list(shuffled_questions())
    texts.insert(0, "a short line of its own")
    texts.insert(10, None)  # a body without a prompt (e.g. an embedding)
    entries = build(texts)
    assert entries[0].number == 1 and entries[0].group == 0
    firsts = []
    for e in entries:
        if e.group and (not firsts or firsts[-1][0] != e.group):
            firsts.append((e.group, min(x.number for x in entries if x.group == e.group)))
    assert [f for _, f in firsts] == sorted(f for _, f in firsts)
    lone = next(i for i, e in enumerate(entries) if e.number == 11)
    before = {e.number for e in entries[:lone]}
    assert set(range(1, 11)) <= before, "a lone line goes after every line above it in the file"


def test_a_file_without_shared_prefixes_keeps_file_order() -> None:
    texts = [f"say req-{n}" for n in range(1, 200)]
    entries = build(texts)
    assert [e.number for e in entries] == list(range(1, 200))
    assert {e.group for e in entries} == {0}


def test_the_external_sort_gives_the_same_order_as_in_memory() -> None:
    texts = shuffled_questions(seed=3)
    assert build(texts, run_bytes=4_000) == build(texts)  # runs of a few lines, spilled and merged


def test_the_same_prefix_has_the_same_group_in_any_batch() -> None:
    first = {e.group for e in build(shuffled_questions(seed=1)[:12])} - {0}  # a lone line: none
    assert first
    second = {e.group for e in build(shuffled_questions(seed=2))}
    assert first <= second


def test_prompt_text_follows_the_rendered_order() -> None:
    a = prompt_text("/v1/chat/completions", chat("You are terse." * 80, "Q1"))
    b = prompt_text("/v1/chat/completions", chat("You are terse." * 80, "Q2"))
    assert a is not None and b is not None
    assert shared_blocks(prefix_key(a), prefix_key(b)) == 1127 // 256  # the whole blocks they share
    assert prompt_text("/v1/embeddings", {"input": "x"}) is None
    assert prompt_text("/v1/completions", {"prompt": "abc"}) == "abc"


def test_a_messages_prompt_shares_its_system_prompt_as_a_prefix() -> None:
    system = "You are terse." * 80
    a = prompt_text("/v1/messages", {"system": system, "messages": [{"role": "user", "content": "Q1"}]})
    b = prompt_text("/v1/messages", {"system": system, "messages": [{"role": "user", "content": "Q2"}]})
    assert a is not None and b is not None and a.startswith("system\x1f" + system)
    assert shared_blocks(prefix_key(a), prefix_key(b)) == len(f"system\x1f{system}\x1e") // 256
    blocks = [{"type": "text", "text": system}]
    c = prompt_text("/v1/messages", {"system": blocks, "messages": [{"role": "user", "content": "Q3"}]})
    assert c is not None and c.startswith("system\x1f" + system)


def test_affinity_keeps_a_slice_on_its_partition_and_spills_when_full() -> None:
    affinity = Affinity(slice_lines=4, slack_lines=2)
    entry = OrderEntry(start=0, length=1, number=1, group=12345, rank=0)
    home = affinity.partition(entry, 4, {})
    assert home is not None
    again = OrderEntry(start=0, length=1, number=2, group=12345, rank=3)
    assert affinity.partition(again, 4, {home: 100}) == home  # a slice stays where it began
    fresh = Affinity(slice_lines=4, slack_lines=2)
    emptiest = (home + 1) % 4
    load = {p: 50 for p in range(4)} | {emptiest: 0}
    assert fresh.partition(entry, 4, load) == emptiest  # the home partition is far fuller
    assert affinity.partition(OrderEntry(0, 1, 3, 0, 0), 4, {}) is None  # no group: anywhere
    assert affinity.partition(entry, 1, {}) is None


def test_an_order_that_changes_nothing_is_not_worth_storing() -> None:
    assert not stats([f"say req-{n}" for n in range(50)]).worth_storing  # no shared prefix
    same = [DOCS[0] + f" question {n}" for n in range(50)]  # one group, already in place
    assert stats(same).groups == 1 and not stats(same).worth_storing
    assert stats(shuffled_questions()).worth_storing
    ordered = [f"{doc}\nQuestion {q}" for doc in DOCS for q in range(3)]  # in place, but 6 groups
    found = stats(ordered)
    assert found.in_file_order and found.worth_storing  # affinity still places the groups


@pytest.mark.parametrize("prompt", [" ".join(DOCS), "a prompt of 600 bytes " * 27], ids=["4 KiB+", "600 B"])
def test_lines_sharing_their_whole_key_keep_file_order_with_the_group_of_their_prefix(prompt: str) -> None:
    same = [prompt] * 40  # every line has the same key (past the 4 KiB a key covers, or equal)
    found = stats(same)
    assert found.groups == 1 and found.grouped == 40 and not found.worth_storing
    entries = build(same)  # written all the same (a mixed batch's part)
    assert [e.number for e in entries] == list(range(1, 41)) and [e.rank for e in entries] == list(range(40))
    with_lone = build([*same[:5], "a line of its own", *same[5:]])  # placed the long way
    assert with_lone[5].number == 7 and with_lone[-1].number == 6
    key = prefix_key(prompt)
    last = -(-len(key.rstrip(b"\0")) // 4) - 1  # the digest of the whole prefix the lines share
    expected = int.from_bytes(key[last * 4 : last * 4 + 4], "big")
    assert {e.group for e in entries} == {e.group for e in with_lone} - {0} == {expected}


def test_longest_lines_go_first_and_equal_lengths_keep_file_order() -> None:
    texts = [f"say req-{n}" for n in range(1, 41)]
    lengths = [400 if n % 10 == 0 else 16 for n in range(1, 41)]  # a tenth long, spread through
    entries = build(texts, lengths=lengths)
    assert [e.number for e in entries] == [10, 20, 30, 40, *(n for n in range(1, 41) if n % 10)]
    assert {e.group for e in entries} == {0}
    assert stats(texts, lengths).worth_storing  # lines move: the order is stored
    assert not stats(texts, [16] * 40).worth_storing  # one length: the file's own order


def test_a_mixed_batchs_part_goes_longest_first_too() -> None:
    parts = PartOrders(min_shared_chars=256, longest_first=True)
    source = io.BytesIO()
    for number in range(1, 21):
        raw = f"say req-{number}".encode()
        length = 400 if number % 10 == 0 else 16
        parts.add("base", "m", InputLine(number, source.tell(), raw), raw.decode(), length)
        source.write(raw + b"\n")
    order = parts.parts["base"]
    order.plan()
    out = io.BytesIO()
    order.write(out, source)
    parts.close()
    entries, _ = read_entries(out.getvalue())
    assert [e.number for e in entries][:2] == [10, 20]


def test_groups_go_by_their_longest_line_and_stay_together() -> None:
    texts = shuffled_questions()
    doc_of = [t.split(":")[0] for t in texts]
    # Document 4's questions are long, and one question of document 2 is longer still.
    lengths = [(64 if d == "Document 4" else 8) for d in doc_of]
    lengths[doc_of.index("Document 2")] = 512
    entries = build(texts, lengths=lengths)
    docs = [doc_of[e.number - 1] for e in entries]
    runs = [d for i, d in enumerate(docs) if i == 0 or docs[i - 1] != d]
    assert len(runs) == len(DOCS), docs  # no group is broken
    assert runs[:2] == ["Document 2", "Document 4"]
    assert lengths[entries[0].number - 1] == 512  # the longest line of the longest group first
    for doc in set(doc_of):
        mine = [lengths[e.number - 1] for e in entries if doc_of[e.number - 1] == doc]
        assert mine == sorted(mine, reverse=True)
        ranks = [e.rank for e in entries if doc_of[e.number - 1] == doc]
        assert ranks == list(range(len(ranks)))
    rest = runs[2:]  # groups of one length go by their first line
    firsts = {d: min(n for n, x in enumerate(doc_of, 1) if x == d) for d in rest}
    assert rest == sorted(rest, key=firsts.__getitem__)


def test_with_longest_first_off_the_order_ignores_lengths() -> None:
    texts = shuffled_questions(seed=5)
    lengths = [random.Random(n).choice([8, 64, 512]) for n in range(len(texts))]
    assert build(texts, lengths=lengths, longest_first=False) == build(texts)
    plain = [f"say req-{n}" for n in range(1, 30)]
    entries = build(plain, lengths=[n % 7 + 1 for n in range(29)], longest_first=False)
    assert [e.number for e in entries] == list(range(1, 30))


def test_expected_length_reads_the_output_cap_or_the_batch_default() -> None:
    chat_url = "/v1/chat/completions"
    assert expected_length(chat_url, {"max_completion_tokens": 300, "max_tokens": 5}, 64) == 300
    assert expected_length(chat_url, {"max_tokens": 5}, 64) == 5
    assert expected_length("/v1/responses", {"max_output_tokens": 7}, None) == 7
    assert expected_length("/v1/responses", {"max_tokens": 9}, 64) == 64  # not a Responses cap
    assert expected_length("/v1/messages", {"max_tokens": 9}, None) == 9  # Anthropic's required cap
    assert expected_length(chat_url, {"messages": []}, 64) == 64  # the batch's max_decoding_length
    assert expected_length(chat_url, {"max_tokens": "many"}, None) == LONGEST  # no cap: may run longest
    assert expected_length(chat_url, None, None) == LONGEST
    assert expected_length("/v1/embeddings", {"input": "x"}, 64) == SHORT
    assert expected_length("/v1/score", {"text_1": "a"}, None) == SHORT


class FakeObjectStore:
    """Serves one object from memory in 7-byte chunks (an entry spans several), from an offset."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def iter_chunks(self, key: str, offset: int = 0, length: int = 0) -> AsyncIterator[bytes]:
        end = offset + length if length else len(self.data)
        for start in range(offset, end, 7):
            yield self.data[start : min(start + 7, end)]


def order_object(texts: list[str]) -> bytes:
    builder = OrderBuilder(min_shared_chars=256)
    source = io.BytesIO()
    for number, text in enumerate(texts, 1):
        builder.add(InputLine(number, source.tell(), text.encode()), text)
        source.write(text.encode() + b"\n")
    builder.plan()
    out = io.BytesIO()
    builder.write(out, source)
    builder.close()
    return out.getvalue()


async def test_a_cursor_resumes_at_its_saved_position_and_a_scan_reads_the_sent_lines() -> None:
    texts = shuffled_questions(seed=9)
    store = cast(ObjectStore, FakeObjectStore(order_object(texts)))
    expected = [e.number for e in build(texts)]
    cursor = OrderCursor(store, "k")
    first = await cursor.take(7)
    assert [x.number for x in first] == expected[:7]
    assert all(x.raw == texts[x.number - 1].encode() for x in first)
    assert set(cursor.placed) == {x.number for x in first}
    line, byte = cursor.line, cursor.byte  # what the dispatcher saves once they are on Kafka
    await cursor.close()
    resumed = OrderCursor(store, "k", line, byte)
    rest = await resumed.take(1000)
    assert [x.number for x in rest] == expected[7:] and resumed.exhausted
    sent = [x.number async for x in scan_order(store, "k", line)]
    assert sent == expected[:7]  # a takeover's check looks at exactly the lines sent before
