"""The migrations without a database: what the revision would run on each dialect
(Alembic's offline `--sql` mode), and how URLs and scripts are found."""

from __future__ import annotations

import io
import itertools
import re
from pathlib import Path

import alembic.command
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable

from agboss_sql.sql import migrate
from agboss_sql.sql.schema import metadata

DIALECT_URLS = {
    "sqlite": "sqlite:///offline.sqlite",
    "postgresql": "postgresql://offline@localhost/offline",
    "mysql": "mysql://offline@localhost/offline",
}


def _statements(sql: str) -> set[str]:
    without_comments = re.sub(r"^--.*$", "", sql, flags=re.MULTILINE)
    return {
        re.sub(r"\s+", " ", statement).strip()
        for statement in without_comments.split(";\n")
        if statement.strip()
    }


_CREATE_TABLE = re.compile(r"^CREATE TABLE (\w+) ")


def _final_statements(sql: str) -> set[str]:
    """`_statements`, but of a table a later revision rebuilds (renames aside, creates anew,
    copies, drops the old) only its last `CREATE TABLE`, and no renames."""
    without_comments = re.sub(r"^--.*$", "", sql, flags=re.MULTILINE)
    ordered = [
        re.sub(r"\s+", " ", statement).strip()
        for statement in without_comments.split(";\n")
        if statement.strip()
    ]
    last = {}
    for position, statement in enumerate(ordered):
        found = _CREATE_TABLE.match(statement)
        if found:
            last[found[1]] = position
    return {
        statement
        for position, statement in enumerate(ordered)
        if not (
            ((found := _CREATE_TABLE.match(statement)) and last[found[1]] != position)
            or re.match(r"^ALTER TABLE \w+ RENAME ", statement)
        )
    }


_ADD_COLUMN = re.compile(r"^ALTER TABLE (\w+) ADD (?:COLUMN )?(\w+) ")
_REKEYED = re.compile(r"^ALTER TABLE (\w+) ADD CONSTRAINT pk_\w+ PRIMARY KEY \((.*)\)$")
_DROP_KEY = re.compile(r"^ALTER TABLE \w+ DROP (?:PRIMARY KEY|CONSTRAINT pk_\w+)$")
_REBUILT = re.compile(r"^CREATE TABLE _alembic_tmp_(\w+) ")
_RENAMED = re.compile(r"^ALTER TABLE _alembic_tmp_\w+ RENAME TO \w+$")
_PK = re.compile(r"CONSTRAINT (pk_\w+) PRIMARY KEY \([^)]*\)")
_MODIFIED = re.compile(r"^ALTER TABLE (\w+) MODIFY COLUMN (\w+) (.+)$")
_ALTERED_TYPES = re.compile(r"^ALTER TABLE (\w+) (ALTER COLUMN \w+ TYPE .+)$")
_ALTERED_TYPE = re.compile(r"ALTER COLUMN (\w+) TYPE ([^,]+)")


def _retyped(statements: set[str]) -> set[str]:
    """`statements` with each column a later revision retypes in place (MySQL's
    `MODIFY COLUMN`, its whole definition; PostgreSQL's `ALTER COLUMN … TYPE`, its type,
    nullability kept) given its final definition in its table's `CREATE TABLE`."""
    for statement in sorted(statements):
        changes: list[tuple[str, str, str]] = []  # (column, pattern of the old, the new)
        if found := _MODIFIED.match(statement):
            table, column, definition = found.groups()
            changes.append((column, r"[^,]+", definition))
        elif found := _ALTERED_TYPES.match(statement):
            table = found[1]
            for column, column_type in _ALTERED_TYPE.findall(found[2]):
                changes.append((column, r"[^,]+?(?=(?: NOT NULL)?(?:,| \)))", column_type))
        else:
            continue
        statements.discard(statement)
        create = next(s for s in statements if s.startswith(f"CREATE TABLE {table} ("))
        statements.discard(create)
        for column, old, new in changes:
            create = re.sub(rf"([(,] ){column} {old}", rf"\g<1>{column} {new}", create, count=1)
        statements.add(create)
    return statements


def _without(table: sa.Table, names: set[str]) -> sa.Table:
    """The table as first created: without the columns a later revision added."""
    copy = sa.MetaData(naming_convention=table.metadata.naming_convention)
    return sa.Table(table.name, copy, *(c._copy() for c in table.columns if c.name not in names))


