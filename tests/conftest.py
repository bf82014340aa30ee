"""Shared pytest configuration: which database the run targets, the fixtures every SQL test
module uses, and the `database` marker on every test that needs the database.

A test needs the database exactly when its fixtures reach `database_url`, so the marker is
set here from the fixture closure, never by hand: `pytest -m "not database"` runs the tier
that needs no database once, and `pytest -m database` runs the rest on each database.

A database server that does not answer on its port stops the run with one line
(`support/server_watch.py`): at the start, or after the first test that fails once it
went away.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Callable

import pytest
from support.nodes import node_url
from support.server_watch import (
    pytest_collection_finish,
    pytest_runtest_logreport,
    pytest_sessionstart,
)

from agboss_sql.lab.database import create_schema, truncate_all
from agboss_sql.sql.connection import SqlConnection

DATABASE_URL_ENV = "AGBOSS_TEST_DATABASE_URL"
DATABASE_FIXTURE = "database_url"

# Hooks, found by name.
__all__ = ["pytest_collection_finish", "pytest_runtest_logreport", "pytest_sessionstart"]


def _env_database_url() -> str | None:
    return os.environ.get(DATABASE_URL_ENV) or None


def _hide_password(url: str) -> str:
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


def pytest_report_header(config: pytest.Config) -> str:
    url = _env_database_url()
    if url is None:
        return f"agboss database: temporary SQLite file ({DATABASE_URL_ENV} not set)"
    return f"agboss database: {_hide_password(url)}"


@pytest.fixture(scope="session", autouse=True)
def _fresh_statement_sets() -> None:
    if os.environ.get("AGBOSS_MUTATION_RUN") == "1":
        # mutmut runs each mutant in a process forked after its clean run: the statement
        # sets built there (shared per dialect, `statements._SHARED`) would be reused, and a
        # statement builder's mutant would never be built. Each session builds them anew.
        from agboss_sql.sql import statements

        for _, compiled, prepared in statements._SHARED.values():
            compiled.clear()
            prepared.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if DATABASE_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.database)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SQLAlchemy URL of the database under test.

    ``AGBOSS_TEST_DATABASE_URL`` when set (tox sets it from ``dialects/<db>/ready.sh``),
    otherwise a fresh SQLite file for this session.
    """
    url = _env_database_url()
    if url is not None:
        return url
    path = tmp_path_factory.mktemp("sqlite") / "agboss_test.sqlite"
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def sql_url(database_url: str) -> str:
    """The database under test, with a fresh schema and the suites' business table
    (created once per session)."""
    create_schema(database_url, drop_first=True)
    return database_url


@pytest.fixture
async def sql(sql_url: str) -> AsyncIterator[SqlConnection]:
    """A connection to an empty schema (every table emptied before the test)."""
    connection = SqlConnection(sql_url)
    await truncate_all(connection)
    yield connection
    await connection.close()


@pytest.fixture
async def new_connection(
    sql: SqlConnection, sql_url: str
) -> AsyncIterator[Callable[[], SqlConnection]]:
    """More connections to the same emptied database (another instance each); closed after."""
    made: list[SqlConnection] = []

    def make() -> SqlConnection:
        # On a cluster (AGBOSS_TEST_DATABASE_URLS), the next instance is on the next node.
        connection = SqlConnection(node_url(sql_url, len(made) + 1))
        made.append(connection)
        return connection

    yield make
    for connection in made:
        await connection.close()
