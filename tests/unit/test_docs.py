"""The docs stay true to the tree: the configuration page matches the settings, links resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy import config_docs

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def test_configuration_page_matches_the_settings_classes() -> None:
    page = config_docs.PAGE.read_text() if config_docs.PAGE.exists() else ""
    assert page == config_docs.render(), (
        f"docs/configuration.md is out of date with the settings classes; regenerate it with "
        f"`{config_docs.REGENERATE}` and commit the result"
    )


def test_every_setting_has_a_description() -> None:
    assert config_docs.undocumented() == [], (
        "give each of these settings a docstring under its field (it becomes its description in "
        f"docs/configuration.md), then run `{config_docs.REGENERATE}`"
    )


def _prose(text: str) -> str:
    """The page without fenced code blocks and code spans (links there are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        slug, n = _slug(heading), 1
        unique = slug
        while unique in found:
            unique, n = f"{slug}-{n}", n + 1
        found.add(unique)
    return found


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(_prose(page.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_relative_links_point_at_existing_files_and_anchors(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.is_relative_to(REPO_ROOT):
            broken.append(f"{target}: outside the repository")
        elif not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == [], f"{page.relative_to(REPO_ROOT)} has broken links: {broken}"


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## Two words\n")
    page.write_text(
        "[ok](other.md#two-words) [bad file](missing.md) [bad anchor](other.md#nope) "
        "[web](https://example.com) `[code](skipped.md)`\n"
    )
    targets = relative_links(page)
    assert targets == ["other.md#two-words", "missing.md", "other.md#nope"]
    assert anchors(tmp_path / "other.md") == {"other-page", "two-words"}
