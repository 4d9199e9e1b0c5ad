"""A request line's expected output length in tokens: the one rule the dispatch order (longest
first), the batch's expected work and the workers' progress reports (its estimated completion
time) share.

A line is expected to generate up to its output cap (``max_completion_tokens``, ``max_tokens`` or
``max_output_tokens``), else the batch's ``max_decoding_length``, else the longest of all
(``LONGEST``: nothing bounds it); an embedding, score or rerank line generates nothing (``SHORT``).
"""

from __future__ import annotations

from typing import Any

from shared.protocol.openai import GENERATE_ENDPOINTS

OUTPUT_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
"""A body's output cap, by the names the endpoints give it (Responses: ``max_output_tokens``)."""
LONGEST = 0xFFFFFFFF
"""The expected length of a line without an output cap: the longest of all."""
SHORT = 1
"""The expected length of a line that generates nothing (embeddings, score, rerank)."""


def expected_length(url: str, body: dict[str, Any] | None, default: int | None) -> int:
    """How many tokens a line is expected to generate: its output cap, else ``default`` (the
    batch's ``max_decoding_length``), else ``LONGEST``; ``SHORT`` for a line that generates
    nothing."""
    if url not in GENERATE_ENDPOINTS:
        return SHORT
    for name in OUTPUT_CAPS:
        value = (body or {}).get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, LONGEST)
    return min(default, LONGEST) if default else LONGEST
