"""FakeEngine's prompt tokens: whitespace words exactly as ``str.split()`` counts them."""

from __future__ import annotations

import pytest

from services.inference.engine import CHAT, COMPLETIONS
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
