"""Build the engine ``InferenceSettings.engine`` names: ``vllm`` (the default), ``remote``,
``fake`` or ``sim``.

The only module that knows every engine. Each is imported here, lazily: the vLLM engine imports
vLLM, which the remote engine, the tests and the pipeline benchmark's fake engine do without.
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
            max_running=settings.fake_max_running,
            adapters=tuple(settings.lora_adapters),
        )
        return
    if settings.engine == "sim":
        from services.inference.sim_engine import SimEngine

        async with SimEngine(
            model_id=settings.model_id or "sim-model",
            max_context_length=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            kv_cache_blocks=settings.kv_cache_blocks,
            speedup=settings.sim_speedup,
            adapters=tuple(settings.lora_adapters),
        ) as sim:
            yield sim
        return
    if settings.engine == "remote":
        from services.inference.remote_engine import RemoteEngine

        async with RemoteEngine(settings) as remote:
            yield remote
        return
    from services.inference.vllm_engine import VllmEngine

    async with VllmEngine(settings) as engine:
        yield engine
