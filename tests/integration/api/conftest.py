"""Fixtures for the api contract tests: SDK and HTTP clients, a second project, extra api processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from openai import OpenAI

from deploy.local import Stack, free_port
from tests.support.waiting import wait_until


@pytest.fixture(scope="session")
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=0)


@pytest.fixture(scope="session")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=60
    ) as c:
        yield c


@pytest.fixture(scope="session")
def other_client(stack: Stack) -> OpenAI:
    """A client of another project."""
    return OpenAI(base_url=stack.base_url, api_key=stack.create_key("other-team"), max_retries=0)


@contextmanager
def extra_api(stack: Stack, **overrides: str) -> Iterator[str]:
    """Another api process on the same stack with some settings changed; yields its base URL."""
    port = free_port()
    env = {**os.environ, **stack.env(), "BATCHSTREAM_API_PORT": str(port), **overrides}
    command = [sys.executable, "-m", "uvicorn", "services.api.app:create_app", "--factory"]
    proc = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        assert proc.poll() is None, "the extra api exited"
        try:
            return httpx.get(f"{base}/health", timeout=2).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    try:
        wait_until(answering, 60, "the extra api")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
