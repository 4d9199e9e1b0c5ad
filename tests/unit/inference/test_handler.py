"""RequestHandler: defaults precedence, the served model, error mapping, expiry, engine retries."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from services.inference import metrics
from services.inference.engine import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RESPONSES,
    Answer,
    EngineUnavailable,
    error_answer,
)
from services.inference.fake_engine import FakeEngine
from services.inference.handler import EngineRetry, RequestHandler, apply_defaults, context_limit
from shared.protocol.messages import ControlMessage, RequestMessage, SamplingDefaults

NO_WAIT = EngineRetry(attempts=3, wait_s=0.0, max_wait_s=0.0)


class RecordingFakeEngine(FakeEngine):
    """The fake engine, remembering what it was asked. It fails its first ``failures`` calls
    with ``fail_with`` (an exception to raise, or an answer to give), then answers normally."""

    def __init__(self, fail_with: Answer | Exception | None = None, failures: int = 1_000_000):
        super().__init__(model_id="served-model")
        self.seen: list[tuple[str, dict[str, Any], str, int | None]] = []
        self.fail_with = fail_with
        self.failures = failures

    async def run(self, url, body, request_id, *, max_context_length=None, priority=0):  # type: ignore[no-untyped-def]
        self.seen.append((url, body, request_id, max_context_length))
        if self.fail_with is not None and len(self.seen) <= self.failures:
            if isinstance(self.fail_with, Exception):
                raise self.fail_with
            return self.fail_with
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


def test_responses_take_the_defaults_with_max_decoding_length_as_max_output_tokens() -> None:
    body: dict[str, Any] = {"input": "x", "top_p": 0.3}
    apply_defaults(RESPONSES, body, DEFAULTS)
    assert body == {"input": "x", "top_p": 0.3, "temperature": 0.5, "top_k": 5, "max_output_tokens": 50}
    body = {"input": "x", "max_output_tokens": 4}
    apply_defaults(RESPONSES, body, DEFAULTS)
    assert body["max_output_tokens"] == 4 and "max_tokens" not in body


async def test_a_responses_line_becomes_a_result_with_the_bodys_usage() -> None:
    handler = RequestHandler(FakeEngine(), retry=NO_WAIT)
    body = {"model": "fake-model", "input": "one two three", "instructions": "be brief"}
    result = await handler.handle(message(RESPONSES, body))
    assert result.succeeded and result.usage is not None
    response = orjson.loads(bytes(result.response.body))  # type: ignore[union-attr]
    assert response["object"] == "response"
    assert result.usage.prompt_tokens == response["usage"]["input_tokens"] == 5
    assert result.usage.completion_tokens == response["usage"]["output_tokens"] == 1


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
    engine = RecordingFakeEngine()
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
    assert orjson.loads(bytes(result.response.body))["object"] == "chat.completion"
    assert (result.request_id, result.custom_id, result.batch_id, result.line) == (
        "batch_req_1",
        "c1",
        "batch_1",
        3,
    )
    assert result.succeeded and result.usage is not None and result.usage.total_tokens >= 1


async def test_engine_rejection_is_a_4xx_response_not_an_error_and_not_retried() -> None:
    engine = RecordingFakeEngine(fail_with=error_answer("too long", 400, param="input_tokens"))
    result = await RequestHandler(engine, retry=NO_WAIT).handle(message())
    assert result.error is None
    assert result.response is not None and result.response.status_code == 400
    error = orjson.loads(bytes(result.response.body))["error"]
    assert error["message"] == "too long" and set(error) == {"message", "type", "param", "code"}
    assert not result.succeeded
    assert len(engine.seen) == 1  # the request's own fault: final at once


def _sample(metric: Any, **labels: str) -> float:
    return float(metric.labels(**labels)._value.get() if labels else metric._value.get())


@pytest.mark.parametrize(
    "failure",
    [error_answer("engine overloaded", 503), RuntimeError("engine restarting")],
    ids=["5xx", "exception"],
)
async def test_a_failure_that_may_pass_is_retried_until_it_passes(failure: Any) -> None:
    reason = "exception" if isinstance(failure, Exception) else "5xx"
    retries = _sample(metrics.ENGINE_RETRIES, reason=reason)
    engine = RecordingFakeEngine(fail_with=failure, failures=2)
    result = await RequestHandler(engine, retry=NO_WAIT).handle(message())
    assert result.succeeded and len(engine.seen) == 3
    assert _sample(metrics.ENGINE_RETRIES, reason=reason) == retries + 2


@pytest.mark.parametrize(
    "failure", [error_answer("engine overloaded", 503), RuntimeError("boom")], ids=["5xx", "exception"]
)
async def test_a_failure_that_does_not_pass_becomes_a_5xx_line_after_the_last_try(failure: Any) -> None:
    gave_up = _sample(metrics.ENGINE_GAVE_UP)
    engine = RecordingFakeEngine(fail_with=failure)
    result = await RequestHandler(engine, retry=NO_WAIT).handle(message())
    assert len(engine.seen) == 3
    assert result.response is not None and result.response.status_code >= 500 and not result.succeeded
    assert orjson.loads(bytes(result.response.body))["error"]["type"] == "InternalServerError"
    assert _sample(metrics.ENGINE_GAVE_UP) == gave_up + 1


async def test_a_dead_engine_is_not_retried_and_not_an_answer() -> None:
    engine = RecordingFakeEngine(fail_with=EngineUnavailable("dead"))
    with pytest.raises(EngineUnavailable):
        await RequestHandler(engine, retry=NO_WAIT).handle(message())
    assert len(engine.seen) == 1


async def test_expired_message_is_not_run() -> None:
    engine = RecordingFakeEngine()
    handler = RequestHandler(engine, clock=lambda: 1000.0)
    result = await handler.handle(message(batch_id="b", expires_at=999.0))
    assert engine.seen == []
    assert result.response is None
    assert result.error is not None and result.error.code == "batch_expired"
    assert result.output_line()["response"] is None
    ok = await handler.handle(message(expires_at=1001.0))
    assert ok.response is not None


async def test_cancellation_propagates() -> None:
    engine = FakeEngine(seconds_per_token=60.0)
    task = asyncio.create_task(RequestHandler(engine).handle(message()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_fake_engine_shapes() -> None:
    engine = FakeEngine(max_context_length=5)
    answer = await engine.run(COMPLETIONS, {"prompt": "a b"}, "r")
    assert answer.status == 200 and answer.json()["object"] == "text_completion"
    answer = await engine.run(EMBEDDINGS, {"input": ["a", "b"]}, "r")
    assert answer.json()["object"] == "list" and len(answer.json()["data"]) == 2
    answer = await engine.run(COMPLETIONS, {"prompt": "a b c d e f"}, "r")
    assert answer.status == 400 and answer.json()["error"]["code"] == 400


async def test_a_line_whose_batch_is_cancelled_between_tries_is_not_tried_again() -> None:
    handler = RequestHandler(RecordingFakeEngine(), retry=NO_WAIT)
    engine = handler.engine
    assert isinstance(engine, RecordingFakeEngine)

    async def overloaded_then_cancelled(*args: Any, **kw: Any) -> Answer:
        engine.seen.append(args)  # type: ignore[arg-type]
        handler.control.apply(ControlMessage(batch_id="b", cancelled=True))
        return error_answer("engine overloaded", 503)

    engine.run = overloaded_then_cancelled  # type: ignore[method-assign]
    result = await handler.handle(message(batch_id="b"))
    assert len(engine.seen) == 1
    assert result.error is not None and result.error.code == "batch_cancelled"


async def test_a_media_url_that_may_not_be_fetched_is_answered_400_without_running() -> None:
    """A pipeline's request reaches the worker without the api's validation: the worker refuses
    it itself, before the engine could fetch anything."""
    engine = RecordingFakeEngine()
    content = [{"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    result = await RequestHandler(engine, retry=NO_WAIT, media_domains=frozenset()).handle(message(body=body))
    assert engine.seen == []  # never handed to the engine
    assert result.response is not None and result.response.status_code == 400
    error = orjson.loads(bytes(result.response.body))["error"]
    assert error["param"] == "body.messages[0].content[0].image_url.url"
    allowed = RequestHandler(engine, retry=NO_WAIT, media_domains=frozenset({"169.254.169.254"}))
    assert (await allowed.handle(message(body=body))).response.status_code == 200  # type: ignore[union-attr]


class GatedFakeEngine(FakeEngine):
    """The fake engine, each run held until ``release`` is set; ``all_in`` is set once
    ``expected`` runs are held."""

    def __init__(self, expected: int) -> None:
        super().__init__(model_id="served-model")
        self.expected = expected
        self.all_in = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, url, body, request_id, *, max_context_length=None, priority=0):  # type: ignore[no-untyped-def]
        self.expected -= 1
        if self.expected == 0:
            self.all_in.set()
        await self.release.wait()
        return await super().run(url, body, request_id, max_context_length=max_context_length)


async def test_a_batch_line_takes_its_place_for_its_project_and_a_direct_request_for_none() -> None:
    engine = GatedFakeEngine(expected=3)
    handler = RequestHandler(engine, retry=NO_WAIT)
    places = handler.scheduler.places
    lines = [
        message(batch_id="batch_a", line=1, project="proj-a"),
        message(batch_id="batch_b", line=1, project="proj-a"),
        message(reply_topic="replies", project="proj-a"),  # a direct request's project is ignored
    ]
    tasks = [asyncio.create_task(handler.handle(line)) for line in lines]
    await asyncio.wait_for(engine.all_in.wait(), 1)  # each line on the (held) engine
    assert places.project_running("proj-a") == 2 and places.project_running(None) == 1
    engine.release.set()
    results = await asyncio.gather(*tasks)
    assert all(result.response is not None and result.response.status_code == 200 for result in results)
    assert places.used == 0
