"""The docs stay true to the tree: the configuration page matches the settings, links resolve, and
no tracked file labels a figure or fact by development round (dates and commits name them)."""

from __future__ import annotations

import re
import shutil
import subprocess
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


# A figure or fact named by the development round that produced it; the date and the commit name it
# instead, and the history is in git.
_ROUND_LABEL = re.compile(r"session [0-9]", re.IGNORECASE)


def tracked_text_files() -> list[Path]:
    """Every file git tracks under the repository root that reads as text (binary files skipped)."""
    if not (REPO_ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout (an unpacked source tree), or no git")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True)
    files = []
    for name in listed.stdout.decode().split("\0"):
        path = REPO_ROOT / name
        if name and path.is_file() and not path.is_symlink():
            files.append(path)
    return files


def round_labels(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """``path:line: text`` for each line that labels something by development round; none for a
    binary file (a NUL byte, or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    relative = path.relative_to(root).as_posix()
    return [
        f"{relative}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), start=1)
        if _ROUND_LABEL.search(line)
    ]


def test_no_tracked_file_labels_anything_by_development_round() -> None:
    files = tracked_text_files()
    assert REPO_ROOT / "docs" / "benchmarks.md" in files
    found = [hit for path in files for hit in round_labels(path)]
    assert found == [], (
        f"name measurements and facts by their date and commit, not by development round: {found}"
    )


def test_the_round_label_check_sees_a_label_and_skips_binary_files(tmp_path: Path) -> None:
    label = "Session " + "7"  # split, so this file does not carry the label itself
    (tmp_path / "notes.md").write_text(f"Measured in {label}.\nMeasured on 2026-12-01 at 49b1a09.\n")
    (tmp_path / "blob.bin").write_bytes(f"\0{label}".encode())
    (tmp_path / "latin1.txt").write_bytes(f"caf\xe9 {label}".encode("latin-1"))
    assert round_labels(tmp_path / "notes.md", tmp_path) == [f"notes.md:1: Measured in {label}."]
    assert round_labels(tmp_path / "blob.bin", tmp_path) == []
    assert round_labels(tmp_path / "latin1.txt", tmp_path) == []
