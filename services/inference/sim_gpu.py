"""The simulated GPU behind ``SimEngine`` (``sim_engine.py``): vLLM's continuous batching, KV
cache and prefix reuse, with step times from a cost model fitted to a published decode-only curve.

Pure simulation in simulated seconds, no wall clock and no I/O: ``SimGpu`` advances from event to
event (a sequence finishing, the cache filling, a request arriving), so it costs little CPU
however many steps it simulates. ``sim_engine.py``'s docstring says what is modelled.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

BLOCK_TOKENS = 16
"""vLLM's KV cache block size on GPUs (tokens)."""
MAX_BATCHED_TOKENS = 8192
"""vLLM's ``max_num_batched_tokens`` (prefill and decode tokens of one step)."""
_EPSILON = 1e-9


@dataclass(frozen=True)
class GpuProfile:
    """A GPU and model as the cost model sees them.

    A decode step reads every weight once whatever the batch (``step_base_s``) and each running
    sequence's KV cache (``per_sequence_s`` per sequence): ``base + per_sequence * B``, nearly
    flat up to tens of sequences on a GPU, since the weights dominate. A prefill adds
    ``per_prefill_token_s`` per prompt token computed (compute-bound), in the same step."""

    name: str
    step_base_s: float
    per_sequence_s: float
    per_prefill_token_s: float
    kv_cache_tokens: int

    def step_s(self, decoding: int, prefill_tokens: int = 0) -> float:
        if not decoding and not prefill_tokens:
            return 0.0
        return self.step_base_s + self.per_sequence_s * decoding + self.per_prefill_token_s * prefill_tokens


PUBLISHED = {
    1: 3.8245 / 337,
    2: 3.9516 / 337,
    4: 4.0403 / 337,
    8: 4.2195 / 337,
    16: 4.6958 / 337,
    32: 5.5353 / 337,
    64: 7.3084 / 337,
    128: 10.5981 / 337,
}
"""The published decode-only curve: sequences in the batch -> seconds per decode step. vLLM
(its 0.6-era development build, CUDA graphs, fp16) running Llama-2-7B on one H100 64 GB, each
batch of 161-token prompts prefilled first and then decoded alone for 337 steps (output 338
tokens): the decode phase's elapsed time over its 337 steps (Recasens et al., "Mind the Memory
Gap", arXiv 2503.08311, the repository's ``decode_kernels/distinct_kernels/llama-2-7b`` logs;
docs/benchmarks.md cites it)."""

PROFILE = GpuProfile(
    name="H100-64GB, Llama-2-7B (vLLM 0.6-era, fp16)",
    # Fitted to PUBLISHED by least squares of the relative errors: every point within 1.1%.
    step_base_s=11.319e-3,
    per_sequence_s=0.1591e-3,
    # Not in the decode curve: two FLOPs per parameter per token at half of the H100's dense
    # fp16 rate, ~31,000 prompt tokens/s (the same runs prefilled 128 x 161 tokens in 0.59 s,
    # ~35,000 tokens/s).
    per_prefill_token_s=1 / 31_000,
    # vLLM's own reading in the same runs: 5,531 blocks of 16 tokens (43.2 GiB at 512 KiB a
    # token, gpu_memory_utilization 0.9).
    kv_cache_tokens=5_531 * BLOCK_TOKENS,
)


@dataclass(eq=False)
class SimSequence:
    """One request on the simulated GPU."""

    prompt_tokens: int
    target: int  # tokens to generate (0: a pooling request, done after its prefill)
    blocks: tuple[int, ...] = ()  # hash chain of the prompt's full blocks
    priority: int = 0
    generated: int = 0
    to_prefill: int = 0  # prompt tokens still to compute before its first token
    held_tail: int = 0  # KV tokens it holds outside the shared (hashed) blocks
    admitted: int = -1  # admission order (preemption takes the newest)
    first_token_at: float | None = None  # simulated seconds
    finished_at: float | None = None
    done: bool = False
    future: asyncio.Future[None] | None = field(default=None, repr=False)


