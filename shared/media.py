"""Media URLs inside request lines: which ones a worker may fetch.

A chat or Responses body may name images, audio or video by URL (``image_url``, ``audio_url``,
``video_url``, ``file_url``), and an Anthropic Messages body an image or a document by a ``source``
of type ``url``; the engine (vLLM, or a remote server) then fetches each from inside
the cluster, where a URL could reach cloud metadata or internal hosts. Only ``data:`` URLs (the
media inline) are taken, plus ``http(s)`` URLs on the domains an operator allows
(``BATCHSTREAM_MEDIA_ALLOWED_DOMAINS``). The api refuses other URLs at validation (that line's
error); the worker refuses them again for requests that reach Kafka another way (a pipeline), and
hands the same list to vLLM, which checks it on every fetch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

MEDIA_KEYS = frozenset({"image_url", "audio_url", "video_url", "file_url"})
"""Keys whose value is a media URL (a string) or an object holding one in ``url``."""

SOURCE_KEY = "source"
"""An Anthropic content block's (image, document) media: a URL when its ``type`` is ``url``."""

URL_MARKER = b"_url"
"""Every media key ends so (``image_url``...)."""
SOURCE_MARKER = b'"source"'
"""Anthropic's media key. A line holding neither marker names no media URL (a cheap pre-check)."""
ESCAPE = b"\\u"
"""A JSON escape may spell a key's bytes otherwise (``image\u005furl``): a line holding one is walked
whatever the pre-check says."""
FIRST_BYTE_HOPS = 8
"""Occurrences of a needle's first byte looked at one by one before searching the rest whole."""


def _holds(raw: bytes, needle: bytes) -> bool:
    """``needle in raw``, found by hopping over its first byte, which ``bytes.find`` looks for with
    ``memchr``: a 4 KB line holding neither needle is read in about a tenth of the time a search
    for the whole needle takes (CPython's multi-byte search reads ~1 byte per ns). After
    ``FIRST_BYTE_HOPS`` hops the rest is searched whole, so a line full of the first byte costs
    no more than that search."""
    first = needle[:1]
    at = raw.find(first)
    for _ in range(FIRST_BYTE_HOPS):
        if at < 0:
            return False
        if raw.startswith(needle, at):
            return True
        at = raw.find(first, at + 1)
    return at >= 0 and raw.find(needle, at) >= 0


def may_name_media(raw: bytes) -> bool:
    """Whether a line's bytes may name a media URL (False: the body need not be walked).

    ``SOURCE_MARKER`` starts with a quote, which a JSON line is full of: searched whole (1.6 us on
    a 4 KB line, against 4.3 us by hops); the others by hops over their rarer first bytes (1.1 and
    0.6 us, against 3.7 and 4.5 us whole)."""
    return _holds(raw, URL_MARKER) or SOURCE_MARKER in raw or _holds(raw, ESCAPE)


def media_urls(value: Any, path: str = "body") -> Iterator[tuple[str, str]]:
    """(param, url) of every media URL in a request body, depth first."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in MEDIA_KEYS:
                if isinstance(item, str):
                    yield f"{path}.{key}", item
                elif isinstance(item, dict) and isinstance(item.get("url"), str):
                    yield f"{path}.{key}.url", item["url"]
            elif key == SOURCE_KEY and isinstance(item, dict) and item.get("type") == "url":
                url = item.get("url")
                yield f"{path}.{key}.url", url if isinstance(url, str) else ""
            elif isinstance(item, dict | list):
                yield from media_urls(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict | list):
                yield from media_urls(item, f"{path}[{i}]")


def refused_url(url: str, allowed_domains: frozenset[str]) -> str | None:
    """Why a worker must not fetch ``url`` (None when it may)."""
    if url[:5].lower() == "data:":
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return "it is not a valid URL"
    host = (parts.hostname or "").lower()
    if parts.scheme.lower() in ("http", "https") and host and host in allowed_domains:
        return None
    if not allowed_domains:
        return "only data: URLs are taken (no media domain is allowed)"
    return "its host is not one of the allowed media domains"


def first_refusal(body: Any, allowed_domains: frozenset[str]) -> tuple[str, str] | None:
    """(param, message) for the first media URL of ``body`` a worker must not fetch."""
    for param, url in media_urls(body):
        why = refused_url(url, allowed_domains)
        if why is not None:
            return param, f"The media URL at {param} is not allowed: {why}."
    return None
