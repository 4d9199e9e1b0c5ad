"""Batch input lines built and result files read the way a Batch API user does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from openai import AsyncOpenAI, OpenAI

from shared.input_lines import InputLine, request_lines
from shared.stores.models import ServedModel

CHAT = "/v1/chat/completions"


def request_line(custom_id: str, url: str, body: dict[str, Any]) -> str:
    """One input line (JSON text) for ``url``."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def chat_body(model: str, content: str, **body: Any) -> dict[str, Any]:
    """A chat completions body with one user message."""
    return {"model": model, "messages": [{"role": "user", "content": content}], **body}


def chat_request(custom_id: str, model: str, content: str | None = None, **body: Any) -> dict[str, Any]:
    """One chat input line as a dict; the message is ``say <custom_id>`` unless given."""
    content = f"say {custom_id}" if content is None else content
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": chat_body(model, content, **body)}


def chat_line(custom_id: str, model: str, content: str | None = None, **body: Any) -> str:
    """``chat_request`` as JSON text."""
    return json.dumps(chat_request(custom_id, model, content, **body))


def jsonl(lines: Iterable[dict[str, Any]]) -> bytes:
    """A JSONL file's bytes."""
    return "\n".join(json.dumps(line) for line in lines).encode()


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The records of a JSONL text; split on "\\n" only: generated text may hold characters that
    ``str.splitlines`` breaks on (\\x1c, \\u2028)."""
    return [json.loads(raw) for raw in text.split("\n") if raw]


def read_lines(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """A file's records through the api (none when there is no file)."""
    return parse_jsonl(client.files.content(file_id).text) if file_id else []


def file_request_lines(items: Iterable[bytes], max_line_bytes: int | None = None) -> AsyncIterator[InputLine]:
    """The request lines of a file made of ``items`` (one line each), numbered as every service
    numbers them (``shared.input_lines``)."""

    async def chunks() -> AsyncIterator[bytes]:
        for item in items:
            yield item + b"\n"

    return request_lines(chunks(), max_line_bytes)


async def read_lines_async(client: AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """``read_lines`` with an async client."""
    return parse_jsonl((await client.files.content(file_id)).text) if file_id else []


def served(**context_lengths: int | None) -> dict[str, ServedModel]:
    """Served base models by name, with their context lengths (validation's ``known_models``)."""
    return {name: ServedModel(name, length) for name, length in context_lengths.items()}
