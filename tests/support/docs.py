"""What the documentation's tests share: the pages, the blocks marked on them, and the
normalisation of what varies from one run of a command to the next (times, ages, ids,
temporary paths), which is all a sample may differ in from what the command prints."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
README = REPOSITORY / "README.md"
PAGES = [README, *sorted((REPOSITORY / "docs").glob("*.md"))]

SAMPLE_MARK = re.compile(r"^<!-- sample: (?P<command>.+?) -->$")
SAMPLE_BY_TEST_MARK = re.compile(r"^<!-- sample by (?P<test>tests/\S+\.py): (?P<what>.+?) -->$")
"""A sample only a particular test can produce (a server in a given state): that test
file runs the command and compares what it prints with the block."""
RUN_MARK = "<!-- docs-test: run -->"


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its info string (`sh`, `python`, or empty for an
    output), its text, and the mark on the line before it, if any."""

    page: Path
    line: int
    info: str
    text: str
    mark: str | None


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    number = 0
    while number < len(lines):
        line = lines[number]
        if line.startswith("```"):
            info = line[3:].strip()
            end = number + 1
            while not lines[end].startswith("```"):
                end += 1
            before = [x for x in lines[:number] if x.strip()]
            mark = before[-1] if before and before[-1].startswith("<!--") else None
            text = "\n".join(lines[number + 1 : end]) + "\n"
            found.append(Block(page, number + 1, info, text, mark))
            number = end
        number += 1
    return found


def samples(page: Path) -> list[tuple[str, Block]]:
    """The output blocks of `page` marked `<!-- sample: COMMAND -->`, with their command."""
    marked = []
    for block in blocks(page):
        match = SAMPLE_MARK.match(block.mark or "")
        if block.info == "" and match:
            marked.append((match.group("command"), block))
    return marked


VARYING = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z"), "<time>"),
    # An age is printed in ms under a second, in s above it: both are one placeholder.
    (re.compile(r"\(\d+(\.\d+)? m?s ago\)"), "(<age>)"),
    (re.compile(r"[-+]?\d+(\.\d+)? ms\b"), "<ms> ms"),
    (re.compile(r"\b(tree|order)-[0-9a-f]+"), r"\1-<id>"),
]


def normalised(text: str) -> str:
    """`text` with the times, ages, durations and ids a command prints differently on
    every run replaced by placeholders; nothing else."""
    for pattern, placeholder in VARYING:
        text = pattern.sub(placeholder, text)
    return text.rstrip("\n") + "\n"
