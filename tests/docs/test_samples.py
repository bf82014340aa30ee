"""Every sample output of the documentation is what its command prints today.

An output block (a fenced block with no language) on a page of `docs/` is marked
`<!-- sample: COMMAND -->`: the test runs `COMMAND` in a directory of its own on the
embedded SQLite default, after `agboss-sql demo` has left a takeover there, as a base
install runs it (no `langgraph` extra), and compares what it prints with the block, times,
ages, durations and ids aside (`support.docs.normalised`). So a new migration, a store
added or a line reworded fails here until the sample shows it. The README's own samples
(the cluster and the demo, run by its quick start) are compared by `tests/test_readme.py`;
an output block anywhere without a mark fails here.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import (
    PAGES,
    README,
    REPOSITORY,
    SAMPLE_BY_TEST_MARK,
    Block,
    blocks,
    normalised,
    samples,
)

BASE_INSTALL = (
    "import sys; sys.modules['langgraph'] = None; "  # what a base install lacks
    "from agboss_sql.cli import main; raise SystemExit(main())"
)
"""`agboss-sql` as a base install runs it: the `langgraph` extra cannot be imported."""

DOC_SAMPLES = [
    (command, block) for page in PAGES if page != README for command, block in samples(page)
]


def agboss_sql(arguments: list[str], cwd: Path, *, base: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "AGBOSS_DATABASE_URL"}
    prefix = (
        [sys.executable, "-c", BASE_INSTALL] if base else [sys.executable, "-m", "agboss_sql.cli"]
    )
    done = subprocess.run(
        [*prefix, *arguments], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )
    assert done.returncode == 0, (arguments, done.stdout, done.stderr)
    return done.stdout


class AfterTheDemo:
    """A directory whose embedded database holds what `agboss-sql demo` leaves, and what
    each command printed there (each run once)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        agboss_sql(["demo"], directory, base=True)
        self._printed: dict[tuple[str, bool], str] = {}

    def printed(self, command: str, *, base: bool = True) -> str:
        words = shlex.split(command)
        assert words[0] == "agboss-sql", f"a sample of {command!r}"
        if (command, base) not in self._printed:
            self._printed[command, base] = agboss_sql(words[1:], self.directory, base=base)
        return self._printed[command, base]


@pytest.fixture(scope="module")
def after_the_demo(tmp_path_factory: pytest.TempPathFactory) -> AfterTheDemo:
    return AfterTheDemo(tmp_path_factory.mktemp("samples"))


def where(block: Block) -> str:
    return f"{block.page.relative_to(README.parent)}:{block.line}"


def test_the_pages_show_samples() -> None:
    commands = {command for command, _ in DOC_SAMPLES}
    assert {"agboss-sql check", "agboss-sql current"} <= commands, commands


@pytest.mark.parametrize(("command", "block"), DOC_SAMPLES, ids=[where(b) for _, b in DOC_SAMPLES])
def test_each_sample_is_what_its_command_prints(
    command: str, block: Block, after_the_demo: AfterTheDemo
) -> None:
    printed = after_the_demo.printed(command)
    assert normalised(printed) == normalised(block.text), (
        f"{where(block)}: the sample is not what `{command}` prints now (after "
        f"`agboss-sql demo`, on a base install); update it to:\n{printed}"
    )


def test_check_with_the_langgraph_extra_prints_the_saver_too(
    after_the_demo: AfterTheDemo,
) -> None:
    """operations.md: with the extra, `check` prints one line more, the saver's."""
    pytest.importorskip("langgraph.checkpoint.base")
    base = normalised(after_the_demo.printed("agboss-sql check")).splitlines()
    full = normalised(after_the_demo.printed("agboss-sql check", base=False)).splitlines()
    added = [line for line in full if line not in base]
    assert len(full) == len(base) + 1, full
    assert [line.split(":")[0] for line in added] == ["  BaseCheckpointSaver (SqlCheckpointSaver)"]


def produced_by_its_test(block: Block) -> bool:
    """The block is marked `sample by TEST: ...` and TEST reads the block's page and
    names that mark."""
    match = SAMPLE_BY_TEST_MARK.match(block.mark or "")
    if match is None:
        return False
    test = REPOSITORY / match.group("test")
    source = test.read_text() if test.is_file() else ""
    return block.page.name in source and match.group("what") in source


def test_every_output_block_is_a_marked_sample() -> None:
    """A block with no language is an output; each one is a sample a test produces."""
    unmarked = [
        where(block)
        for page in PAGES
        for block in blocks(page)
        if block.info == ""
        and not (block.mark or "").startswith("<!-- sample: ")
        and not produced_by_its_test(block)
    ]
    assert unmarked == []


def test_the_readme_samples_are_of_commands_its_quick_start_runs() -> None:
    """tests/test_readme.py compares the README's samples with its quick start's output."""
    from test_readme import marked_commands

    run = {command.removeprefix(".venv/bin/") for command in marked_commands()}
    shown = [command for command, _ in samples(README)]
    assert shown and [command for command in shown if command not in run] == []
