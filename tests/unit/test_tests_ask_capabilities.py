"""The tests ask what the database under test can do, never which one it is.

A comparison with a database's name (`== "postgresql"`, `in ("mysql", ...)`,
`url.startswith("sqlite")`, `dialect_name == ...`) outside `tests/support/` fails here:
ask a helper of `support.capabilities` (or `support.sql`, `support.drivers` for each
server's own SQL and driver errors) instead. An `assert` of a name is no branch (a label
checked: a store's backend, a URL's driver) and passes; the other uses left are listed in
`ALLOWED`, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
NAMES = {"sqlite", "postgresql", "postgres", "mysql", "mariadb"}
NAMING = {"dialect_name", "drivername", "NAME", "get_backend_name"}
"""Attributes and methods whose value is a database's (or driver's) name."""

ALLOWED: dict[tuple[str, str], str] = {
    (
        "migrations/test_migration_lock_wait.py",
        'if connection.dialect.name == "postgresql":',
    ): "a session's bounds on lock waits are read in each server's own variables",
    (
        "migrations/test_checkpoint_id_order_migration.py",
        'if url.get_backend_name() != "postgresql":',
    ): "a database whose default collation is ICU's is made with PostgreSQL's own DDL",
    (
        "checkpoint/test_import.py",
        'if url.get_backend_name() != "postgresql":',
    ): "the official PostgresSaver, imported from there, runs on PostgreSQL alone",
    (
        "stores/test_mysql_failover.py",
        'if url.get_backend_name() not in ("mysql", "mariadb"):',
    ): "a URL's failover alternates are read by the MySQL/MariaDB dialect alone",
    (
        "stores/test_mysql_literals.py",
        'if url.get_backend_name() not in ("mysql", "mariadb"):',
    ): "only the MySQL/MariaDB drivers send parameters written into the statement's text",
    (
        "stores/test_sync_failover.py",
        'if server.get_backend_name() == "postgresql":',
    ): "a URL names its servers each database's way (libpq's ?host= list, MySQL's failover)",
    (
        "cli/test_check_replication.py",
        'if backend != "postgresql":',
    ): "check's replication line and --require-sync read PostgreSQL's streaming replication",
    (
        "stores/test_read_only_server.py",
        'if sa.make_url(database_url).get_backend_name() != "postgresql":',
    ): "the database is made read-only by PostgreSQL's default_transaction_read_only",
    (
        "stores/test_sql_claim_conflicts.py",
        'self.sql = _POSTGRESQL if sql.dialect_name == "postgresql" else _MYSQL',
    ): "the fault trigger's DDL is each server's own language, picked in this one place",
    (
        "checkpoint/test_storage.py",
        'if sql.dialect_name == "sqlite":',
    ): "reads SQLite's EXPLAIN QUERY PLAN rows: each database's plan is its own format",
    (
        "checkpoint/test_storage.py",
        'elif sql.dialect_name == "postgresql":',
    ): "reads PostgreSQL's EXPLAIN text: each database's plan is its own format",
    (
        "test_readme.py",
        'script = "postgresql" if backend == "postgresql" else "mysql"',
    ): "picks the README's ready script (dialects/<db>/ready.sh) for the server under test",
    (
        "test_readme.py",
        'prefix = "AGBOSS_PG" if script == "postgresql" else "AGBOSS_MYSQL"',
    ): "the ready script's environment variables",
    (
        "test_readme.py",
        'f"{prefix}_PORT": str(url.port or (5432 if script == "postgresql" else 3306)),',
    ): "the ready script's default port",
    (
        "langgraph_suite/agboss_checkpointer.py",
        'return _sqlite_url() if database == "sqlite" else _server_url(database)',
    ): "the URL of the database LangGraph's suite names by its fixture's label",
    (
        "unit/test_store_constructors.py",
        'if request.param == "sqlite":',
    ): "a parametrization label: the URL each constructor test builds",
}


def _is_a_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES


def _names_a_database(node: ast.expr) -> bool:
    """A database's name, or a collection of names (`in ("mysql", "mariadb")`)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_a_name(item) for item in node.elts)
    return _is_a_name(node)


def _reads_a_name(node: ast.expr) -> bool:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        if node.attr in NAMING:
            return True
        # A SQLAlchemy dialect's name (`connection.dialect.name`).
        return (
            node.attr == "name"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "dialect"
        )
    return False


def _asserted(tree: ast.AST) -> set[int]:
    """The ids of the comparisons an `assert` checks (alone or joined by `and`)."""
    checked: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            test = node.test
            parts = test.values if isinstance(test, ast.BoolOp) else [test]
            checked.update(id(part) for part in parts if isinstance(part, ast.Compare))
    return checked


def _comparisons(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    asserted = _asserted(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and id(node) not in asserted:
            operands = [node.left, *node.comparators]
            if any(_names_a_database(o) or _reads_a_name(o) for o in operands):
                found.append(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and any(_names_a_database(arg) for arg in node.args)
        ):
            found.append(node)
    return found


def _found() -> dict[tuple[str, str], int]:
    """(module, stripped source line) of each comparison with a database's name."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(TESTS).as_posix()
        if relative.startswith("support/"):
            continue
        source = path.read_text()
        lines = source.splitlines()
        for node in _comparisons(ast.parse(source, filename=str(path))):
            found[(relative, lines[node.lineno - 1].strip())] = node.lineno
    return found


def test_tests_ask_capabilities_not_names() -> None:
    found = _found()
    asking = [
        f"tests/{module}:{lineno}: {line}"
        for (module, line), lineno in found.items()
        if (module, line) not in ALLOWED
    ]
    assert not asking, (
        "these tests branch on a database's name; ask support.capabilities (what the "
        "database can do) instead, or list the use in ALLOWED with its reason:\n"
        + "\n".join(asking)
    )


def test_every_allowed_use_is_still_there() -> None:
    stale = sorted(f"tests/{m}: {line}" for (m, line) in ALLOWED.keys() - _found().keys())
    assert not stale, "ALLOWED lists uses no test has any more:\n" + "\n".join(stale)


def test_the_check_sees_each_form_of_asking_a_name() -> None:
    asking = """
if sql.dialect_name == "postgresql": pass
if backend in ("mysql", "mariadb"): pass
if url.startswith("sqlite"): pass
if make_url(url).get_backend_name() != name: pass
if connection.dialect.name == name: pass
"""
    assert len(_comparisons(ast.parse(asking))) == 5
    fine = """
if update_returning(sql): pass
x = {"sqlite": 1}[kind]
pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
if request.param == "mysql8": pass
assert store.backend == "sqlite"
assert ok and sql.dialect_name == "mysql"
"""
    assert _comparisons(ast.parse(fine)) == []
