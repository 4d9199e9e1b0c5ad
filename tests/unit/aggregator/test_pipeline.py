"""ChunkPipeline: one chunk in flight, handled in submission order, cancel acks nothing."""

from __future__ import annotations

import asyncio

import pytest

from services.aggregator.pipeline import ChunkPipeline


async def test_chunks_are_handled_one_at_a_time_in_order() -> None:
    log: list[str] = []
    release = asyncio.Event()

    async def handle(chunk: list[int]) -> None:
        log.append(f"start {chunk[0]}")
        if chunk[0] == 1:
            await release.wait()
        log.append(f"done {chunk[0]}")

    pipeline: ChunkPipeline[int] = ChunkPipeline(handle)
    assert await pipeline.submit([1]) < 0.1  # returns at once: the next chunk can be collected
    await asyncio.sleep(0)
    assert pipeline.busy and log == ["start 1"]
    second = asyncio.create_task(pipeline.submit([2]))
    await asyncio.sleep(0.01)
    assert not second.done() and log == ["start 1"]  # waits for chunk 1 to finish
    release.set()
    await second
    await pipeline.join()
    assert log == ["start 1", "done 1", "start 2", "done 2"]
    assert not pipeline.busy


async def test_cancel_abandons_the_chunk_in_flight() -> None:
    finished: list[list[int]] = []

    async def handle(chunk: list[int]) -> None:
        await asyncio.sleep(10)
        finished.append(chunk)  # stands for the ack

    pipeline: ChunkPipeline[int] = ChunkPipeline(handle)
    await pipeline.submit([1])
    await asyncio.sleep(0)
    await pipeline.cancel()
    assert not pipeline.busy and finished == []
    await pipeline.cancel()  # nothing in flight: a no-op


async def test_a_failed_chunk_surfaces_at_the_next_submit() -> None:
    async def handle(chunk: list[int]) -> None:
        raise RuntimeError("boom")

    pipeline: ChunkPipeline[int] = ChunkPipeline(handle)
    await pipeline.submit([1])
    with pytest.raises(RuntimeError):
        await pipeline.submit([2])