class SimGpu:
    """The simulation in simulated seconds: ``submit`` requests, ``advance`` the clock, and read
    ``next_event_at``. Pure (no asyncio, no wall clock): the engine drives it, tests too."""

    def __init__(self, profile: GpuProfile, max_num_seqs: int, kv_cache_blocks: int = 0) -> None:
        self.profile = profile
        self.max_num_seqs = max(1, max_num_seqs)
        blocks = kv_cache_blocks or profile.kv_cache_tokens // BLOCK_TOKENS
        self.capacity = blocks * BLOCK_TOKENS
        self.now = 0.0
        self.running: list[SimSequence] = []
        self._waiting: list[tuple[int, int, SimSequence]] = []
        self._arrivals = itertools.count()
        self._admissions = itertools.count()
        self._refs: dict[int, int] = {}  # block hash -> running sequences holding it
        self._cached: OrderedDict[int, None] = OrderedDict()  # blocks with KV content, LRU first
        self._tails = 0  # sum of the running sequences' held_tail
        self.steps = 0
        self.prefilled_tokens = 0
        self.cached_tokens = 0
        self.preemptions = 0

    # ----------------------------------------------------------------------------- the surface

    def submit(self, seq: SimSequence, front: bool = False) -> None:
        order = -1 - next(self._arrivals) if front else next(self._arrivals)
        heapq.heappush(self._waiting, (seq.priority, order, seq))

    def drop(self, seq: SimSequence) -> None:
        """Take a request off the GPU (aborted): its places and KV go back."""
        if seq.done:
            return
        seq.done = True
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq)
        # A waiting one is passed over when it comes up.

    @property
    def waiting(self) -> int:
        """Requests queued for a place (vLLM's ``num_requests_waiting``)."""
        return sum(1 for _, _, seq in self._waiting if not seq.done)

    @property
    def held(self) -> int:
        """KV tokens the running sequences hold (a shared block once)."""
        return BLOCK_TOKENS * len(self._refs) + self._tails

    def next_event_at(self) -> float | None:
        """Simulated time of the next step boundary at which something changes; None when idle."""
        self._admit()
        if not self.running:
            return None
        decoding = [s for s in self.running if not s.to_prefill]
        if len(decoding) < len(self.running):
            return self.now + self.profile.step_s(len(decoding), self._prefill_budget(len(decoding)))
        return self.now + self._decode_steps() * self.profile.step_s(len(decoding))

    def advance(self, until: float) -> list[SimSequence]:
        """Run whole steps up to simulated time ``until``; returns the sequences that finished."""
        finished: list[SimSequence] = []
        while True:
            self._admit()
            if not self.running:
                self.now = max(self.now, until)
                return finished
            decoding = [s for s in self.running if not s.to_prefill]
            if len(decoding) < len(self.running):
                budget = self._prefill_budget(len(decoding))
                step = self.profile.step_s(len(decoding), budget)
                if self.now + step > until + _EPSILON:
                    return finished
                self.now += step
                self.steps += 1
                self._prefill_step(budget)
                for seq in decoding:
                    self._grow(seq, 1)
            else:
                step = self.profile.step_s(len(decoding))
                steps = min(self._decode_steps(), int((until - self.now) / step + _EPSILON))
                if steps <= 0:
                    return finished
                self.now += steps * step
                self.steps += steps
                for seq in decoding:
                    self._grow(seq, steps)
            finished.extend(self._finish())
            self._preempt_while_full()

    # ---------------------------------------------------------------------------- the insides

    def _decode_steps(self) -> int:
        """Decode steps until a sequence finishes or the cache fills (at least one)."""
        left = min(s.target - s.generated for s in self.running)
        free = self.capacity - self.held
        return max(1, min(left, free // len(self.running)))

    def _prefill_budget(self, decoding: int) -> int:
        pending = sum(s.to_prefill for s in self.running)
        return min(pending, max(1, MAX_BATCHED_TOKENS - decoding))

    def _prefill_step(self, budget: int) -> None:
        for seq in sorted(self.running, key=lambda s: s.admitted):
            if budget <= 0:
                break
            if not seq.to_prefill:
                continue
            chunk = min(budget, seq.to_prefill)
            seq.to_prefill -= chunk
            budget -= chunk
            self.prefilled_tokens += chunk
            if not seq.to_prefill and seq.target:
                self._grow(seq, 1)  # the first token comes with the prefill's last chunk
                if seq.first_token_at is None:
                    seq.first_token_at = self.now

    def _grow(self, seq: SimSequence, tokens: int) -> None:
        tokens = min(tokens, seq.target - seq.generated)
        seq.generated += tokens
        seq.held_tail += tokens
        self._tails += tokens

    def _finish(self) -> list[SimSequence]:
        done = [s for s in self.running if not s.to_prefill and s.generated >= s.target]
        for seq in done:
            self.running.remove(seq)
            self._release(seq)
            seq.done = True
            seq.finished_at = self.now
        return done

    def _admit(self) -> None:
        while self._waiting and len(self.running) < self.max_num_seqs:
            _, _, seq = self._waiting[0]
            if seq.done:
                heapq.heappop(self._waiting)
                continue
            hits = 0
            for block in seq.blocks:
                if block not in self._cached:
                    break
                hits += 1
            new_blocks = sum(1 for b in seq.blocks if b not in self._refs)
            tail = seq.prompt_tokens - BLOCK_TOKENS * len(seq.blocks) + seq.generated
            if self.running and self.held + BLOCK_TOKENS * new_blocks + tail + 1 > self.capacity:
                return  # waits for room (a lone sequence always runs)
            heapq.heappop(self._waiting)
            for block in seq.blocks:
                self._refs[block] = self._refs.get(block, 0) + 1
                self._cached[block] = None
                self._cached.move_to_end(block)
            # Recomputed after a preemption: its generated tokens are prompt now.
            seq.to_prefill = max(1, seq.prompt_tokens + seq.generated - BLOCK_TOKENS * hits)
            self.cached_tokens += seq.prompt_tokens + seq.generated - seq.to_prefill
            seq.held_tail = tail
            self._tails += tail
            seq.admitted = next(self._admissions)
            self.running.append(seq)
            self._evict()

    def _release(self, seq: SimSequence) -> None:
        for block in seq.blocks:
            left = self._refs.get(block, 0) - 1
            if left > 0:
                self._refs[block] = left
            else:
                self._refs.pop(block, None)
        self._tails -= seq.held_tail
        seq.held_tail = 0

    def _evict(self) -> None:
        """Forget cached blocks no sequence holds, least recently used first, beyond the room."""
        room = self.capacity - self._tails
        extra = len(self._cached) * BLOCK_TOKENS - room
        if extra <= 0:
            return
        for block in list(self._cached):
            if extra <= 0:
                break
            if block not in self._refs:
                del self._cached[block]
                extra -= BLOCK_TOKENS

    def _preempt_while_full(self) -> None:
        while len(self.running) > 1 and self.held > self.capacity:
            newest = max(self.running, key=lambda s: s.admitted)
            self.running.remove(newest)
            self._release(newest)
            newest.to_prefill = 0
            self.preemptions += 1
            self.submit(newest, front=True)
        self._evict()


# ---------------------------------------------------------------------------------------- lengths


def prompt_words(value: Any) -> list[str]:
    """A prompt's tokens as the fake engine counts them (whitespace words)."""
    if value is None:
        return []
    if isinstance(value, str):
        return value.split()
    if isinstance(value, dict):
        return prompt_words(value.get("content")) + prompt_words(value.get("text"))
    if isinstance(value, list):
        return [w for item in value for w in prompt_words(item)]
    return [str(value)]


def prompt_blocks(words: list[str]) -> tuple[int, ...]:
    """The hash chain of a prompt's full blocks (each block's key covers every token before it)."""
    chain, crc = [], 0
    for at in range(0, len(words) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        crc = zlib.crc32(" ".join(words[at : at + BLOCK_TOKENS]).encode(), crc)
        chain.append(crc)
    return tuple(chain)


def output_length(body: dict[str, Any], room: int, prompt: list[str]) -> int:
    """How many tokens a line generates (module docstring, "Output lengths")."""
    caps = (body.get(n) for n in ("max_completion_tokens", "max_tokens", "max_output_tokens"))
    cap = next((c for c in caps if isinstance(c, int) and not isinstance(c, bool) and c > 0), room)
    cap = max(1, min(cap, room))
    floor = body.get("min_tokens")
    floor = floor if isinstance(floor, int) and not isinstance(floor, bool) else 0
    natural = 1 + zlib.crc32(" ".join(prompt[-64:]).encode()) % cap  # where it would stop
    return min(cap, max(natural, floor))
