"""The OpenAPI document declares the answers the api really gives (the fuzz test relies on it)."""

from __future__ import annotations

from typing import Any

import pytest

from services.api.app import create_app

ERROR = {"$ref": "#/components/schemas/ErrorResponse"}
# Anthropic's Message Batches API answers in Anthropic's error shape, to Anthropic's key header too.
MESSAGE_BATCHES = "/v1/messages/batches"
ANTHROPIC_ERROR = {"$ref": "#/components/schemas/AnthropicErrorResponse"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app().openapi()


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), path, op) for path, ops in document["paths"].items() for m, op in ops.items()]


def test_no_operation_declares_the_422_the_api_never_sends(document: dict[str, Any]) -> None:
    assert [f"{m} {p}" for m, p, op in operations(document) if "422" in op["responses"]] == []
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_every_operation_declares_400_and_503_with_the_error_body(document: dict[str, Any]) -> None:
    for method, path, op in operations(document):
        for status in ("400", "500", "503"):
            declared = op["responses"].get(status, {}).get("content", {}).get("application/json", {})
            if path == "/health" and status == "503":
                continue  # its own body, below
            expected = ANTHROPIC_ERROR if path.startswith(MESSAGE_BATCHES) else ERROR
            assert declared.get("schema") == expected, f"{method} {path} {status}"
        assert "Retry-After" in op["responses"]["503"]["headers"], f"{method} {path}"


def test_keyed_operations_declare_401_and_the_unkeyed_ones_need_no_key(document: dict[str, Any]) -> None:
    for method, path, op in operations(document):
        if path in {"/health", "/livez", "/readyz", "/metrics"}:
            assert "security" not in op and "401" not in op["responses"], path
        elif path.startswith(MESSAGE_BATCHES):
            assert op["security"] == [{"AnthropicApiKey": []}, {"HTTPBearer": []}], f"{method} {path}"
            assert "401" in op["responses"], f"{method} {path}"
        else:
            assert op["security"] == [{"HTTPBearer": []}] and "401" in op["responses"], f"{method} {path}"
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_downloads_declare_their_media_type_not_json(document: dict[str, Any]) -> None:
    content = document["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["application/octet-stream"]
    partial = document["paths"]["/v1/batches/{batch_id}/partial_output"]["get"]["responses"]["200"]
    assert list(partial["content"]) == ["application/jsonl"]
