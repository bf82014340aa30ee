"""The README's quick start, walked as a newcomer walks it.

The shell blocks of README.md marked `<!-- readme-test: quick-start -->` are run in a
directory of their own with no `AGBOSS_DATABASE_URL` (so on the embedded SQLite
default). In the default run the install steps (`python3 -m venv`, `pip install`) are
taken as done by the environment running the tests, whose `agboss-sql` stands for
`.venv/bin/agboss-sql`; the `slow` test runs every line as written, install included,
in a copy of the checkout (it needs the package index).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
README = REPOSITORY / "README.md"
MARK = "<!-- readme-test: quick-start -->"
SCRIPTS = Path(sys.executable).parent
INSTALL_STEP = re.compile(r"^(python3 -m venv \.venv|\.venv/bin/pip install .*)$")


def marked_commands() -> list[str]:
    """Each command of the marked blocks, in order (`a && b` is two commands)."""
    blocks = re.findall(re.escape(MARK) + r"\n```sh\n(.*?)```", README.read_text(), re.S)
    commands: list[str] = []
    for block in blocks:
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.extend(part.strip() for part in line.split(" && "))
    return commands


def readme_demo_output() -> str:
    """The demo output the README shows (the first plain block after the quick start)."""
    after = README.read_text().split(MARK, 1)[1]
    return re.search(r"\n```\n(pod-a  acquired.*?)```", after, re.S).group(1)  # type: ignore[union-attr]


def ids_hidden(text: str) -> str:
    return re.sub(r"\b(tree|order)-[0-9a-f]+", r"\1-<id>", text)


def env_without_database_url() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "AGBOSS_DATABASE_URL"}


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shlex.split(command), capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


def check_outputs(outputs: dict[str, str]) -> None:
    demo = next(out for command, out in outputs.items() if command.endswith("agboss-sql demo"))
    shown = demo.split("\n", 1)[1]  # after `demo on URL`
    assert ids_hidden(shown) == ids_hidden(readme_demo_output())
    check = next(out for command, out in outputs.items() if command.endswith("agboss-sql check"))
    assert check.startswith("database: sqlite:///.agboss/agboss.sqlite\n")
    assert check.rstrip().endswith("\nready")
    leases = next(out for command, out in outputs.items() if " leases" in command)
    assert "taken-over from pod-a@1" in leases and "lost (superseded)" in leases


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    commands = marked_commands()
    installs = [c for c in commands if INSTALL_STEP.match(c)]
    assert installs == ["python3 -m venv .venv", ".venv/bin/pip install -q ."], commands
    env = env_without_database_url()
    outputs: dict[str, str] = {}
    for command in commands:
        if command in installs:
            continue
        assert command.startswith(".venv/bin/agboss-sql "), command
        done = run(command.replace(".venv/bin/", f"{SCRIPTS}/", 1), tmp_path, env)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        outputs[command] = done.stdout
    check_outputs(outputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".agboss"]


@pytest.mark.slow
def test_the_quick_start_runs_with_its_install_in_a_copy_of_the_checkout(
    tmp_path: Path,
) -> None:
    checkout = tmp_path / "agboss-sql"
    shutil.copytree(
        REPOSITORY,
        checkout,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".tox", ".agboss", "__pycache__", "*.egg-info", "build", "dist"
        ),
    )
    env = {k: v for k, v in env_without_database_url().items() if k != "PYTHONPATH"}
    outputs: dict[str, str] = {}
    for command in marked_commands():
        done = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=checkout,
            env=env,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        outputs[command] = done.stdout
    check_outputs(outputs)