@pytest.mark.parametrize("dialect", sorted(DIALECT_URLS))
def test_the_revisions_create_exactly_the_schema(dialect: str) -> None:
    """Every table as created plus every column added later, and every index, are the
    schema's: no more, no less."""
    url = DIALECT_URLS[dialect]
    config = migrate.alembic_config(url)
    config.output_buffer = io.StringIO()

    alembic.command.upgrade(config, "head", sql=True)

    compiler = migrate.sync_url(url).get_dialect()()
    ran = _retyped(_final_statements(config.output_buffer.getvalue()))
    # A table re-keyed by a later revision: in place (PostgreSQL, MySQL: drop the primary key,
    # add the new one) or rebuilt under a temporary name (SQLite). Its new key must be the
    # schema's; its first CREATE TABLE is compared without its key (rebuilt: not at all, the
    # rebuilt table is the schema's whole).
    rekeyed: dict[str, list[str]] = {}
    rebuilt: set[str] = set()
    for statement in list(ran):
        if found := _REKEYED.match(statement):
            rekeyed[found[1]] = [c.strip(' "`') for c in found[2].split(",")]
            ran.discard(statement)
        elif _DROP_KEY.match(statement) or _RENAMED.match(statement):
            ran.discard(statement)
        elif found := _REBUILT.match(statement):
            rebuilt.add(found[1])
    for name, columns in rekeyed.items():
        assert columns == [c.name for c in metadata.tables[name].primary_key.columns], name
    ran = {
        statement
        for statement in ran
        if not any(statement.startswith(f"CREATE TABLE {name} (") for name in rebuilt)
    }

    def unkeyed(statement: str) -> str:
        """A re-keyed table's first CREATE TABLE, without its key."""
        if any(statement.startswith(f"CREATE TABLE {name} (") for name in rekeyed):
            return _PK.sub(r"CONSTRAINT \1 PRIMARY KEY (...)", statement)
        return statement

    ran = {unkeyed(s) for s in ran}
    added: dict[str, set[str]] = {}
    for statement in ran:
        found = _ADD_COLUMN.match(statement)
        if found:
            added.setdefault(found[1], set()).add(found[2])
    expected = (
        {
            str(
                CreateTable(_without(table, added.get(table.name, set()))).compile(dialect=compiler)
            )
            for table in metadata.sorted_tables
            if table.name not in rebuilt
        }
        | {
            str(CreateTable(table).compile(dialect=compiler)).replace(
                f"CREATE TABLE {table.name} (", f"CREATE TABLE _alembic_tmp_{table.name} (", 1
            )
            for table in metadata.sorted_tables
            if table.name in rebuilt
        }
        | {
            str(CreateIndex(index).compile(dialect=compiler))
            for table in metadata.sorted_tables
            for index in table.indexes
        }
        | {
            f"ALTER TABLE {table} ADD COLUMN "
            + str(CreateColumn(metadata.tables[table].c[name]).compile(dialect=compiler))
            for table, names in added.items()
            for name in names
        }
    )
    created = {
        s
        for s in ran
        if s.startswith(("CREATE TABLE", "CREATE INDEX", "CREATE UNIQUE", "ALTER TABLE"))
    }
    version_table = f"CREATE TABLE {migrate.VERSION_TABLE} "
    assert {s for s in created if not s.startswith(version_table)} == {
        unkeyed(s) for s in _statements(";\n".join(expected))
    }


def test_the_revisions_are_one_line_from_0001() -> None:
    scripts = ScriptDirectory(str(migrate.script_location()))
    revisions = list(reversed(list(scripts.walk_revisions())))

    assert revisions[0].revision == "0001" and revisions[0].down_revision is None
    for before, after in itertools.pairwise(revisions):
        assert after.down_revision == before.revision
    assert revisions[-1].revision == migrate.head()


def test_the_scripts_are_the_packaged_copy_else_the_checkouts() -> None:
    package = Path(migrate.__file__).resolve().parent.parent
    packaged, checkout = package / "_alembic", package.parent / "alembic"

    location = migrate.script_location()

    assert location == (packaged if packaged.is_dir() else checkout)
    assert (location / "env.py").is_file()
    assert any((location / "versions").glob("*.py"))


def test_the_url_is_the_given_one_then_the_environment_then_local_sqlite(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(migrate.DATABASE_URL_ENV, raising=False)
    assert migrate.resolve_url(None) == "sqlite:///.agboss/agboss.sqlite"

    monkeypatch.setenv(migrate.DATABASE_URL_ENV, "postgresql://env@host/db")
    assert migrate.resolve_url(None) == "postgresql://env@host/db"
    assert migrate.resolve_url("mysql://given@host/db") == "mysql://given@host/db"


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u:p%25w@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
        ("mysql://u@h/db", "mysql+pymysql"),
        ("mysql+aiomysql://u@h/db", "mysql+pymysql"),
        ("mariadb://u@h/db", "mysql+pymysql"),
        ("sqlite:///a.sqlite", "sqlite+pysqlite"),
        ("sqlite+aiosqlite:///a.sqlite", "sqlite+pysqlite"),
    ],
)
def test_migrations_run_on_the_synchronous_driver(url: str, driver: str) -> None:
    converted = migrate.sync_url(url)

    assert converted.drivername == driver
    assert converted.database in ("db", "a.sqlite")


def test_a_password_with_percent_survives_the_alembic_config() -> None:
    config = migrate.alembic_config("postgresql://u:p%25w@h/db")

    assert config.get_main_option("sqlalchemy.url") == "postgresql://u:p%25w@h/db"
