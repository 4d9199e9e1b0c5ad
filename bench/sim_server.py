"""An OpenAI-compatible server on the simulated GPU, in place of ``vllm serve`` for the shared-server
benchmark (``python -m bench --only shared --engine sim``): the remote worker and the live client
send it requests as they would a vLLM server's.

It serves ``/health``, ``/v1/models``, ``POST /v1/chat/completions`` and ``/v1/completions`` (the
simulated engine's answers, ``services/inference/sim_engine.py``) and ``/metrics`` with the vLLM
series the benchmark and the remote worker read: ``vllm:generation_tokens_total``,
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``. Run it with
``python -m bench.sim_server --port P --served-name NAME ...``; ``SimServer`` starts it as a
process (a ``deploy.local.model_server.ModelServer``, as ``VllmServer`` is). Latencies it causes
are simulated seconds divided by ``--speedup``: compare them as ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from deploy.local.model_server import ModelServer
from services.inference.engine import CHAT, COMPLETIONS
from services.inference.sim_engine import SimEngine


def build_app(engine: SimEngine, served_name: str) -> FastAPI:
    generated = [0]

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with engine:
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": served_name, "object": "model", "created": 0, "owned_by": "sim"}
        return {"object": "list", "data": [card | {"max_model_len": engine.max_context_length}]}

    async def serve(url: str, request: Request) -> Response:
        body = await request.json()
        answer = await engine.run(url, body, uuid.uuid4().hex)
        if answer.ok and answer.usage is not None:
            generated[0] += answer.usage.completion_tokens
        return Response(answer.body, status_code=answer.status, media_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await serve(CHAT, request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(COMPLETIONS, request)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        gpu = engine.gpu
        lines = [
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total {generated[0]}",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running {len(gpu.running)}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting {gpu.waiting}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    return app


class SimServer(ModelServer):
    """``python -m bench.sim_server`` as a process."""

    def __init__(
        self,
        served_name: str,
        max_num_seqs: int,
        speedup: float,
        max_model_len: int,
        start_timeout_s: float = 60,
    ) -> None:
        def argv(port: int) -> list[str]:
            return [
                *(sys.executable, "-m", "bench.sim_server", "--port", str(port)),
                *("--served-name", served_name, "--max-num-seqs", str(max_num_seqs)),
                *("--speedup", f"{speedup:g}", "--max-model-len", str(max_model_len)),
            ]

        super().__init__("simulated server", argv, served_name, max_num_seqs, start_timeout_s=start_timeout_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-name", required=True)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--max-model-len", type=int, default=8192)
    args = parser.parse_args()
    import uvicorn

    engine = SimEngine(
        model_id=args.served_name,
        max_context_length=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        speedup=args.speedup,
    )
    app = build_app(engine, args.served_name)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
