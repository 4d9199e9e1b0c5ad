"""Build the engine ``InferenceSettings.engine`` names: ``vllm`` (the default) or ``fake``.

The only module that knows every engine. The vLLM engine is imported here, lazily, so tests and
the pipeline benchmark run the fake engine without vLLM installed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from services.inference.engine import Engine
from services.inference.settings import InferenceSettings


@asynccontextmanager
async def open_engine(settings: InferenceSettings) -> AsyncIterator[Engine]:
    """The engine ``settings.engine`` names, started and owned for the block's duration."""
    if settings.engine == "fake":
        from services.inference.fake_engine import FakeEngine

        yield FakeEngine(
            model_id=settings.model_id,
            max_context_length=settings.max_model_len,
            seconds_per_token=settings.fake_seconds_per_token,
        )
        return
    from services.inference.vllm_engine import VllmEngine

    async with VllmEngine(settings) as engine:
        yield engine
