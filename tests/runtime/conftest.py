"""Fixtures of the runtime tests: an in-memory world, and SQL connections for the SQL file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from runtime_support import World

from agboss_sql.sql.connection import SqlConnection
from agboss_sql.testing.database import create_schema, truncate_all


@pytest.fixture
def world() -> World:
    """Instances' in-memory stores on one fresh backend and one virtual clock."""
    return World()


@pytest.fixture(scope="session")
def runtime_sql_url(database_url: str) -> str:
    """The database under test, with a fresh schema (created once per session)."""
    create_schema(database_url, drop_first=True)
    return database_url


@pytest.fixture
async def sql_connection(runtime_sql_url: str) -> AsyncIterator[Callable[[], SqlConnection]]:
    """Make connections (one per instance) to an emptied schema; closed after the test."""
    made: list[SqlConnection] = []

    def make() -> SqlConnection:
        connection = SqlConnection(runtime_sql_url)
        made.append(connection)
        return connection

    await truncate_all(make())
    yield make
    for connection in made:
        await connection.close()
