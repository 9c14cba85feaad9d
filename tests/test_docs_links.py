"""Every relative link in the README and docs reaches a file that exists and, with a
``#fragment``, a heading of that file (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens, ``-1``, ``-2`` ... for repeats). Renaming a heading or moving a page
breaks links silently otherwise."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def prose(page: Path) -> str:
    """The page without its code blocks (whose brackets are not links)."""
    return FENCE.sub("", page.read_text())


@cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page).splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
        repeat = seen.get(slug, 0)
        seen[slug] = repeat + 1
        out.add(slug if repeat == 0 else f"{slug}-{repeat}")
    return frozenset(out)


def test_the_pages_exist() -> None:
    assert len(PAGES) > 10 and all(page.is_file() for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_heading(page: Path) -> None:
    broken = []
    for match in LINK.finditer(prose(page)):
        target = match[1]
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken
