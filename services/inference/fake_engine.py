"""FakeEngine: no model, correctly shaped answers. For tests and the pipeline benchmark only.

With ``seconds_per_token=0`` (the default) it is the "instant engine" the pipeline benchmark and the
fake-engine stack run: it measures the plumbing (Kafka, handler, aggregator) without a model in
the way. The bodies have the fields vLLM's server returns, with a fixed echo text and
whitespace-split token counts. It keeps the engine contract (``engine.py``) like the vLLM engine,
through the same ``RunRegistry``. Its score and rerank answers are a fake's too: a pair's score is
the share of words its two texts have in common, not any model's judgement.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from services.inference.engine import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    LINE_TIMES,
    MESSAGES,
    RERANK,
    RESPONSES,
    SCORE,
    Answer,
    RunRegistry,
    error_answer,
    refuse_before_running,
)
from services.inference.settings import default
from shared.protocol.batch_input import ScoreBody
from shared.protocol.messages import TokenUsage

FAKE_TEXT = "ok"
EMBEDDING_DIM = 8
# The field each endpoint's request cannot do without (what vLLM's request models require).
REQUIRED_FIELD: dict[str, str] = {
    CHAT: "messages",
    COMPLETIONS: "prompt",
    EMBEDDINGS: "input",
    RESPONSES: "input",
    MESSAGES: "messages",
}


class FakeEngine:
    """A fake engine: answers at once, or after ``seconds_per_token`` times the request's
    ``max_tokens`` (so a test can have a request that runs until aborted). Prompts over the
    context length still fail."""

    def __init__(
        self,
        model_id: str = "fake-model",
        max_context_length: int = default("max_model_len"),
        endpoints: tuple[str, ...] = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, SCORE, RERANK),
        seconds_per_token: float = default("fake_seconds_per_token"),
        max_running: int = 0,
        adapters: tuple[str, ...] = (),
    ) -> None:
        self.model_id = model_id
        self.adapters = adapters
        self.max_running = max_running  # the worker's places on it (0: it runs everything at once)
        self.queues = False  # every line it is given runs at once
        self.step_cost = LINE_TIMES  # a paced line takes its own time, whatever runs beside it
        self.max_context_length = max_context_length
        self.endpoints = endpoints
        self.seconds_per_token = seconds_per_token
        self.calls = 0
        self._runs = RunRegistry()

    async def run(
        self,
        url: str,
        body: dict[str, Any],
        request_id: str,
        *,
        max_context_length: int | None = None,
        priority: int = 0,  # no queue: every request runs at once
    ) -> Answer:
        self.calls += 1
        refusal = refuse_before_running(url, body, self.endpoints)
        if refusal is not None:
            return refusal
        delay = self.seconds_per_token * _max_tokens(body)
        if delay <= 0:
            return self._answer(url, body, request_id, max_context_length)
        return await self._runs.run(request_id, self._later(delay, url, body, request_id, max_context_length))

    async def abort(self, request_id: str) -> None:
        self._runs.abort(request_id)

    async def _later(
        self, delay: float, url: str, body: dict[str, Any], request_id: str, max_context_length: int | None
    ) -> Answer:
        await asyncio.sleep(delay)
        return self._answer(url, body, request_id, max_context_length)

    def _answer(
        self,
        url: str,
        body: dict[str, Any],
        request_id: str,
        max_context_length: int | None,
        completion_tokens: int = 1,
    ) -> Answer:
        """The answer's body and usage; ``completion_tokens`` words of ``FAKE_TEXT`` (the
        simulated engine's output lengths)."""
        if url in (SCORE, RERANK):
            return self._scores(url, body, request_id)
        required = REQUIRED_FIELD[url]
        if body.get(required) is None or (url == CHAT and not isinstance(body[required], list)):
            return error_answer(f"1 validation error:\n  {required}: Field required", param=required)
        if url == MESSAGES and not isinstance(body.get("max_tokens"), int):  # Anthropic requires it
            return error_answer("1 validation error:\n  max_tokens: Field required", param="max_tokens")
        prompt_tokens = _count_tokens(body[required]) + _count_tokens(body.get("instructions"))
        prompt_tokens += _count_tokens(body.get("system"))
        limit = min(max_context_length or self.max_context_length, self.max_context_length)
        if prompt_tokens > limit:
            return error_answer(
                f"Input length ({prompt_tokens}) exceeds model's maximum context length ({limit}).",
                param="input_tokens",
            )
        # An adapter's line is answered under the adapter's name, as vLLM does.
        model = body["model"] if body.get("model") in self.adapters else self.model_id
        if url == EMBEDDINGS:
            usage = TokenUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
            return Answer.of(200, self._embedding(body, usage, model), usage)
        usage = TokenUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        text = FAKE_TEXT if completion_tokens == 1 else " ".join([FAKE_TEXT] * completion_tokens)
        if url == CHAT:
            return Answer.of(200, self._chat(request_id, usage, model, text), usage)
        if url == RESPONSES:
            return Answer.of(200, self._response(request_id, usage, model, text), usage)
        if url == MESSAGES:
            return Answer.of(200, self._message(request_id, usage, model, text), usage)
        return Answer.of(200, self._completion(request_id, usage, model, text), usage)

    def _chat(self, request_id: str, usage: TokenUsage, model: str, text: str = FAKE_TEXT) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "tool_calls": []}
        return {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
            "usage": _usage_body(usage),
        }

    def _completion(
        self, request_id: str, usage: TokenUsage, model: str, text: str = FAKE_TEXT
    ) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
        return {
            "id": f"cmpl-{request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": _usage_body(usage),
        }

    def _message(
        self, request_id: str, usage: TokenUsage, model: str, text: str = FAKE_TEXT
    ) -> dict[str, Any]:
        """An Anthropic Messages answer as vLLM's Messages route sends it (no null fields)."""
        return {
            "id": f"chatcmpl-{request_id}",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": model,
            "stop_reason": "end_turn",
            "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens},
        }

    def _response(
        self, request_id: str, usage: TokenUsage, model: str, text: str = FAKE_TEXT
    ) -> dict[str, Any]:
        content: dict[str, Any] = {
            "type": "output_text",
            "text": text,
            "annotations": [],
            "logprobs": None,
        }
        message = {
            "id": f"msg_{request_id}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [content],
        }
        return {
            "id": f"resp_{request_id}",
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": "completed",
            "output": [message],
            "usage": {
                "input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.total_tokens,
            },
        }

    def _embedding(self, body: dict[str, Any], usage: TokenUsage, model: str) -> dict[str, Any]:
        inputs = body.get("input")
        count = len(inputs) if isinstance(inputs, list) and inputs else 1
        if isinstance(inputs, list) and inputs and isinstance(inputs[0], int):
            count = 1  # one prompt given as token ids
        data = [{"index": i, "object": "embedding", "embedding": [0.0] * EMBEDDING_DIM} for i in range(count)]
        return {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.total_tokens},
        }

    def _scores(self, url: str, body: dict[str, Any], request_id: str) -> Answer:
        """A score ``list`` or a rerank answer, shaped as vLLM's ``ServingScores`` shapes them."""
        first, second = ("query", "documents") if url == RERANK else _score_pair(body)
        missing = next((name for name in (first, second) if body.get(name) is None), None)
        if missing is not None:
            return error_answer(f"1 validation error:\n  {missing}: Field required", param=missing)
        lefts, rights = _as_list(body[first]), _as_list(body[second])
        if len(lefts) == 1:
            lefts = lefts * len(rights)
        if not rights or len(lefts) != len(rights):
            return error_answer("Input lengths must be either 1:1, 1:N or N:N")
        pairs = list(zip(lefts, rights, strict=True))
        scores = [_overlap(left, right) for left, right in pairs]
        tokens = sum(_count_tokens(left) + _count_tokens(right) for left, right in pairs)
        usage = TokenUsage(prompt_tokens=tokens, total_tokens=tokens)
        usage_body = {"prompt_tokens": tokens, "total_tokens": tokens}
        if url == RERANK:
            order = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.get("top_n") or None]
            results = [
                {"index": i, "document": _document(rights[i]), "relevance_score": scores[i]} for i in order
            ]
            reranked = {
                "id": f"score-{request_id}",
                "model": self.model_id,
                "usage": usage_body,
                "results": results,
            }
            return Answer.of(200, reranked, usage)
        scored = {
            "id": f"score-{request_id}",
            "object": "list",
            "created": int(time.time()),
            "model": self.model_id,
            "data": [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores)],
            "usage": {**usage_body, "completion_tokens": 0},
        }
        return Answer.of(200, scored, usage)


