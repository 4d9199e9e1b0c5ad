"""Prompt keys: a request line's prompt as canonical text, and the key of its prefixes.

Validation estimates a line's tokens from its prompt text and makes the batch's dispatch order
(``services/api/service/dispatch_order.py``) from its prefix keys.

**The prefix key.** Each line's prompt, as a canonical text (``prompt_text``: the tools, then each
message's role and text, in the order a chat template renders them), UTF-8 encoded, is cut into
blocks of ``BLOCK_BYTES``; the key is the sequence of the CRC-32s of the prompt up to each block
(each run on from the previous block's: one pass, in C), at most ``MAX_BLOCKS`` of them. Sorted,
these keys are a depth-first walk of the trie of the prompts: lines that share ``k`` blocks lie
together, and within them those sharing more lie closer still.
A collision (two prefixes with one CRC, about one in 4 billion pairs) only moves a line in the
order or joins two groups; nothing else depends on it.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import orjson

from shared.protocol.openai import CHAT, COMPLETIONS, MESSAGES, RESPONSES

BLOCK_BYTES = 256
MAX_BLOCKS = 16  # 4 KiB of a prompt take part in the key
DIGEST = 4  # CRC-32 of the prefix
KEY_BYTES = MAX_BLOCKS * DIGEST
_KEY_TEXT = BLOCK_BYTES * MAX_BLOCKS
_DIGESTS = [struct.Struct(f">{n}I{KEY_BYTES - n * DIGEST}x") for n in range(MAX_BLOCKS + 1)]
_crc32 = zlib.crc32


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(orjson.dumps(part, option=orjson.OPT_SORT_KEYS).decode())
        return "".join(parts)
    return "" if content is None else orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return _content_text(messages)
    out = []
    for message in messages:
        if isinstance(message, dict):
            out.append(f"{message.get('role', '')}\x1f{_content_text(message.get('content'))}\x1e")
        else:
            out.append(_content_text(message))
    return "".join(out)


def prompt_text(url: str, body: dict[str, Any]) -> str | None:
    """The canonical prompt of a line, in the order the engine sees it; None where prefix caching
    does not apply (embeddings, score and rerank run on the pooling runner)."""
    if url in (CHAT, MESSAGES):
        tools = body.get("tools")
        head = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode() + "\x1d" if tools else ""
        system = body.get("system") if url == MESSAGES else None  # Messages: rendered first
        head += f"system\x1f{_content_text(system)}\x1e" if system else ""
        return head + _messages_text(body.get("messages"))
    if url == COMPLETIONS:
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()
    if url == RESPONSES:
        instructions = body.get("instructions")
        head = f"{instructions}\x1d" if isinstance(instructions, str) else ""
        return head + _messages_text(body.get("input"))
    return None


def prefix_key(text: str) -> bytes:
    """The digests of ``text``'s prefixes up to each block (``KEY_BYTES``, zero-padded)."""
    # A character is at least one byte: the first KEY_TEXT characters hold the key's bytes.
    data = memoryview(text[:_KEY_TEXT].encode("utf-8", "surrogatepass"))[:_KEY_TEXT]
    crc = 0
    digests = [crc := _crc32(data[i : i + BLOCK_BYTES], crc) for i in range(0, len(data), BLOCK_BYTES)]
    return _DIGESTS[len(digests)].pack(*digests)


def shared_blocks(a: bytes, b: bytes) -> int:
    """How many leading blocks two keys share (zero padding is no block)."""
    # The first differing byte, from the highest set bit of the XOR: no loop in Python.
    equal = KEY_BYTES - ((int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).bit_length() + 7) // 8
    filled = -(-len(a.rstrip(b"\0")) // DIGEST)
    return min(equal // DIGEST, filled)
