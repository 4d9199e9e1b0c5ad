"""Content-Disposition for downloads: a safe quoted filename, the exact one as filename* (RFC 6266)."""

from __future__ import annotations

from services.api.routes.files import attachment


def test_a_plain_name_is_quoted_as_is() -> None:
    assert attachment("batch_abc_output.jsonl") == 'attachment; filename="batch_abc_output.jsonl"'


def test_quotes_backslashes_and_control_characters_cannot_break_the_header() -> None:
    header = attachment('a"b\\c\r\nSet-Cookie: x.jsonl')
    assert "\r" not in header and "\n" not in header
    assert header.startswith("attachment; filename=\"a_b_c__Set-Cookie: x.jsonl\"; filename*=UTF-8''")
    assert "%22" in header and "%0D%0A" in header


def test_a_non_ascii_name_keeps_its_exact_form_in_filename_star() -> None:
    assert attachment("données.jsonl") == (
        "attachment; filename=\"donn_es.jsonl\"; filename*=UTF-8''donn%C3%A9es.jsonl"
    )


def test_an_empty_name_gets_a_fallback() -> None:
    assert attachment("") == 'attachment; filename="download"'
