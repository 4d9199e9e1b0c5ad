"""The interactive docs work offline and can authorize: assets from the api, a bearer scheme."""

from __future__ import annotations

import re

import httpx
import pytest

from deploy.local.stack import Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def site(stack: Stack) -> str:
    """The api's root (the docs live beside /v1, not under it)."""
    return stack.base_url.removesuffix("/v1")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_load_every_asset_from_the_api_itself(site: str, page: str) -> None:
    html = httpx.get(site + page, timeout=30)
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]

    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text)
    assert assets, html.text
    assert not re.search(r"https?://", html.text), "the page names an external URL"
    for asset in assets:
        assert asset.startswith("/"), asset
        loaded = httpx.get(site + asset, timeout=30)
        assert loaded.status_code == 200 and loaded.content, asset
    assert any(a.endswith(".js") for a in assets)


def test_the_openapi_document_declares_the_bearer_scheme(site: str) -> None:
    document = httpx.get(site + "/openapi.json", timeout=30).json()

    schemes = document["components"]["securitySchemes"]
    # The bearer scheme, and Anthropic's key header for the Message Batches API beside it.
    assert set(schemes) == {"HTTPBearer", "AnthropicApiKey"}
    name, scheme = "HTTPBearer", schemes["HTTPBearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert (schemes["AnthropicApiKey"]["in"], schemes["AnthropicApiKey"]["name"]) == ("header", "x-api-key")
    anthropic_keys = [{"AnthropicApiKey": []}, {name: []}]
    assert document["paths"]["/v1/messages/batches"]["post"]["security"] == anthropic_keys
    assert document["paths"]["/v1/batches"]["post"]["security"] == [{name: []}]
    assert document["paths"]["/v1/files/{file_id}/content"]["get"]["security"] == [{name: []}]
    assert "security" not in document["paths"]["/health"]["get"]


def test_a_missing_or_malformed_key_is_still_openai_s_401(site: str) -> None:
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer"}):
        answer = httpx.get(site + "/v1/batches", headers=headers, timeout=30)
        assert answer.status_code == 401, headers
        assert answer.json()["error"]["code"] == "invalid_api_key"
