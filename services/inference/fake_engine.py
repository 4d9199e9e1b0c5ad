"""InstantFakeEngine: answers at once with correctly shaped bodies. For tests and benchmarks only.

It measures the plumbing (Kafka, handler, aggregator) without a model in the way; the bodies have
the fields vLLM's server returns, with a fixed echo text and whitespace-split token counts.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from services.inference.engine import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    Answer,
    error_answer,
    unsupported_endpoint,
)

FAKE_TEXT = "ok"
EMBEDDING_DIM = 8


class InstantFakeEngine:
    """A fake engine: no model, instant answers. Prompts over the context length still fail."""

    def __init__(
        self,
        model_id: str = "fake-model",
        max_context_length: int = 2048,
        endpoints: tuple[str, ...] = (CHAT, COMPLETIONS, EMBEDDINGS),
    ) -> None:
        self.model_id = model_id
        self.max_context_length = max_context_length
        self.endpoints = endpoints
        self.calls = 0

    async def run(
        self,
        url: str,
        body: dict[str, Any],
        request_id: str,
        *,
        max_context_length: int | None = None,
    ) -> Answer:
        self.calls += 1
        if url not in self.endpoints:
            return unsupported_endpoint(url, self.endpoints)
        if body.get("stream"):
            return error_answer("Request must not be sent in stream mode", param="stream")
        prompt_tokens = _count_tokens(body.get("messages") or body.get("prompt") or body.get("input"))
        limit = min(max_context_length or self.max_context_length, self.max_context_length)
        if prompt_tokens > limit:
            return error_answer(
                f"Input length ({prompt_tokens}) exceeds model's maximum context length ({limit}).",
                param="input_tokens",
            )
        if url == EMBEDDINGS:
            return 200, self._embedding(body, prompt_tokens)
        completion_tokens = 1
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if url == CHAT:
            return 200, self._chat(request_id, usage)
        return 200, self._completion(request_id, usage)

    async def abort(self, request_id: str) -> None:
        return None

    def _chat(self, request_id: str, usage: dict[str, int]) -> dict[str, Any]:
        message = {"role": "assistant", "content": FAKE_TEXT, "tool_calls": []}
        return {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
            "usage": usage,
        }

    def _completion(self, request_id: str, usage: dict[str, int]) -> dict[str, Any]:
        choice = {"index": 0, "text": FAKE_TEXT, "logprobs": None, "finish_reason": "stop"}
        return {
            "id": f"cmpl-{request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": [choice],
            "usage": usage,
        }

    def _embedding(self, body: dict[str, Any], prompt_tokens: int) -> dict[str, Any]:
        inputs = body.get("input")
        count = len(inputs) if isinstance(inputs, list) and inputs else 1
        if isinstance(inputs, list) and inputs and isinstance(inputs[0], int):
            count = 1  # one prompt given as token ids
        data = [{"index": i, "object": "embedding", "embedding": [0.0] * EMBEDDING_DIM} for i in range(count)]
        return {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": self.model_id,
            "data": data,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }


def _count_tokens(value: Any) -> int:
    """Whitespace tokens in a prompt, messages list or input (a stand-in for a tokenizer)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, int):
        return 1
    if isinstance(value, dict):
        return _count_tokens(value.get("content")) + _count_tokens(value.get("text"))
    if isinstance(value, list):
        return sum(_count_tokens(item) for item in value)
    return 0
