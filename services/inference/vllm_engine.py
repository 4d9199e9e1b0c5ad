"""VllmEngine: vLLM's async engine behind vLLM's own OpenAI serving classes.

Built the way ``vllm/entrypoints/launchers/run_batch.py`` builds them (arguments from vLLM's own
parser, ``build_async_engine_client``, ``init_app_state``) and called without HTTP in between, so a
body is exactly what ``vllm serve`` would return. Importing this module imports vLLM.
"""

from __future__ import annotations

import asyncio
import logging
import os
from argparse import Namespace
from contextlib import AsyncExitStack
from http import HTTPStatus
from types import TracebackType
from typing import Any

import orjson
import pydantic
from starlette.datastructures import State
from starlette.responses import Response
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest, AnthropicMessagesResponse
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest
from vllm.entrypoints.serve import create_error_response
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.tokenize.protocol import (
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from vllm.platforms import current_platform
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser

from services.inference.engine import (
    CHAT,
    COMPLETIONS,
    CPU_STEPS,
    EMBEDDINGS,
    GPU_STEPS,
    MESSAGES,
    RERANK,
    RESPONSES,
    SCORE,
    Answer,
    EngineUnavailable,
    RunRegistry,
    error_answer,
    refuse_before_running,
    step_cost,
)
from services.inference.settings import InferenceSettings
from shared.protocol.anthropic import AnthropicErrorResponse
from shared.protocol.messages import TokenUsage
from shared.settings import MediaSettings

log = logging.getLogger(__name__)

_EMBEDDING_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(EmbeddingRequest)
_SCORE_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ScoreRequest)


NO_MEDIA_DOMAIN = "no-media-domain.invalid"
"""The allow-list vLLM gets when no media domain is allowed (an empty list would allow all)."""


