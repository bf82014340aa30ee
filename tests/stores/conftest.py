"""Fixtures for tests that run SQL stores on the database under test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from agboss_sql.sql.connection import SqlConnection
from agboss_sql.testing.database import create_schema, truncate_all


@pytest.fixture(scope="session")
def sql_url(database_url: str) -> str:
    """The database under test, with a fresh schema (created once per session)."""
    create_schema(database_url, drop_first=True)
    return database_url


@pytest.fixture
async def sql(sql_url: str) -> AsyncIterator[SqlConnection]:
    """A connection to an empty schema (every table truncated before the test)."""
    connection = SqlConnection(sql_url)
    await truncate_all(connection)
    yield connection
    await connection.close()


@pytest.fixture
async def new_connection(
    sql: SqlConnection, sql_url: str
) -> AsyncIterator[Callable[[], SqlConnection]]:
    """Make more connections to the same database (as other instances would); closed after."""
    made: list[SqlConnection] = []

    def make() -> SqlConnection:
        connection = SqlConnection(sql_url)
        made.append(connection)
        return connection

    yield make
    for connection in made:
        await connection.close()
