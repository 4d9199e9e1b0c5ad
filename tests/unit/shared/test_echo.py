"""Error messages quote a client's value cut to ``ECHO_CHARS``, marked with its full length."""

from __future__ import annotations

from shared.errors import ECHO_CHARS, echo


def test_a_short_value_is_quoted_whole() -> None:
    assert echo("gpt-4o") == "'gpt-4o'"
    assert echo("file-abc", quote=False) == "file-abc"
    assert echo(["/v1/chat/completions"]) == "['/v1/chat/completions']"


def test_a_long_value_is_cut_and_says_how_long_it_was() -> None:
    quoted = echo("m" * 15_000)
    assert quoted == "'" + "m" * (ECHO_CHARS - 1) + "… (15000 characters)"
    assert echo("f" * 1_000_000, quote=False) == "f" * ECHO_CHARS + "… (1000000 characters)"


def test_escapes_count_toward_the_cut_so_the_quote_stays_bounded() -> None:
    quoted = echo("\x00" * 10_000)  # each character is four in the repr
    assert len(quoted) <= ECHO_CHARS + len("… (10000 characters)")
    assert quoted.endswith("… (10000 characters)")


def test_a_long_value_of_another_type_is_cut_by_its_repr() -> None:
    text = repr(["u"] * 1000)
    assert echo(["u"] * 1000) == f"{text[:ECHO_CHARS]}… ({len(text)} characters)"
