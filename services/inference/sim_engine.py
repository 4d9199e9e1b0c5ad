"""SimEngine: a simulated GPU running vLLM, for the benchmarks' comparisons of orders and policies.

No GPU with vLLM is within reach of our machines, and on a CPU a decode step costs about as much
per sequence alone as in a batch, so dispatch orders and occupancy hardly matter there. On a GPU
a decode step costs nearly the same for one sequence as for dozens: a long line that starts last
runs nearly alone. This engine simulates that physics (not the model): it keeps the engine
contract (``engine.py``) and answers like the fake engine (``fake_engine.py``), but each request
waits for its simulated time on a simulated GPU:

- **Continuous batching** up to ``max_num_seqs`` sequences; requests wait in a queue ordered by
  ``priority`` then arrival (vLLM's priority scheduling); a step prefills new sequences (chunked,
  at most ``MAX_BATCHED_TOKENS`` tokens per step with the decodes) and decodes one token of every
  running sequence.
- **A KV cache** of ``kv_cache_blocks`` blocks of ``BLOCK_TOKENS`` tokens (0: ``PROFILE``'s).
  A sequence is admitted when its prompt fits; when the running sequences' growth fills the cache,
  the newest is preempted and recomputed later (vLLM's recompute preemption).
- **Prefix reuse**: a prompt's full blocks are keyed by a hash chain of their tokens; blocks of
  a prompt seen lately (held by a running sequence, or free but not yet evicted, least recently
  used first) are not prefilled again.
- **Step times** from ``PROFILE``'s cost model (``sim_gpu.py``), whose constants are fitted to a
  published vLLM curve (``PUBLISHED``; docs/benchmarks.md names the source). Time is simulated: a
  step of ``t`` simulated seconds takes ``t / speedup`` wall seconds, and the simulation advances from
  event to event (a sequence finishing, the cache filling, a request arriving), not step by step,
  so it costs little CPU however many steps it simulates.

Tokens are the fake engine's (whitespace words). Output lengths: a line generates up to its cap
(``max_tokens``, ``max_completion_tokens`` or ``max_output_tokens``, else the room left in the
context), at least its ``min_tokens``; without ``min_tokens`` it stops (an end-of-sequence) at a
length drawn from a hash of its prompt, so ``max_tokens`` is a bound, as with a model, and the
same line has the same length in every run. With ``min_tokens`` equal to ``max_tokens`` the
length is exact (the benchmarks hold lengths so). Embeddings, score and rerank cost a prefill.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from services.inference.engine import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GENERATE_ENDPOINTS,
    MESSAGES,
    RERANK,
    RESPONSES,
    SCORE,
    Answer,
    RunRegistry,
    StepCost,
    refuse_before_running,
)
from services.inference.fake_engine import REQUIRED_FIELD, FakeEngine
from services.inference.settings import default
from services.inference.sim_gpu import (
    PROFILE,
    GpuProfile,
    SimGpu,
    SimSequence,
    output_length,
    prompt_blocks,
    prompt_words,
)

# ----------------------------------------------------------------------------------------- engine


class SimEngine:
    """The engine contract over a ``SimGpu`` that runs in scaled wall time."""

    def __init__(
        self,
        model_id: str = "sim-model",
        max_context_length: int = default("max_model_len"),
        max_num_seqs: int = default("max_num_seqs"),
        kv_cache_blocks: int = default("kv_cache_blocks"),
        speedup: float = default("sim_speedup"),
        adapters: tuple[str, ...] = (),
        profile: GpuProfile = PROFILE,
    ) -> None:
        self.model_id = model_id
        self.max_context_length = max_context_length
        self.endpoints: tuple[str, ...] = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, SCORE, RERANK)
        self.adapters = adapters
        self.max_running = max_num_seqs
        self.queues = True
        self.step_cost = StepCost(profile.step_base_s, profile.per_sequence_s)
        self.speedup = speedup
        self.gpu = SimGpu(profile, max_num_seqs, kv_cache_blocks)
        self._answers = FakeEngine(model_id, max_context_length, self.endpoints, adapters=adapters)
        self._runs = RunRegistry()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._started = time.monotonic()

    async def __aenter__(self) -> SimEngine:
        self._started = time.monotonic()
        self._loop_task = asyncio.create_task(self._loop(), name="sim-gpu")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._runs.cancel_all()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    def simulated_now(self) -> float:
        return (time.monotonic() - self._started) * self.speedup

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
        limit = min(max_context_length or self.max_context_length, self.max_context_length)
        if url in (SCORE, RERANK):
            prompt = (
                prompt_words(body.get("query"))
                + prompt_words(body.get("documents"))
                + prompt_words(body.get("text_1"))
            )
            target = 0
        else:
            prompt = prompt_words(body.get(REQUIRED_FIELD[url])) + prompt_words(body.get("instructions"))
            prompt += prompt_words(body.get("system"))
            target = output_length(body, limit - len(prompt), prompt) if url in GENERATE_ENDPOINTS else 0
        answer = self._answers._answer(url, body, request_id, max_context_length, max(1, target))
        if not answer.ok:
            return answer  # refused before running, as a server would
        seq = SimSequence(max(1, len(prompt)), target, prompt_blocks(prompt), priority)
        return await self._runs.run(request_id, self._on_gpu(seq, answer))

    async def abort(self, request_id: str) -> None:
        self._runs.abort(request_id)

    async def _on_gpu(self, seq: SimSequence, answer: Answer) -> Answer:
        seq.future = asyncio.get_running_loop().create_future()
        self._advance()  # it joins at the current step boundary
        self.gpu.submit(seq)
        self._wake.set()
        try:
            await seq.future
        finally:
            if not seq.done:
                self.gpu.drop(seq)
                self._wake.set()
        return answer

    def _advance(self) -> float:
        """Bring the GPU to the simulated now; answer the sequences that finished."""
        now = self.simulated_now()
        for seq in self.gpu.advance(now):
            if seq.future is not None and not seq.future.done():
                seq.future.set_result(None)
        return now

    async def _loop(self) -> None:
        while True:
            now = self._advance()
            due = self.gpu.next_event_at()
            self._wake.clear()
            timeout = None if due is None else max(0.0, (due - now) / self.speedup)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
