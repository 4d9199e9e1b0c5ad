"""Which media URLs in a request body a worker may fetch: data: URLs, and allowed hosts only."""

from __future__ import annotations

from typing import Any

import pytest

from shared.media import first_refusal, may_name_media, media_urls, refused_url

PNG = "data:image/png;base64,iVBORw0KGgo="


def chat(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, *parts]}]}


def test_every_media_url_of_a_chat_or_responses_body_is_found_with_its_param() -> None:
    body = chat(
        {"type": "image_url", "image_url": {"url": "https://a.example/x.png"}},
        {"type": "audio_url", "audio_url": {"url": PNG}},
    )
    body["input"] = [{"type": "input_image", "image_url": "http://b.example/y.png"}]  # Responses' shape
    assert list(media_urls(body)) == [
        ("body.messages[0].content[1].image_url.url", "https://a.example/x.png"),
        ("body.messages[0].content[2].audio_url.url", PNG),
        ("body.input[0].image_url", "http://b.example/y.png"),
    ]


def test_an_anthropic_url_source_is_a_media_url_and_an_inline_one_is_not() -> None:
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/x"}},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                    },
                    {"type": "document", "source": {"type": "url", "url": "https://docs.example/a.pdf"}},
                ],
            }
        ],
    }
    assert list(media_urls(body)) == [
        ("body.messages[0].content[0].source.url", "http://169.254.169.254/x"),
        ("body.messages[0].content[2].source.url", "https://docs.example/a.pdf"),
    ]
    refusal = first_refusal(body, frozenset({"docs.example"}))
    assert refusal is not None and refusal[0] == "body.messages[0].content[0].source.url"


@pytest.mark.parametrize(
    ("url", "allowed", "refused"),
    [
        (PNG, frozenset(), False),
        ("DATA:image/png;base64,AAAA", frozenset(), False),
        ("https://images.example.com/a.png", frozenset(), True),  # nothing allowed: data: only
        ("https://images.example.com/a.png", frozenset({"images.example.com"}), False),
        ("https://IMAGES.example.com/a.png", frozenset({"images.example.com"}), False),
        ("https://images.example.com.evil.test/a.png", frozenset({"images.example.com"}), True),
        ("http://169.254.169.254/latest/meta-data/", frozenset({"images.example.com"}), True),
        ("file:///etc/passwd", frozenset({"images.example.com"}), True),
        ("ftp://images.example.com/a.png", frozenset({"images.example.com"}), True),
        ("http://[::1", frozenset({"images.example.com"}), True),  # not a URL
    ],
)
def test_only_data_urls_and_allowed_hosts_pass(url: str, allowed: frozenset[str], refused: bool) -> None:
    assert (refused_url(url, allowed) is not None) is refused


def test_the_first_refused_url_is_named_with_its_param() -> None:
    body = chat(
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "image_url", "image_url": {"url": "http://10.0.0.1/a.png"}},
    )
    refusal = first_refusal(body, frozenset())
    assert refusal is not None
    param, message = refusal
    assert param == "body.messages[0].content[2].image_url.url"
    assert "only data: URLs" in message and "10.0.0.1" not in message  # the URL is not echoed
    assert first_refusal(chat({"type": "image_url", "image_url": {"url": PNG}}), frozenset()) is None


@pytest.mark.parametrize(
    ("raw", "may"),
    [
        (b'{"body": {"max_tokens": 5, "messages": [{"content": "hi"}]}}', False),
        (b'{"body": {"messages": [{"image_url": "x"}]}}', True),
        (b'{"body": {"messages": [{"image\\u005furl": "x"}]}}', True),  # spelt with an escape
        (b"_" * 100 + b"_url", True),  # found past more first bytes than are hopped over
        (b"_" * 100 + b" url", False),
        (b"\\n" * 100 + b"\\u0041", True),
        (b'{"content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}', True),
    ],
)
def test_the_byte_pre_check_finds_every_line_that_may_name_a_media_url(raw: bytes, may: bool) -> None:
    assert may_name_media(raw) is may
