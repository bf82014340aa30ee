"""Every Python example of the documentation marked `<!-- docs-test: run -->` runs as
written: saved to a file in a directory of its own and run with this interpreter, it
exits 0 and prints what the sentence after it says (`It prints `...`.`). As written it
runs on a SQLite file; in the database tier it runs again with its SQLite URL replaced
by the database under test (a fresh schema), so the examples hold on every database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import PAGES, README, RUN_MARK, Block, blocks

EXAMPLES = [block for page in PAGES for block in blocks(page) if block.mark == RUN_MARK]
SQLITE_URL = re.compile(r'"sqlite:///[^"]*"')


def where(block: Block) -> str:
    return f"{block.page.relative_to(README.parent)}:{block.line}"


def promised_output(block: Block) -> str:
    """What the page says the example prints: the first `It prints `...`` after it."""
    after = block.page.read_text().split(block.text, 1)[1]
    match = re.search(r"It prints `([^`]*)`", after)
    assert match, f"{where(block)}: no 'It prints `...`' after the example"
    return match.group(1)


def run_example(source: str, directory: Path) -> str:
    script = directory / "example.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "AGBOSS_DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_pages_have_examples() -> None:
    assert {block.page.name for block in EXAMPLES} >= {"stores.md"}


@pytest.mark.parametrize("block", EXAMPLES, ids=where)
def test_each_example_runs_as_written(block: Block, tmp_path: Path) -> None:
    assert block.info == "python", where(block)
    assert run_example(block.text, tmp_path) == promised_output(block)


@pytest.mark.parametrize("block", EXAMPLES, ids=where)
def test_each_example_runs_on_the_database_under_test(
    block: Block, sql_url: str, tmp_path: Path
) -> None:
    (literal,) = SQLITE_URL.findall(block.text)
    source = block.text.replace(literal, repr(sql_url))
    assert run_example(source, tmp_path) == promised_output(block)
