"""The migrations without a database: what the revision would run on each dialect
(Alembic's offline `--sql` mode), and how URLs and scripts are found."""

from __future__ import annotations

import io
import re
from pathlib import Path

import alembic.command
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy.schema import CreateIndex, CreateTable

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


@pytest.mark.parametrize("dialect", sorted(DIALECT_URLS))
def test_the_revision_creates_exactly_the_schema(dialect: str) -> None:
    url = DIALECT_URLS[dialect]
    config = migrate.alembic_config(url)
    config.output_buffer = io.StringIO()

    alembic.command.upgrade(config, "head", sql=True)

    compiler = migrate.sync_url(url).get_dialect()()
    expected = {
        str(CreateTable(table).compile(dialect=compiler)) for table in metadata.sorted_tables
    } | {
        str(CreateIndex(index).compile(dialect=compiler))
        for table in metadata.sorted_tables
        for index in table.indexes
    }
    ran = _statements(config.output_buffer.getvalue())
    created = {s for s in ran if s.startswith(("CREATE TABLE", "CREATE INDEX", "CREATE UNIQUE"))}
    version_table = f"CREATE TABLE {migrate.VERSION_TABLE} "
    assert {s for s in created if not s.startswith(version_table)} == _statements(
        ";\n".join(expected)
    )


def test_there_is_one_revision_until_the_first_release() -> None:
    scripts = ScriptDirectory(str(migrate.script_location()))
    revisions = list(scripts.walk_revisions())

    assert [r.revision for r in revisions] == [migrate.head()]
    assert revisions[0].down_revision is None


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