def _score_pair(body: dict[str, Any]) -> tuple[str, str]:
    """The pair of fields a score body gives (``ScoreBody.PAIRS``), else the one it has begun."""
    missing = ScoreBody.missing(body, "queries")
    for pair in ScoreBody.PAIRS:
        if missing in pair or (missing is None and all(body.get(name) is not None for name in pair)):
            return pair
    return ScoreBody.PAIRS[0]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _words(value: Any) -> set[str]:
    return set(value.lower().split()) if isinstance(value, str) else set()


def _overlap(left: Any, right: Any) -> float:
    """The fake's score of a pair: words in both over words in either (0 for two empty texts)."""
    a, b = _words(left), _words(right)
    return len(a & b) / len(a | b) if a or b else 0.0


def _document(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"text": value, "multi_modal": None}
    return {"text": None, "multi_modal": value.get("content", []) if isinstance(value, dict) else []}


def _usage_body(usage: TokenUsage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_tokens") or body.get("max_completion_tokens") or body.get("max_output_tokens") or 1
    return value if isinstance(value, int) and value > 0 else 1


# str.split()'s separators among ASCII characters (str.isspace); every other byte is a word byte.
_ASCII_SPACE = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "
_SPACE_OR_WORD = bytes(0x20 if byte in _ASCII_SPACE else 0x78 for byte in range(256))


def _count_words(text: str) -> int:
    """``len(text.split())`` without building the words: an ASCII text's whitespace runs become
    spaces and its other characters ``x``, and each word is a start or a space followed by an ``x``.
    Measured on the pipeline benchmark's 4 KB prompts: 6 us instead of 15-22 us, which was 17% of
    the fake-engine worker's CPU. Other text is split as before."""
    if not text.isascii():
        return len(text.split())
    marks = text.encode("ascii").translate(_SPACE_OR_WORD)
    return marks.count(b" x") + marks.startswith(b"x")


def _count_tokens(value: Any) -> int:
    """Whitespace tokens in a prompt, messages list or input (a stand-in for a tokenizer)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return _count_words(value)
    if isinstance(value, int):
        return 1
    if isinstance(value, dict):
        return _count_tokens(value.get("content")) + _count_tokens(value.get("text"))
    if isinstance(value, list):
        return sum(_count_tokens(item) for item in value)
    return 0
