"""The engine contract (``services/inference/engine.py``) as checks any engine must pass.

Plain async functions, no pytest: the fake engine runs them in the test process, and the vLLM
engine runs them in the inference environment (which has no pytest), started once, through
``python -m tests.unit.inference.engine_contract --model DIR`` (prints one JSON line of outcomes).

A check gets the engine and a ``long_body``: a chat body that runs until it is stopped (many
tokens on vLLM; a fake engine's ``seconds_per_token`` makes it slow too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from services.inference.engine import CHAT, COMPLETIONS, MESSAGES, RESPONSES, Answer, Engine, RequestAborted

ERROR_FIELDS = {"message", "type", "param", "code"}
LONG_TOKENS = 1500

Check = Callable[[Engine], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(fn: Check) -> Check:
    CHECKS[fn.__name__] = fn
    return fn


def chat(engine: Engine, content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": engine.model_id, "messages": [{"role": "user", "content": content}], **extra}


def long_chat(engine: Engine) -> dict[str, Any]:
    return chat(engine, max_tokens=LONG_TOKENS, ignore_eos=True, temperature=0.0)


def assert_error(answer: Answer, status: int) -> None:
    assert answer.status == status, (answer.status, answer.body[:300])
    assert set(orjson.loads(answer.body)["error"]) == ERROR_FIELDS


async def started(task: asyncio.Task[Answer]) -> None:
    """Let ``task`` run up to its first wait inside the engine (one loop turn; no timing)."""
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done(), "the long request finished at once"


@check
async def describes_itself(engine: Engine) -> None:
    assert isinstance(engine, Engine)
    assert engine.model_id and engine.max_context_length > 0 and CHAT in engine.endpoints


@check
async def answers_chat_with_the_raw_body_and_its_usage(engine: Engine) -> None:
    answer = await engine.run(CHAT, chat(engine, max_tokens=4), "contract-chat")
    assert answer.status == 200 and answer.ok and isinstance(answer.body, bytes)
    body = orjson.loads(answer.body)
    assert body["object"] == "chat.completion" and body["model"] == engine.model_id
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert answer.usage is not None and answer.usage.prompt_tokens == body["usage"]["prompt_tokens"]
    assert answer.usage.total_tokens == body["usage"]["total_tokens"] > 0
    assert b"\n" not in answer.body  # one output-file record is one line


@check
async def answers_completions(engine: Engine) -> None:
    if COMPLETIONS not in engine.endpoints:
        return
    answer = await engine.run(COMPLETIONS, {"model": engine.model_id, "prompt": "Once", "max_tokens": 3}, "c")
    assert answer.status == 200 and orjson.loads(answer.body)["object"] == "text_completion"


@check
async def answers_responses_with_a_response_object_and_its_usage(engine: Engine) -> None:
    if RESPONSES not in engine.endpoints:
        return
    body = {"model": engine.model_id, "input": "Say hi", "instructions": "Be brief.", "max_output_tokens": 4}
    answer = await engine.run(RESPONSES, {**body, "store": True}, "contract-responses")
    assert answer.status == 200, answer.body[:300]
    response = orjson.loads(answer.body)
    assert response["object"] == "response" and response["model"] == engine.model_id
    assert response["id"].startswith("resp_") and response["status"] in ("completed", "incomplete")
    assert response["output"] and response["output"][0]["type"] == "message"
    usage = response["usage"]
    assert answer.usage is not None and answer.usage.prompt_tokens == usage["input_tokens"] > 0
    assert answer.usage.completion_tokens == usage["output_tokens"] > 0
    assert answer.usage.cached_tokens == usage["input_tokens_details"]["cached_tokens"]
    assert b"\n" not in answer.body
    items = {**body, "input": [{"role": "user", "content": "Say hi"}], "max_output_tokens": 2}
    assert (await engine.run(RESPONSES, items, "contract-responses-items")).ok


@check
async def refuses_responses_that_need_a_store_with_400(engine: Engine) -> None:
    if RESPONSES not in engine.endpoints:
        return
    base = {"model": engine.model_id, "input": "hi", "max_output_tokens": 2}
    assert_error(await engine.run(RESPONSES, {**base, "background": True}, "contract-bg"), 400)
    assert_error(
        await engine.run(RESPONSES, {**base, "previous_response_id": "resp_x"}, "contract-prev"), 400
    )


@check
async def refuses_a_response_over_the_request_context_cap_with_400(engine: Engine) -> None:
    if RESPONSES not in engine.endpoints:
        return
    body = {"model": engine.model_id, "input": " ".join(["word"] * 64), "max_output_tokens": 2}
    assert_error(await engine.run(RESPONSES, body, "contract-responses-cap", max_context_length=8), 400)


def message(engine: Engine, content: str = "Say hi", **extra: Any) -> dict[str, Any]:
    """An Anthropic Messages request (a message batch's line)."""
    return {
        "model": engine.model_id,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


@check
async def answers_messages_with_a_message_and_its_usage(engine: Engine) -> None:
    if MESSAGES not in engine.endpoints:
        return
    answer = await engine.run(MESSAGES, message(engine, system="Be brief."), "contract-messages")
    assert answer.status == 200, answer.body[:300]
    body = orjson.loads(answer.body)
    assert (body["type"], body["role"], body["model"]) == ("message", "assistant", engine.model_id)
    assert body["content"] and body["content"][0]["type"] == "text"
    assert body["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence")
    assert "stop_sequence" not in body or body["stop_sequence"] is not None  # no null fields
    usage = body["usage"]
    assert answer.usage is not None and answer.usage.prompt_tokens >= usage["input_tokens"] > 0
    assert answer.usage.completion_tokens == usage["output_tokens"] > 0
    assert b"\n" not in answer.body
    blocks = message(engine, content=[{"type": "text", "text": "Say hi"}], max_tokens=2)  # type: ignore[arg-type]
    assert (await engine.run(MESSAGES, blocks, "contract-messages-blocks")).ok


@check
async def refuses_a_bad_message_and_one_over_the_request_context_cap_with_400(engine: Engine) -> None:
    if MESSAGES not in engine.endpoints:
        return
    no_cap = {k: v for k, v in message(engine).items() if k != "max_tokens"}
    for body, cap in ((no_cap, None), (message(engine, " ".join(["word"] * 64)), 8)):
        answer = await engine.run(MESSAGES, body, "contract-messages-bad", max_context_length=cap)
        assert answer.status == 400, (answer.status, answer.body[:300])
        assert orjson.loads(answer.body)["error"]["message"]


@check
async def refuses_an_unsupported_endpoint_with_404(engine: Engine) -> None:
    assert_error(await engine.run("/v1/images/generations", {"model": engine.model_id}, "contract-404"), 404)


@check
async def refuses_streaming_with_400(engine: Engine) -> None:
    assert_error(await engine.run(CHAT, chat(engine, stream=True), "contract-stream"), 400)


@check
async def refuses_an_invalid_body_with_400_and_goes_on(engine: Engine) -> None:
    assert_error(await engine.run(CHAT, {"model": engine.model_id, "messages": 5}, "contract-bad"), 400)
    assert (await engine.run(CHAT, chat(engine, max_tokens=2), "contract-after-bad")).ok


@check
async def refuses_a_prompt_over_the_request_context_cap_with_400(engine: Engine) -> None:
    prompt = " ".join(["word"] * 64)
    answer = await engine.run(CHAT, chat(engine, prompt, max_tokens=2), "contract-cap", max_context_length=8)
    assert_error(answer, 400)


@check
async def an_aborted_request_raises_request_aborted_and_has_no_answer(engine: Engine) -> None:
    task = asyncio.create_task(engine.run(CHAT, long_chat(engine), "contract-abort"))
    await started(task)
    await engine.abort("contract-abort")
    try:
        answer = await asyncio.wait_for(task, 60)
    except RequestAborted:
        pass
    else:
        raise AssertionError(f"an aborted request was answered: {answer.status} {answer.body[:200]!r}")
    assert (await engine.run(CHAT, chat(engine, max_tokens=2), "contract-after-abort")).ok


@check
async def a_cancelled_caller_gets_cancelled_error_and_no_answer(engine: Engine) -> None:
    task = asyncio.create_task(engine.run(CHAT, long_chat(engine), "contract-cancel"))
    await started(task)
    task.cancel()
    outcome = (await asyncio.gather(task, return_exceptions=True))[0]
    assert isinstance(outcome, asyncio.CancelledError), f"not CancelledError: {outcome!r}"
    assert (await engine.run(CHAT, chat(engine, max_tokens=2), "contract-after-cancel")).ok


@check
async def aborting_an_unknown_or_finished_request_is_a_no_op(engine: Engine) -> None:
    await engine.abort("never-heard-of")
    assert (await engine.run(CHAT, chat(engine, max_tokens=2), "contract-done")).ok
    await engine.abort("contract-done")


@check
async def runs_many_requests_at_once(engine: Engine) -> None:
    answers = await asyncio.gather(
        *(engine.run(CHAT, chat(engine, f"line {i}", max_tokens=3), f"contract-many-{i}") for i in range(8))
    )
    assert [a.status for a in answers] == [200] * 8


async def run_checks(engine: Engine) -> dict[str, str]:
    """Every check's outcome: "ok" or the failure's traceback."""
    outcomes = {}
    for name, fn in CHECKS.items():
        try:
            await asyncio.wait_for(fn(engine), 120)
            outcomes[name] = "ok"
        except Exception:
            outcomes[name] = traceback.format_exc()
    return outcomes


async def _vllm(model: str, served_name: str) -> dict[str, str]:
    from services.inference.engine_factory import open_engine
    from services.inference.settings import InferenceSettings

    settings = InferenceSettings(
        engine="vllm", model=model, served_model_name=served_name, enforce_eager=True, max_num_seqs=8
    )
    async with open_engine(settings) as engine:
        return await run_checks(engine)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="model folder vLLM loads")
    parser.add_argument("--served-name", default="contract-model")
    args = parser.parse_args()
    outcomes = asyncio.run(_vllm(args.model, args.served_name))
    sys.stdout.write("CONTRACT " + json.dumps(outcomes) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
