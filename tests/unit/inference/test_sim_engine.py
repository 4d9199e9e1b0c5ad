"""The simulated GPU engine: its cost model against the published decode curve it was fitted to, the
physics the benchmarks rely on (batching, the KV cache, prefix reuse), and the engine contract.

The simulation runs in simulated seconds (``SimGpu``, no wall clock) or, through ``SimEngine``,
in wall time sped up many times."""

from __future__ import annotations

import asyncio

import pytest

from services.inference.engine import CHAT, EMBEDDINGS
from services.inference.sim_engine import SimEngine
from services.inference.sim_gpu import (
    BLOCK_TOKENS,
    PROFILE,
    PUBLISHED,
    SimGpu,
    SimSequence,
    output_length,
    prompt_blocks,
)
from tests.unit.inference.engine_contract import run_checks


def decode_step(batch: int, prompt: int = 161, output: int = 338) -> float:
    """Like the published runs: ``batch`` prompts prefilled first, then decoded together; the
    decode phase's time over its steps (seconds per step)."""
    gpu = SimGpu(PROFILE, max_num_seqs=batch)
    seqs = [
        SimSequence(prompt, output, prompt_blocks([f"b{n}w{i}" for i in range(prompt)])) for n in range(batch)
    ]
    for seq in seqs:
        gpu.submit(seq)
    while (due := gpu.next_event_at()) is not None:
        gpu.advance(due)
    decoding_from = max(s.first_token_at for s in seqs if s.first_token_at is not None)
    return (gpu.now - decoding_from) / (output - 1)


@pytest.mark.parametrize("batch", sorted(PUBLISHED))
def test_the_cost_model_reproduces_the_published_decode_curve_within_10_percent(batch: int) -> None:
    assert decode_step(batch) == pytest.approx(PUBLISHED[batch], rel=0.10)


def test_a_decode_step_grows_little_with_the_batch() -> None:
    assert PROFILE.step_s(8) / PROFILE.step_s(1) < 1.15
    assert PROFILE.step_s(64) / PROFILE.step_s(1) < 2  # the weights, read once a step, dominate


def test_longest_first_ends_a_mixed_batch_sooner_on_the_simulated_gpu() -> None:
    def run(lengths: list[int]) -> float:
        gpu = SimGpu(PROFILE, max_num_seqs=8)
        for n, length in enumerate(lengths):
            gpu.submit(SimSequence(32, length, prompt_blocks([f"l{n}w{i}" for i in range(32)])))
        while (due := gpu.next_event_at()) is not None:
            gpu.advance(due)
        return gpu.now

    lengths = [32] * 36 + [512] * 4  # the long lines at the end of the file
    assert run(sorted(lengths, reverse=True)) < 0.85 * run(lengths)  # 3.4 s against 4.2 s


def test_running_sequences_stay_within_max_num_seqs_and_the_kv_cache() -> None:
    gpu = SimGpu(PROFILE, max_num_seqs=4, kv_cache_blocks=40)  # 640 tokens
    seqs = [SimSequence(100, 200, prompt_blocks([f"s{n}w{i}" for i in range(100)])) for n in range(6)]
    for seq in seqs:
        gpu.submit(seq)
    while (due := gpu.next_event_at()) is not None:
        gpu.advance(due)
        assert len(gpu.running) <= 4 and (gpu.held <= gpu.capacity or len(gpu.running) == 1)
    assert all(s.generated == 200 for s in seqs)
    assert gpu.preemptions > 0  # 4 x 300 tokens do not fit in 640: the newest is recomputed


def test_a_prompt_seen_lately_is_not_prefilled_again() -> None:
    gpu = SimGpu(PROFILE, max_num_seqs=8)
    document = [f"d{i}" for i in range(40 * BLOCK_TOKENS)]
    for question in range(4):
        words = [*document, "question", str(question)]
        gpu.submit(SimSequence(len(words), 8, prompt_blocks(words)))
        while (due := gpu.next_event_at()) is not None:
            gpu.advance(due)
    assert gpu.cached_tokens == 3 * 40 * BLOCK_TOKENS  # the document's blocks, after the first line
    assert gpu.prefilled_tokens == 40 * BLOCK_TOKENS + 4 * 2


def test_output_lengths_honour_max_and_min_tokens() -> None:
    prompt = "say something".split()
    assert output_length({"max_tokens": 300, "min_tokens": 300}, 2000, prompt) == 300
    assert output_length({"max_tokens": 50, "min_tokens": 400}, 2000, prompt) == 50  # the cap wins
    natural = output_length({"max_tokens": 300}, 2000, prompt)
    assert 1 <= natural <= 300 and natural == output_length({"max_tokens": 300}, 2000, prompt)
    assert output_length({"max_tokens": 300, "min_tokens": 200}, 2000, prompt) >= 200
    assert output_length({}, 100, prompt) <= 100  # no cap: the room left in the context


async def test_answers_carry_their_simulated_output_length() -> None:
    async with SimEngine(max_num_seqs=8, speedup=1_000) as engine:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
        answer = await engine.run(CHAT, {**body, "min_tokens": 40}, "r1")
        assert answer.ok and answer.usage is not None and answer.usage.completion_tokens == 40
        assert len(answer.json()["choices"][0]["message"]["content"].split()) == 40
        embedded = await engine.run(EMBEDDINGS, {"model": "m", "input": "a b c"}, "r2")
        assert embedded.ok and embedded.json()["object"] == "list"
        too_long = await engine.run(
            CHAT, {**body, "messages": [{"role": "user", "content": "w " * 5000}]}, "r3"
        )
        assert too_long.status == 400
        assert engine.gpu.now > 0 and engine.gpu.steps >= 40


async def test_the_simulated_engine_keeps_the_engine_contract() -> None:
    async with SimEngine(max_num_seqs=8, speedup=20) as engine:
        outcomes = await asyncio.wait_for(run_checks(engine), 120)
    assert outcomes == {name: "ok" for name in outcomes}, outcomes
