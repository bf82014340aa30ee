"""The library installs without the lab: `rich` comes only with the `lab` extra, the
library's commands import nothing of `agboss_sql.lab`, and a lab command without the
extra exits 2 with the line that installs it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agboss_sql import cli
from agboss_sql.lab import REQUIRES

REPOSITORY = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))["project"]
LAB_COMMANDS = [name for name, command in cli.SUBCOMMANDS.items() if command.lab]


def names(requirements: list[str]) -> set[str]:
    """The distribution names of requirement strings."""
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in requirements}  # type: ignore[union-attr]


def test_rich_comes_with_the_lab_extra_only() -> None:
    assert "rich" not in names(PROJECT["dependencies"])
    assert names(PROJECT["optional-dependencies"]["lab"]) == set(REQUIRES)
    assert "lab" in PROJECT["optional-dependencies"]["test"][0]


def test_the_lab_commands_are_the_lab_s() -> None:
    assert LAB_COMMANDS == ["cluster", "demo", "bench", "faults"]


@pytest.mark.parametrize("command", LAB_COMMANDS)
def test_a_lab_command_without_the_extra_exits_2_naming_it(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in REQUIRES:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    assert cli.main([command]) == cli.MISUSED
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"agboss-sql {command}: needs the lab extra (rich is not installed): "
        "`pip install '.[lab]'` in a checkout, or "
        "`pip install 'dist/agboss_sql-<version>-py3-none-any.whl[lab]'`\n"
    )


def test_the_library_commands_import_nothing_of_the_lab() -> None:
    script = (
        "import sys\n"
        "from agboss_sql import cli\n"
        "cli.parser()\n"
        "assert cli.main(['history']) == 0\n"
        "lab = sorted(m for m in sys.modules if m.startswith('agboss_sql.lab') or m == 'rich')\n"
        "assert not lab, lab\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_worker_runs_an_app_without_the_lab(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `worker` is the library's: without the lab's modules it still parses, checks its
    # options and says what is missing (here: the app), never the lab extra.
    for name in REQUIRES:
        monkeypatch.setitem(sys.modules, name, None)
    assert cli.main(["worker"]) == cli.MISUSED
    err = capsys.readouterr().err
    assert err.startswith("agboss-sql worker: no app to run: name the Workflows app with --app")
    assert "lab extra" not in err
    with pytest.raises(SystemExit):
        cli.main(["worker", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for option, value in (
        ("--lease-ms", 30000),
        ("--max-concurrent-steps", 8),
        ("--shutdown-ms", 10000),
    ):
        assert re.search(rf"{option} \S+ [^-]*default: {value}\b", help_text), option
