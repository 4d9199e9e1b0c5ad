"""Where the client connects: flags first, then the openai SDK's variables, then the local stack."""

from __future__ import annotations

import os

from openai import OpenAI

LOCAL_BASE_URL = "http://127.0.0.1:10900/v1"
# The local stack's key (shared.settings.DEV_API_KEY; repeated here so the thin client does not
# import the services' settings, and a unit test keeps the two equal).
LOCAL_API_KEY = "sk-batchstream-local"


def connect(base_url: str | None = None, api_key: str | None = None, max_retries: int = 2) -> OpenAI:
    """An SDK client for ``base_url`` (default ``OPENAI_BASE_URL``, then the local stack)."""
    return OpenAI(
        base_url=base_url or os.environ.get("OPENAI_BASE_URL") or LOCAL_BASE_URL,
        api_key=api_key or os.environ.get("OPENAI_API_KEY") or LOCAL_API_KEY,
        max_retries=max_retries,
    )
