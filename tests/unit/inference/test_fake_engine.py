"""FakeEngine's prompt tokens: whitespace words exactly as ``str.split()`` counts them."""

from __future__ import annotations

import pytest

from services.inference.engine import CHAT, COMPLETIONS, RERANK, SCORE
from services.inference.fake_engine import FakeEngine

PROMPTS = [
    "",
    " ",
    "one",
    "  two  words  ",
    "tab\tnew\nline\rvertical\x0bform\x0cfeed",
    "unit\x1fseparators\x1c\x1d\x1eare spaces to str.split",
    "nul\x00and\x7fdel are not",
    "non\u00a0breaking\u2003spaces\u3000count\x85too",
    "lorem ipsum dolor sit amet " * 150,
]


@pytest.mark.parametrize("prompt", PROMPTS)
async def test_prompt_tokens_are_whitespace_words(prompt: str) -> None:
    engine = FakeEngine(max_context_length=10_000)
    answer = await engine.run(COMPLETIONS, {"prompt": prompt}, "req_1")
    assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt.split())


async def test_a_chat_counts_the_words_of_every_message() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": " say\thi now "}]
    answer = await FakeEngine().run(CHAT, {"messages": messages}, "req_1")
    assert answer.usage is not None and answer.usage.prompt_tokens == 5


async def test_scores_come_in_vllms_shapes_and_say_what_they_are() -> None:
    engine = FakeEngine()
    scored = await engine.run(SCORE, {"queries": "a cat", "documents": ["a cat sat", "dog"]}, "req_1")
    body = scored.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    assert [d["score"] for d in body["data"]] == [2 / 3, 0.0]  # shared words: a fake's score
    assert scored.usage is not None and body["usage"]["total_tokens"] == scored.usage.prompt_tokens == 8
    reranked = (
        await engine.run(RERANK, {"query": "a cat", "documents": ["dog", "a cat"], "top_n": 1}, "r")
    ).json()
    assert [(r["index"], r["document"]["text"]) for r in reranked["results"]] == [(1, "a cat")]


async def test_a_score_body_without_its_pair_is_a_400() -> None:
    answer = await FakeEngine().run(SCORE, {"text_1": "a"}, "req_1")
    assert answer.status == 400 and answer.json()["error"]["param"] == "text_2"
