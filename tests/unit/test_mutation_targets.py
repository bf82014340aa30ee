"""Every store module has a mutation entry: each module under `agboss_sql/memory/` and
`agboss_sql/sql/` is mutated (`TARGETS` in `tools/mutation/mutants.py`, its file in
pyproject.toml's `[tool.mutmut] only_mutate`, its row in docs/mutation.md's table of every
store module) or is listed in `NOT_MUTATED` with the reason. A new store module fails here
until it has one or the other."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

REPOSITORY = Path(__file__).resolve().parents[2]
DOCS = REPOSITORY / "docs" / "mutation.md"
TABLE_HEADING = "## Every store module"


def _mutants() -> ModuleType:
    path = REPOSITORY / "tools" / "mutation" / "mutants.py"
    spec = importlib.util.spec_from_file_location("mutation_mutants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


MUTANTS = _mutants()


def _path(module: str) -> Path:
    return REPOSITORY / (module.replace(".", "/") + ".py")


def _documented() -> dict[str, str]:
    """The rows of docs/mutation.md's table of every store module: module -> its row."""
    text = DOCS.read_text(encoding="utf-8")
    assert TABLE_HEADING in text, f"docs/mutation.md has no section {TABLE_HEADING!r}"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        found = re.match(r"\|\s*`([\w.]+)`\s*\|", line)
        if found:
            rows[found.group(1)] = line
    return rows


def test_every_store_module_is_mutated_or_has_a_reason() -> None:
    modules = MUTANTS.store_modules(REPOSITORY)
    assert "agboss_sql.sql.pauses" in modules and "agboss_sql.memory.pauses" in modules
    missing = [m for m in modules if m not in MUTANTS.TARGETS and m not in MUTANTS.NOT_MUTATED]
    assert not missing, (
        f"store modules with no mutation entry: {missing}; add each to TARGETS in "
        "tools/mutation/mutants.py (and pyproject.toml's only_mutate, and a row in "
        "docs/mutation.md), or to NOT_MUTATED with the reason it is not mutated"
    )
    both = sorted(set(MUTANTS.TARGETS) & set(MUTANTS.NOT_MUTATED))
    assert not both, f"both mutated and not: {both}"
    gone = sorted(set(MUTANTS.NOT_MUTATED) - set(modules))
    assert not gone, f"NOT_MUTATED names modules that are not there: {gone}"
    empty = sorted(m for m, why in MUTANTS.NOT_MUTATED.items() if not why.strip())
    assert not empty, f"NOT_MUTATED without a reason: {empty}"


def test_every_target_is_mutated_by_mutmut() -> None:
    config = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))
    only = set(config["tool"]["mutmut"]["only_mutate"])
    for module in MUTANTS.TARGETS:
        path = _path(module)
        assert path.exists(), f"TARGETS names {module}, which is not there"
        relative = path.relative_to(REPOSITORY).as_posix()
        assert relative in only, f"{relative} is in TARGETS, not in [tool.mutmut] only_mutate"


def test_every_named_target_function_exists() -> None:
    for module, functions in MUTANTS.TARGETS.items():
        if functions == MUTANTS.EVERY:
            continue
        tree = ast.parse(_path(module).read_text(encoding="utf-8"))
        defined = set()
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        defined.add(f"{node.name}.{item.name}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
        unknown = sorted(set(functions) - defined)
        assert not unknown, f"TARGETS names functions {module} no longer has: {unknown}"


def test_every_target_has_a_row_in_the_docs() -> None:
    rows = _documented()
    missing = [m for m in MUTANTS.TARGETS if m not in rows]
    assert not missing, f"docs/mutation.md ({TABLE_HEADING}) has no row for {missing}"
    unknown = sorted(set(rows) - set(MUTANTS.TARGETS))
    assert not unknown, f"docs/mutation.md has rows for modules not in TARGETS: {unknown}"


def test_a_new_store_module_fails_the_check(tmp_path: Path) -> None:
    for package in MUTANTS.STORE_PACKAGES:
        (tmp_path / package).mkdir(parents=True)
    (tmp_path / "agboss_sql/sql/new_store.py").write_text("", encoding="utf-8")
    modules = MUTANTS.store_modules(tmp_path)
    assert modules == ["agboss_sql.sql.new_store"]
    assert modules[0] not in MUTANTS.TARGETS and modules[0] not in MUTANTS.NOT_MUTATED
