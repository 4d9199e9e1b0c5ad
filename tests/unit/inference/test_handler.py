"""RequestHandler: defaults precedence, the served model, error mapping, expiry."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.inference.engine import CHAT, COMPLETIONS, EMBEDDINGS, error_body
from services.inference.fake_engine import InstantFakeEngine
from services.inference.handler import RequestHandler, apply_defaults, context_limit
from shared.protocol.messages import RequestMessage, SamplingDefaults


class RecordingEngine(InstantFakeEngine):
    """The fake engine, remembering what it was asked; optionally answering a fixed error."""

    def __init__(self, answer: tuple[int, dict[str, Any]] | None = None, fail: bool = False):
        super().__init__(model_id="served-model")
        self.seen: list[tuple[str, dict[str, Any], str, int | None]] = []
        self.answer = answer
        self.fail = fail

    async def run(self, url, body, request_id, *, max_context_length=None):  # type: ignore[no-untyped-def]
        self.seen.append((url, body, request_id, max_context_length))
        if self.fail:
            raise RuntimeError("boom")
        if self.answer is not None:
            return self.answer
        return await super().run(url, body, request_id, max_context_length=max_context_length)


def message(url: str = CHAT, body: dict[str, Any] | None = None, **kw: Any) -> RequestMessage:
    body = body if body is not None else {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return RequestMessage(request_id="batch_req_1", custom_id="c1", url=url, body=body, **kw)


DEFAULTS = SamplingDefaults(
    max_decoding_length=50, max_context_length=100, temperature=0.5, top_p=0.9, top_k=5
)


def test_defaults_fill_only_unset_fields() -> None:
    body: dict[str, Any] = {"temperature": 0.0, "top_p": None, "max_completion_tokens": 7}
    apply_defaults(CHAT, body, DEFAULTS)
    assert body["temperature"] == 0.0  # set by the body: kept (even when falsy)
    assert body["top_p"] == 0.9  # null counts as unset
    assert body["top_k"] == 5
    assert "max_tokens" not in body  # max_completion_tokens already bounds the output


def test_max_decoding_length_is_the_max_tokens_fallback() -> None:
    body: dict[str, Any] = {}
    apply_defaults(COMPLETIONS, body, DEFAULTS)
    assert body["max_tokens"] == 50
    body = {"max_tokens": 3}
    apply_defaults(COMPLETIONS, body, DEFAULTS)
    assert body["max_tokens"] == 3


def test_embeddings_take_no_sampling_defaults() -> None:
    body: dict[str, Any] = {"input": "x"}
    apply_defaults(EMBEDDINGS, body, DEFAULTS)
    assert body == {"input": "x"}


def test_context_limit_body_wins_and_is_removed() -> None:
    body: dict[str, Any] = {"max_context_length": 30}
    assert context_limit(body, DEFAULTS) == 30
    assert "max_context_length" not in body
    assert context_limit({}, DEFAULTS) == 100
    assert context_limit({}, None) is None


async def test_success_is_a_200_response_with_the_served_model() -> None:
    engine = RecordingEngine()
    msg = message(batch_id="batch_1", line=3, defaults=DEFAULTS)
    result = await RequestHandler(engine).handle(msg)
    url, body, run_id, limit = engine.seen[0]
    assert url == CHAT
    assert body["model"] == "served-model"
    assert body["max_tokens"] == 50 and limit == 100
    assert msg.body["model"] == "m"  # the message itself is not changed
    assert result.error is None and result.response is not None
    assert result.response.status_code == 200
    assert result.response.request_id == run_id and run_id.startswith("req_")
    assert result.response.body["object"] == "chat.completion"
    assert (result.request_id, result.custom_id, result.batch_id, result.line) == (
        "batch_req_1",
        "c1",
        "batch_1",
        3,
    )
    assert result.succeeded and result.response is not None
    assert result.response.body["usage"]["total_tokens"] >= 1


async def test_engine_rejection_is_a_4xx_response_not_an_error() -> None:
    rejection = (400, error_body("too long", 400, param="input_tokens"))
    result = await RequestHandler(RecordingEngine(answer=rejection)).handle(message())
    assert result.error is None
    assert result.response is not None and result.response.status_code == 400
    assert result.response.body["error"]["message"] == "too long"
    assert set(result.response.body["error"]) == {"message", "type", "param", "code"}
    assert not result.succeeded


async def test_engine_crash_becomes_a_500_line() -> None:
    result = await RequestHandler(RecordingEngine(fail=True)).handle(message())
    assert result.response is not None and result.response.status_code == 500
    assert result.response.body["error"]["type"] == "InternalServerError"


async def test_expired_message_is_not_run() -> None:
    engine = RecordingEngine()
    handler = RequestHandler(engine, clock=lambda: 1000.0)
    result = await handler.handle(message(batch_id="b", expires_at=999.0))
    assert engine.seen == []
    assert result.response is None
    assert result.error is not None and result.error.code == "batch_expired"
    assert result.output_line()["response"] is None
    ok = await handler.handle(message(expires_at=1001.0))
    assert ok.response is not None


async def test_cancellation_propagates() -> None:
    class Slow(RecordingEngine):
        async def run(self, *a, **kw):  # type: ignore[no-untyped-def]
            await asyncio.sleep(10)

    task = asyncio.create_task(RequestHandler(Slow()).handle(message()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_fake_engine_shapes() -> None:
    engine = InstantFakeEngine(max_context_length=5)
    status, body = await engine.run(COMPLETIONS, {"prompt": "a b"}, "r")
    assert status == 200 and body["object"] == "text_completion"
    status, body = await engine.run(EMBEDDINGS, {"input": ["a", "b"]}, "r")
    assert body["object"] == "list" and len(body["data"]) == 2
    status, body = await engine.run(COMPLETIONS, {"prompt": "a b c d e f"}, "r")
    assert status == 400 and body["error"]["code"] == 400
    status, _ = await engine.run("/v1/responses", {}, "r")
    assert status == 404
    status, _ = await engine.run(CHAT, {"messages": [], "stream": True}, "r")
    assert status == 400
