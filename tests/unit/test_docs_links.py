"""The README and docs/ link to each other: every relative link names a file that exists, and
its #anchor a heading there (GitHub's slugs). The README's sections the code and the manifests
cite by name ("Moving from kube-proxy", "Security") are headings of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return re.findall(r"^#+ (.*)$", text, re.M)


def test_slug_is_githubs() -> None:
    assert slug("The daemon: `ipvsproxy run`") == "the-daemon-ipvsproxy-run"
    assert slug("The schedulers' models") == "the-schedulers-models"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in map(slug, headings(dest)):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_the_sections_cited_by_name_are_headings() -> None:
    names = set(headings(ROOT / "README.md"))
    assert {"Moving from kube-proxy", "Security"} <= names
