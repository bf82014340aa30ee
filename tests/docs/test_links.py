"""The way into the documentation: the README's Documentation list and the index of
docs/ each link every page of docs/, and every link to a section of a page names a
heading that page has (the anchor GitHub makes of it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.docs import PAGES, README, REPOSITORY

DOCS = REPOSITORY / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def linked_pages(text: str, base: Path) -> set[Path]:
    return {
        (base / target.split("#")[0]).resolve()
        for target in LINK.findall(text)
        if "://" not in target and target.split("#")[0].endswith(".md")
    }


def test_the_readme_documentation_list_links_every_page() -> None:
    section = README.read_text().split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert sorted(p.name for p in pages - linked_pages(section, REPOSITORY)) == []


def test_the_docs_index_links_every_page() -> None:
    index = DOCS / "README.md"
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert sorted(p.name for p in pages - linked_pages(index.read_text(), DOCS)) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_section_link_names_a_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if "://" in target or "#" not in target:
            continue
        path, section = target.split("#", 1)
        linked = (page.parent / path).resolve() if path else page
        if linked.suffix == ".md" and section not in anchors(linked):
            broken.append(target)
    assert broken == []
