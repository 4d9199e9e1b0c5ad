"""The remote engine: each request goes to an OpenAI-compatible server the user already runs.

The worker holds no model: it sends a line's body to ``remote_url`` (``vllm serve``, SGLang, TGI,
llama.cpp's server, LiteLLM ...) over one pooled HTTP/1.1 client and passes the server's answer on
as the server gave it: its status and its body, with the usage read from the body. It keeps the
engine contract (``engine.py``) like the embedded engine:

- the refusals every engine makes come first (unknown endpoint, streaming, a Responses field
  that needs a store); a Responses body is sent with ``store: false`` (a batch keeps none);
- a batch's ``max_context_length`` is applied with the server's ``/tokenize`` (vLLM's and
  SGLang's): a longer prompt is refused with 400 and the output capped; a server without it
  leaves the prompt to its own limit;
- a stopped request (``abort``, or a cancelled caller) closes its HTTP request: vLLM aborts a
  request whose client disconnects, so the server stops computing it too;
- how many lines are on the server at once adapts to its load (``admission.py``): its waiting
  queue is kept near empty so its live traffic does not wait behind batch lines;
- a line the server refuses for load (429, or 503 with ``Retry-After``) or cannot take (the
  connection refused: restarting, down) is not a try of the line: it waits, with every other
  line, until the server has room again (``Retry-After``, or a second) and is sent again; the
  worker's ``/readyz`` says while the server is unreachable;
- a server that times out or breaks a connection mid-answer is a 503 answer: a failure that may
  pass, which the worker retries a bounded number of times (``engine_attempts``); a server's own
  4xx is the line's error, its 5xx may pass.

``max_context_length`` and the model's existence come from the server's ``/v1/models`` at start
(vLLM reports ``max_model_len``); this module imports no vLLM, so a remote worker needs none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from email.utils import parsedate_to_datetime
from http import HTTPStatus
from types import TracebackType
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from services.inference import metrics
from services.inference.admission import AdmissionGate, AdmissionLimit
from services.inference.engine import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GENERATE_ENDPOINTS,
    GPU_STEPS,
    MESSAGES,
    RERANK,
    RESPONSES,
    SCORE,
    Answer,
    EngineUnavailable,
    RunRegistry,
    error_answer,
    error_body,
    refuse_before_running,
    step_cost,
)
from services.inference.settings import InferenceSettings
from shared.protocol.messages import TokenUsage

log = logging.getLogger(__name__)

# What a remote model serves, by the worker's ``runner`` setting: a pooling model is an embeddings
# model or a cross-encoder (the server answers the endpoints its model has, refuses the others).
POOLING = (EMBEDDINGS, SCORE, RERANK)
# The servers' gauges of requests waiting in their queue (vLLM's, SGLang's).
WAITING_GAUGES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
# A server without a queue gauge is asked again this many load intervals later.
NO_GAUGE_RECHECK = 60
# How long lines wait after the server could not be reached, or refused one for load without
# saying how long (a 429 without Retry-After), before they are sent again.
UNREACHABLE_WAIT_S = REFUSED_WAIT_S = 1.0
# Refusals for load in a row after which the refusal is the line's answer (a server that refuses
# everything would otherwise hold the line until its batch expires).
MAX_REFUSALS = 1000


def server_root(url: str) -> str:
    """The server's root from a base URL given either way (``http://h:8000`` or ``.../v1``)."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