def build_args(settings: InferenceSettings, media_domains: frozenset[str] = frozenset()) -> Namespace:
    """vLLM's server arguments, from our settings, through vLLM's own parser (so defaults match)."""
    argv = [
        "--model",
        settings.model,
        "--runner",
        settings.runner,
        "--dtype",
        settings.dtype,
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--tensor-parallel-size",
        str(settings.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(settings.gpu_memory_utilization),
        "--scheduling-policy",
        settings.scheduling_policy,
    ]
    if not settings.engine_stats:
        argv.append("--disable-log-stats")
    if settings.kv_cache_blocks:
        argv += ["--num-gpu-blocks-override", str(settings.kv_cache_blocks)]
    if settings.max_model_len > 0:  # 0: the model's own limit
        argv += ["--max-model-len", str(settings.max_model_len)]
    if settings.served_model_name:
        argv += ["--served-model-name", settings.served_model_name]
    if settings.enforce_eager:
        argv.append("--enforce-eager")
    if settings.prompt_tokens_details:
        argv.append("--enable-prompt-tokens-details")
    # Media URLs: vLLM fetches only from these hosts (shared/media.py; the handler refuses the
    # rest first). With none allowed, a name no URL can have, so vLLM fetches nothing by http(s).
    argv += ["--allowed-media-domains", *(sorted(media_domains) or [NO_MEDIA_DOMAIN])]
    if settings.lora_adapters:
        argv += ["--enable-lora", "--max-loras", str(settings.max_loras)]
        argv += ["--max-lora-rank", str(settings.max_lora_rank), "--lora-modules"]
        argv += [f"{name}={path}" for name, path in settings.lora_adapters.items()]
    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


class VllmEngine:
    """One vLLM engine and its serving objects, owned by ``async with``."""

    def __init__(self, settings: InferenceSettings) -> None:
        self.settings = settings
        self.model_id = settings.model_id
        self.max_context_length = settings.max_model_len
        self.endpoints: tuple[str, ...] = ()
        self.adapters = tuple(settings.lora_adapters)
        self.max_running = settings.max_num_seqs
        self.queues = True
        self.step_cost = step_cost(settings, default=CPU_STEPS if current_platform.is_cpu() else GPU_STEPS)
        self._stack = AsyncExitStack()
        self._state = State()
        self._runs = RunRegistry()
        self._client: EngineClient | None = None

    async def __aenter__(self) -> VllmEngine:
        args = build_args(self.settings, MediaSettings().domains)
        # A fetch from an allowed host must not be redirected to another (vLLM follows by default).
        os.environ["VLLM_MEDIA_URL_ALLOW_REDIRECTS"] = "0"
        client: EngineClient = await self._stack.enter_async_context(
            build_async_engine_client(args, usage_context=UsageContext.OPENAI_BATCH_RUNNER)
        )
        self._client = client
        try:
            tasks = await client.get_supported_tasks()
            await init_app_state(client, self._state, args, tasks)
        except BaseException:
            await self._stack.aclose()
            raise
        self.max_context_length = client.model_config.max_model_len
        self.model_id = self._state.openai_serving_models.base_model_paths[0].name
        self.endpoints = self._supported_endpoints()
        responses = getattr(self._state, "openai_serving_responses", None)
        if responses is not None:
            # A batch line keeps no response (see ``RESPONSES_NEEDING_A_STORE``): never the store,
            # even with VLLM_ENABLE_RESPONSES_API_STORE set (it would grow without bound). A
            # body's ``store: true`` is then ignored, as vLLM does by default.
            responses.enable_store = False
        log.info(
            "vLLM engine ready",
            extra={"model": self.model_id, "tasks": list(tasks), "endpoints": self.endpoints},
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._runs.cancel_all()
        await self._stack.aclose()
        # Drop the serving objects (they hold the engine client) while the interpreter is whole;
        # otherwise AsyncLLM.__del__ runs at exit and prints a harmless TypeError.
        self._state = State()

    def _supported_endpoints(self) -> tuple[str, ...]:
        found = []
        if getattr(self._state, "openai_serving_chat", None) is not None:
            found.append(CHAT)
        if getattr(self._state, "openai_serving_completion", None) is not None:
            found.append(COMPLETIONS)
        if getattr(self._state, "openai_serving_responses", None) is not None:
            found.append(RESPONSES)
        if getattr(self._state, "anthropic_serving_messages", None) is not None:
            found.append(MESSAGES)
        if getattr(self._state, "serving_embedding", None) is not None:
            found.append(EMBEDDINGS)
        if getattr(self._state, "serving_scores", None) is not None:
            # A cross-encoder; vLLM also scores with an embeddings model (cosine similarity).
            found += [SCORE, RERANK]
        return tuple(found)

    async def run(
        self,
        url: str,
        body: dict[str, Any],
        request_id: str,
        *,
        max_context_length: int | None = None,
        priority: int = 0,
    ) -> Answer:
        refusal = refuse_before_running(url, body, self.endpoints)
        if refusal is not None:
            return refusal
        if self.settings.scheduling_policy != "priority":
            priority = 0  # vLLM refuses a priority under first-come-first-served scheduling
        serving = self._serve(url, body, request_id, max_context_length, priority)
        answer = await self._runs.run(request_id, serving)
        if url == MESSAGES and not answer.ok:
            answer = _anthropic_error(answer)
        if answer.transient and self._client is not None and self._client.errored:
            # e.g. the engine core got the SIGTERM meant for the worker (a signal to the process
            # group): the serving code answers 500, but that is not this request's outcome.
            raise EngineUnavailable(f"the vLLM engine is dead; request {request_id} has no answer")
        return answer

    async def abort(self, request_id: str) -> None:
        """Cancel the serving call; vLLM aborts the engine request when its generator closes."""
        self._runs.abort(request_id)

    async def _serve(
        self, url: str, body: dict[str, Any], request_id: str, max_context_length: int | None, priority: int
    ) -> Answer:
        try:
            request = _parse(url, body)
        except pydantic.ValidationError as exc:
            return _validation_answer(exc)
        except (TypeError, ValueError, AttributeError) as exc:
            # One of vLLM's model validators tripping on a wrongly typed field (e.g. ``messages``
            # not a list raises TypeError): still the request's fault, so a 400, never a retry.
            return error_answer(
                f"Invalid request body: {exc}", HTTPStatus.BAD_REQUEST, err_type="Bad Request"
            )
        if isinstance(request, ResponsesRequest):
            request.request_id = f"resp_{request_id}"  # the response's id, as OpenAI's look
        elif hasattr(request, "request_id"):
            request.request_id = request_id
        if hasattr(request, "priority"):
            request.priority = priority  # the worker's order, not a body's own field
        try:
            if max_context_length is not None and max_context_length < self.max_context_length:
                refusal = await self._cap_context(url, request, max_context_length)
                if refusal is not None:
                    return refusal
            return _to_answer(await self._call(url, request))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure becomes this line's error record
            return _to_answer(create_error_response(exc))

    async def _call(self, url: str, request: Any) -> Any:
        if url == CHAT:
            return await self._state.openai_serving_chat.create_chat_completion(request, None)
        if url == COMPLETIONS:
            return await self._state.openai_serving_completion.create_completion(request, None)
        if url == RESPONSES:
            return await self._state.openai_serving_responses.create_responses(request, None)
        if url == MESSAGES:
            return await self._state.anthropic_serving_messages.create_messages(request, None)
        if url in (SCORE, RERANK):
            return await self._state.serving_scores(request, None)
        return await self._state.serving_embedding(request, None)

    async def _cap_context(self, url: str, request: Any, limit: int) -> Answer | None:
        """Apply a batch's ``max_context_length``: refuse a longer prompt, cap the output.

        vLLM only knows the engine-wide ``max_model_len``, so the prompt is tokenized first (with
        the same renderer the request will use). A completion prompt that is not one string is
        left to the engine's own limit.
        """
        if url == RESPONSES:
            return await self._cap_response_context(request, limit)
        if url == MESSAGES:  # counted as the chat request the serving class makes of it
            serving = self._state.anthropic_serving_messages
            chat = serving.to_chat_completion_request(
                request, merge_inline_system=serving._merge_inline_system
            )
            probe: Any = TokenizeChatRequest(messages=chat.messages)
        elif url == CHAT:
            probe = TokenizeChatRequest(messages=request.messages)
        elif url == COMPLETIONS and isinstance(request.prompt, str):
            probe = TokenizeCompletionRequest(prompt=request.prompt)
        else:
            return None
        counted = await self._state.serving_tokenization.create_tokenize(probe, None)
        if isinstance(counted, ErrorResponse):
            return _to_answer(counted)
        room = limit - counted.count
        if room <= 0:
            return error_answer(
                f"Input length ({counted.count}) exceeds the batch's maximum context length ({limit}).",
                param="max_context_length",
            )
        if url == MESSAGES:
            request.max_tokens = min(request.max_tokens, room)
        elif url == CHAT and request.max_completion_tokens is not None:
            request.max_completion_tokens = min(request.max_completion_tokens, room)
        else:
            request.max_tokens = min(request.max_tokens or room, room)
        return None

    async def _cap_response_context(self, request: ResponsesRequest, limit: int) -> Answer | None:
        """``_cap_context`` for a Responses request: its prompt (input items and instructions) is
        counted by rendering it as the serving class will, then ``max_output_tokens`` is capped."""
        serving = self._state.openai_serving_responses
        rendered = await serving._render_resolved_response_inputs(request, None)
        if isinstance(rendered, ErrorResponse):
            return _to_answer(rendered)
        prompt_tokens = serving._extract_prompt_len(rendered.engine_input)
        room = limit - prompt_tokens
        if room <= 0:
            return error_answer(
                f"Input length ({prompt_tokens}) exceeds the batch's maximum context length ({limit}).",
                param="max_context_length",
            )
        request.max_output_tokens = min(request.max_output_tokens or room, room)
        return None


def _parse(url: str, body: dict[str, Any]) -> Any:
    if url == CHAT:
        return ChatCompletionRequest.model_validate(body)
    if url == COMPLETIONS:
        return CompletionRequest.model_validate(body)
    if url == RESPONSES:
        return ResponsesRequest.model_validate(body)
    if url == MESSAGES:
        return AnthropicMessagesRequest.model_validate(body)
    if url == SCORE:  # one of its input pairs, as run_batch.py parses it
        return _SCORE_ADAPTER.validate_python(body)
    if url == RERANK:
        return RerankRequest.model_validate(body)
    return _EMBEDDING_ADAPTER.validate_python(body)


def _validation_answer(exc: pydantic.ValidationError) -> Answer:
    """A body that fails vLLM's request model: 400, as vLLM's validation handler words it."""
    errors = exc.errors(include_url=False)
    param = ".".join(str(part) for part in errors[0]["loc"]) if errors else None
    lines = [f"  {'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors[:10]]
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "\n".join(lines)
    return error_answer(message, HTTPStatus.BAD_REQUEST, err_type="Bad Request", param=param)


def _to_answer(result: Any) -> Answer:
    """A serving call's result as vLLM's routers would send it, serialised once, here."""
    if isinstance(result, ErrorResponse):
        return Answer(int(result.error.code), result.model_dump_json().encode())
    if isinstance(result, Response):  # already serialised by the serving class
        return Answer(int(result.status_code), bytes(result.body), _usage_of_raw(result))
    if isinstance(result, AnthropicMessagesResponse):  # as vLLM's Messages route sends it
        body = result.model_dump(exclude_none=True)
        return Answer(200, orjson.dumps(body), _usage(body.get("usage")))
    if isinstance(result, ResponsesResponse):  # vLLM's router sends it by alias
        return Answer(200, result.model_dump_json(by_alias=True).encode(), _usage(result.usage))
    if isinstance(result, pydantic.BaseModel):
        usage = getattr(result, "usage", None)
        return Answer(200, result.model_dump_json().encode(), _usage(usage))
    return error_answer("Request must not be sent in stream mode", param="stream")


def _anthropic_error(answer: Answer) -> Answer:
    """An error answer to a Messages request in Anthropic's shape, as vLLM's Messages route
    translates it (``translate_error_response``), its ``type`` Anthropic's for the status."""
    detail = orjson.loads(answer.body).get("error") or {}
    body = AnthropicErrorResponse.of(answer.status, str(detail.get("message", "")))
    return Answer(answer.status, body.model_dump_json().encode(), answer.usage)


def _usage(usage: Any) -> TokenUsage | None:
    """vLLM's ``UsageInfo`` (a pydantic model) as the result message's usage."""
    if usage is None:
        return None
    return TokenUsage.from_body_usage(usage.model_dump() if isinstance(usage, pydantic.BaseModel) else usage)


def _usage_of_raw(response: Response) -> TokenUsage | None:
    """The usage of a body a serving class returned already serialised (parsed only for it)."""
    if response.status_code != HTTPStatus.OK:
        return None
    return TokenUsage.from_body_usage(orjson.loads(bytes(response.body)).get("usage"))
