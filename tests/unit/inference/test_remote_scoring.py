"""A pooling model on a remote server: score and rerank lines go to the server's same path, and its
answer comes back as it gave it, with the usage read from the body."""

from __future__ import annotations

import httpx
import orjson

from services.inference.engine import RERANK, SCORE
from services.inference.remote_engine import RemoteEngine
from services.inference.settings import InferenceSettings

RERANKED = {
    "id": "score-r",
    "model": "reranker",
    "usage": {"prompt_tokens": 32, "total_tokens": 32},
    "results": [{"index": 1, "document": {"text": "b", "multi_modal": None}, "relevance_score": 0.9}],
}


async def test_a_rerank_line_is_posted_to_the_same_path_and_answered_as_the_server_did() -> None:
    posted: list[tuple[str, dict[str, object]]] = []

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "reranker", "max_model_len": 512}]})
        posted.append((request.url.path, orjson.loads(request.content)))
        return httpx.Response(200, content=orjson.dumps(RERANKED))

    settings = InferenceSettings(
        engine="remote",
        remote_url="http://server:8000/v1",
        served_model_name="ranker",
        remote_model="reranker",
        runner="pooling",
        remote_admission=False,
    )
    async with RemoteEngine(settings, transport=httpx.MockTransport(server)) as engine:
        assert SCORE in engine.endpoints and RERANK in engine.endpoints
        answer = await engine.run(RERANK, {"model": "ranker", "query": "q", "documents": ["a", "b"]}, "r")
    assert posted == [("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["a", "b"]})]
    assert answer.status == 200 and answer.json() == RERANKED
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.total_tokens) == (32, 32)
