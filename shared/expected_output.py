"""A request line's expected output length in tokens: the one rule the dispatch order (longest
first), the batch's expected work and the workers' progress reports (its estimated completion
time) share.

A line is expected to generate up to its output cap (by the names its endpoint reads, as vLLM
does: ``OUTPUT_CAPS_BY_ENDPOINT``), else the batch's ``max_decoding_length``, else the longest of
all (``LONGEST``: nothing bounds it); an embedding, score or rerank line generates nothing
(``SHORT``).
"""

from __future__ import annotations

from typing import Any

from shared.protocol.openai import CHAT, COMPLETIONS, MESSAGES, RESPONSES

OUTPUT_CAPS_BY_ENDPOINT: dict[str, tuple[str, ...]] = {
    CHAT: ("max_completion_tokens", "max_tokens"),  # vLLM takes the first one set
    COMPLETIONS: ("max_tokens",),
    RESPONSES: ("max_output_tokens",),
    MESSAGES: ("max_tokens",),
}
"""The endpoints that generate, and the names of a body's output cap on each."""
OUTPUT_CAPS = tuple(dict.fromkeys(n for names in OUTPUT_CAPS_BY_ENDPOINT.values() for n in names))
"""Every name of an output cap (validation checks whichever a body sets against the context)."""
LONGEST = 0xFFFFFFFF
"""The expected length of a line without an output cap: the longest of all."""
SHORT = 1
"""The expected length of a line that generates nothing (embeddings, score, rerank)."""


def expected_length(url: str, body: dict[str, Any] | None, default: int | None) -> int:
    """How many tokens a line is expected to generate: its output cap, else ``default`` (the
    batch's ``max_decoding_length``), else ``LONGEST``; ``SHORT`` for a line that generates
    nothing."""
    names = OUTPUT_CAPS_BY_ENDPOINT.get(url)
    if names is None:
        return SHORT
    for name in names:
        value = (body or {}).get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, LONGEST)
    return min(default, LONGEST) if default else LONGEST