class RemoteEngine:
    """One model on one OpenAI-compatible server, owned by ``async with`` (the HTTP pool)."""

    def __init__(
        self, settings: InferenceSettings, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        if not settings.remote_url:
            raise ValueError("the remote engine needs BATCHSTREAM_INFERENCE_REMOTE_URL")
        self.settings = settings
        self.model_id = settings.model_id
        self.remote_model = settings.remote_model or settings.model_id
        # Adapters the server serves under these names (loaded there, e.g. ``--lora-modules``).
        self.adapters = tuple(settings.lora_adapters)
        self.max_context_length = settings.max_model_len
        self.endpoints: tuple[str, ...] = POOLING if settings.runner == "pooling" else GENERATE_ENDPOINTS
        self.max_running = settings.max_num_seqs
        self.queues = True
        self.step_cost = step_cost(settings, default=GPU_STEPS)  # a server is most often a GPU's
        self._runs = RunRegistry()
        headers = {"Authorization": f"Bearer {settings.remote_api_key}"} if settings.remote_api_key else {}
        self._http = httpx.AsyncClient(
            base_url=server_root(settings.remote_url),
            headers={"Content-Type": "application/json", **headers},
            timeout=httpx.Timeout(settings.remote_timeout_s, connect=settings.remote_connect_timeout_s),
            # A connection per line the worker may have on the server: no line waits for a socket.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=self.max_running),
            transport=transport,
        )
        self._tokenize = True  # until the server shows it has no /tokenize
        ceiling = max(1, self.max_running)
        floor = min(settings.remote_min_lines, ceiling)
        self.admission = AdmissionLimit(
            ceiling,
            floor=floor,
            start=max(floor, ceiling // 4) if settings.remote_admission else ceiling,
            waiting_target=settings.remote_waiting_target,
            latency_tolerance=settings.remote_latency_tolerance,
        )
        self._gate = AdmissionGate(self.admission)
        self.reachable = True
        self.by_latency = False  # the server shows no queue gauge: adapt on latency
        self._watch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RemoteEngine:
        try:
            await self._describe()
        except BaseException:
            await self._http.aclose()
            raise
        if self.settings.remote_admission:
            self._watch = asyncio.create_task(self._watch_load(), name="remote-load")
        metrics.ADMISSION_LIMIT.set_function(lambda: self.admission.allowed)
        log.info(
            "remote engine ready",
            extra={
                "model": self.model_id,
                "server": str(self._http.base_url),
                "remote_model": self.remote_model,
                "max_context_length": self.max_context_length,
                "endpoints": self.endpoints,
            },
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._runs.cancel_all()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        self._gate.close()
        await self._http.aclose()

    def checks(self) -> dict[str, bool]:
        """The worker's readiness checks this engine adds: its server answers."""
        return {"server_reachable": self.reachable}

    async def _describe(self) -> None:
        """Wait for the server (``remote_start_timeout_s``), check it serves the model and take
        its context length from ``/v1/models`` when it says one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.remote_start_timeout_s
        while True:
            try:
                listed = await self._http.get("/v1/models")
                break
            except httpx.TransportError as exc:
                if loop.time() >= deadline:
                    raise EngineUnavailable(
                        f"the server at {self._http.base_url} is unreachable: {exc!r}"
                    ) from exc
                await asyncio.sleep(1.0)
        if listed.status_code != HTTPStatus.OK:
            raise EngineUnavailable(
                f"{self._http.base_url}/v1/models answered {listed.status_code}: {listed.text[:300]}"
            )
        models = {m.get("id"): m for m in (listed.json().get("data") or []) if isinstance(m, dict)}
        if self.remote_model not in models:
            raise EngineUnavailable(
                f"the server at {self._http.base_url} does not serve {self.remote_model!r}; it serves "
                f"{', '.join(sorted(str(k) for k in models)) or 'nothing'}"
            )
        server_len = models[self.remote_model].get("max_model_len")
        if isinstance(server_len, int) and server_len > 0:
            self.max_context_length = server_len

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
        return await self._runs.run(
            request_id, self._send(url, body, request_id, max_context_length, priority)
        )

    async def abort(self, request_id: str) -> None:
        """Close the request's HTTP exchange: the server sees its client go and stops it."""
        self._runs.abort(request_id)

    async def _send(
        self, url: str, body: dict[str, Any], request_id: str, max_context_length: int | None, priority: int
    ) -> Answer:
        if body.get("model") not in self.adapters:
            body = {**body, "model": self.remote_model}
        if url == RESPONSES:
            body["store"] = False
        if self.settings.remote_priority is not None:
            body["priority"] = self.settings.remote_priority + priority
        loop = asyncio.get_running_loop()
        refusals = 0
        while True:
            async with self._gate.slot(priority):
                try:
                    if max_context_length is not None and max_context_length < self.max_context_length:
                        refusal = await self._cap_context(url, body, max_context_length)
                        if refusal is not None:
                            return refusal
                    started = loop.time()
                    response = await self._http.post(
                        url, content=orjson.dumps(body), headers={"X-Request-Id": request_id}
                    )
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    # The request never reached the server: not a try of the line. It waits with
                    # the others until the server can be reached.
                    self._unreachable(exc)
                    continue
                except httpx.TransportError as exc:  # timed out, or broken mid-answer: may pass
                    return error_answer(
                        f"the inference server did not answer: {exc!r}", HTTPStatus.SERVICE_UNAVAILABLE
                    )
                self.reachable = True
                retry_after = _refused_for_load(response)
                if retry_after is not None and refusals < MAX_REFUSALS:
                    refusals += 1
                    metrics.SERVER_REFUSALS.labels(reason=str(response.status_code)).inc()
                    self.admission.refused(retry_after)
                    continue
                answer = _to_answer(response)
                if answer.ok:
                    self.admission.answered(
                        loop.time() - started,
                        answer.usage.completion_tokens if answer.usage else 0,
                        self._gate.used,
                        self.by_latency,
                    )
                return answer

    def _unreachable(self, exc: BaseException) -> None:
        if self.reachable:
            log.warning("the inference server is unreachable: %r", exc, extra={"model": self.model_id})
        self.reachable = False
        metrics.SERVER_REFUSALS.labels(reason="unreachable").inc()
        self.admission.refused(UNREACHABLE_WAIT_S)

    async def _watch_load(self) -> None:
        """Read the server's queue every ``remote_load_interval_s`` and adapt the lines on it."""
        interval = self.settings.remote_load_interval_s
        while True:
            waiting = await self._read_waiting()
            if waiting is not None:
                metrics.SERVER_WAITING.set(waiting)
                self.admission.server_load(waiting, self._gate.used)
                self._gate.wake()
            await asyncio.sleep(interval * (NO_GAUGE_RECHECK if self.by_latency else 1))

    async def _read_waiting(self) -> float | None:
        """Requests waiting in the server's queue for this model, or None without a reading
        (unreachable; or no queue gauge, which sets ``by_latency``)."""
        try:
            response = await self._http.get("/metrics")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            self._unreachable(exc)
            return None
        except httpx.TransportError:  # a slow or broken answer: no reading this time
            return None
        self.reachable = True
        # Only the gauges' lines are parsed: a vLLM server's page is mostly histograms.
        wanted = [x for x in response.text.splitlines() if x.startswith(WAITING_GAUGES)]
        waiting: float | None = None
        if response.status_code == HTTPStatus.OK:
            for family in text_string_to_metric_families("\n".join(wanted) + "\n"):
                for sample in family.samples:
                    if sample.labels.get("model_name", self.remote_model) == self.remote_model:
                        waiting = (waiting or 0.0) + sample.value
        if self.by_latency != (waiting is None):
            log.info(
                "the server's load is read %s",
                "by latency (no queue gauge on its /metrics)" if waiting is None else "from its /metrics",
                extra={"model": self.model_id},
            )
        self.by_latency = waiting is None
        return waiting

    async def _cap_context(self, url: str, body: dict[str, Any], limit: int) -> Answer | None:
        """Refuse a prompt longer than ``limit`` tokens and cap the output to what is left, with
        the server's own tokenizer and chat template (``POST /tokenize``)."""
        if not self._tokenize:
            return None
        if url == CHAT:
            probe: dict[str, Any] = {"messages": body.get("messages")}
        elif url == COMPLETIONS and isinstance(body.get("prompt"), str):
            probe = {"prompt": body["prompt"]}
        elif url == RESPONSES:
            probe = {"messages": _response_messages(body)}
        elif url == MESSAGES:  # Anthropic's system prompt is a field of its own
            system = body.get("system")
            head = [{"role": "system", "content": system}] if system else []
            probe = {"messages": head + list(body.get("messages") or [])}
        else:
            return None
        counted = await self._http.post(
            "/tokenize", content=orjson.dumps({"model": self.remote_model, **probe})
        )
        if counted.status_code == HTTPStatus.NOT_FOUND:
            log.warning("the server has no /tokenize: a batch's max_context_length is left to it")
            self._tokenize = False
            return None
        if counted.status_code != HTTPStatus.OK:
            return _to_answer(counted)
        room = limit - int(counted.json().get("count") or 0)
        if room <= 0:
            return error_answer(
                f"Input length ({limit - room}) exceeds the batch's maximum context length ({limit}).",
                param="max_context_length",
            )
        field = {CHAT: "max_completion_tokens", RESPONSES: "max_output_tokens"}.get(url, "max_tokens")
        if url == CHAT and body.get(field) is None:
            field = "max_tokens"
        body[field] = min(body.get(field) or room, room)
        return None


def _response_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses body's prompt as chat messages (instructions, then the input), to count it."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            if isinstance(item, dict) and "role" in item:
                content = item.get("content")
                if isinstance(content, list):  # input_text parts
                    content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                messages.append({"role": item["role"], "content": content})
    return messages


def _refused_for_load(response: httpx.Response) -> float | None:
    """Seconds to wait when the server refused for load (429; 503 naming ``Retry-After``);
    None for any other answer."""
    if response.status_code not in (HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE):
        return None
    given = response.headers.get("Retry-After")
    if given is None:
        return REFUSED_WAIT_S if response.status_code == HTTPStatus.TOO_MANY_REQUESTS else None
    try:
        return max(0.0, float(given))
    except ValueError:
        pass
    try:  # an HTTP date
        when = parsedate_to_datetime(given)
    except (TypeError, ValueError):
        return REFUSED_WAIT_S
    return max(0.0, when.timestamp() - time.time())


def _to_answer(response: httpx.Response) -> Answer:
    """The server's answer as given; only a body that is not one line of JSON is rewritten (an
    output-file record is one line), and a non-JSON error (a proxy's page) becomes an envelope."""
    raw = response.content
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        status = response.status_code if response.status_code >= 400 else HTTPStatus.BAD_GATEWAY
        text = response.text.strip()[:500] or HTTPStatus(status).phrase
        return Answer.of(status, error_body(f"the inference server answered: {text}", status))
    if not isinstance(parsed, dict):
        return Answer.of(
            HTTPStatus.BAD_GATEWAY, error_body("the inference server's body is not an object", 502)
        )
    if response.status_code >= 400 and not isinstance(parsed.get("error"), dict):
        # e.g. FastAPI's {"detail": ...}: the contract's error envelope, with the server's words.
        message = orjson.dumps(parsed).decode()[:500]
        return Answer.of(response.status_code, error_body(message, response.status_code))
    if b"\n" in raw:
        raw = orjson.dumps(parsed)
    usage = TokenUsage.from_body_usage(parsed.get("usage")) if response.status_code == HTTPStatus.OK else None
    return Answer(response.status_code, raw, usage)
