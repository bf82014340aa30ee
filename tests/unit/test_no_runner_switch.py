"""`SqlConnection` and everything under `agboss_sql/sql/` reach their database through the
runner interface (`_runner.Runner`) only: no module asks which runner it has."""

from __future__ import annotations

import ast
from pathlib import Path

SQL = Path(__file__).resolve().parents[2] / "agboss_sql" / "sql"
RUNNERS = {"InlineRunner", "PoolRunner"}


def runner_switches(source: str) -> list[int]:
    """The lines of `source` that test an object against a runner class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if names & RUNNERS:
                found.append(node.lineno)
    return found


def test_no_module_of_sql_switches_on_its_runner_s_type() -> None:
    switches = {
        str(path.relative_to(SQL)): lines
        for path in sorted(SQL.rglob("*.py"))
        if (lines := runner_switches(path.read_text(encoding="utf-8")))
    }
    assert switches == {}, f"isinstance on a runner type (use the Runner interface): {switches}"


def test_the_check_finds_a_switch() -> None:
    assert runner_switches("if isinstance(r, InlineRunner):\n    pass\n") == [1]
    assert runner_switches("ok = isinstance(r, (_pool_runner.PoolRunner, int))\n") == [1]
    assert runner_switches("isinstance(r, Runner)\n") == []
