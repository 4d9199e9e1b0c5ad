"""Fixtures for the api contract tests: SDK and HTTP clients, a second project."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from deploy.local import Stack


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
