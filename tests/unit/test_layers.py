"""The layers of the package (docs/architecture.md), as import-linter checks them in
`tox -e lint`: the real tree keeps every contract in pyproject.toml, and a module that
imports upwards, or two that import each other, break them.

A broken tree is a copy of the package with fixture modules added (`layers/`), checked
with the same configuration: the contracts are proven to bite, not only to pass."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "layers"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

LAYERS = "Each layer imports only the layers below it"
NO_LAB = "The library never imports the lab or the command line, directly or not"
ACYCLIC = "No import cycles between the modules or packages of one package"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the package under `root`, with the repository's contracts."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the test extra (import-linter)")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(REPOSITORY / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )


def copy_of_the_package(tmp_path: Path, extra: dict[str, str]) -> Path:
    """A copy of `agboss_sql/` under `tmp_path`, with each fixture of `extra` (its name
    under `layers/`) added at the path it maps to."""
    shutil.copytree(
        REPOSITORY / "agboss_sql",
        tmp_path / "agboss_sql",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for fixture, target in extra.items():
        shutil.copy(FIXTURES / fixture, tmp_path / target)
    return tmp_path


def verdicts(output: str) -> dict[str, str]:
    """Each contract's verdict in `lint-imports` output: `KEPT` or `BROKEN`."""
    found = {}
    for line in output.splitlines():
        for name in (LAYERS, NO_LAB, ACYCLIC):
            verdict = line.removeprefix(f"{name} ").split(" ", 1)[0]
            if line.startswith(f"{name} ") and verdict in ("KEPT", "BROKEN"):
                found[name] = verdict
    return found


def test_the_tree_keeps_every_contract() -> None:
    done = lint_imports(REPOSITORY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == {LAYERS: "KEPT", NO_LAB: "KEPT", ACYCLIC: "KEPT"}


def test_an_upward_import_breaks_the_layers_and_the_lab_ban(tmp_path: Path) -> None:
    root = copy_of_the_package(tmp_path, {"upward_import.py": "agboss_sql/sql/upward_import.py"})
    done = lint_imports(root)
    assert done.returncode != 0, done.stdout
    found = verdicts(done.stdout)
    # The SQL stores and the lab importing each other is a cycle of agboss_sql's too.
    assert found == {LAYERS: "BROKEN", NO_LAB: "BROKEN", ACYCLIC: "BROKEN"}
    assert "agboss_sql.sql.upward_import -> agboss_sql.lab.cluster" in done.stdout


def test_an_import_cycle_breaks_the_acyclic_contract(tmp_path: Path) -> None:
    root = copy_of_the_package(
        tmp_path,
        {
            "cycle_a.py": "agboss_sql/memory/cycle_a.py",
            "cycle_b.py": "agboss_sql/memory/cycle_b.py",
        },
    )
    done = lint_imports(root)
    assert done.returncode != 0, done.stdout
    assert verdicts(done.stdout) == {LAYERS: "KEPT", NO_LAB: "KEPT", ACYCLIC: "BROKEN"}
    assert "No cycles are allowed in agboss_sql.memory." in done.stdout


def test_the_package_root_imports_nothing_of_the_lab() -> None:
    # `agboss_sql/__init__.py` is in no layer: its own imports are checked here.
    import grimp

    graph = grimp.build_graph("agboss_sql", cache_dir=None)
    imported = graph.find_modules_directly_imported_by("agboss_sql")
    assert imported, "the package root imports the library's public names"
    assert not {m for m in imported if m.startswith(("agboss_sql.lab", "agboss_sql.cli"))}
