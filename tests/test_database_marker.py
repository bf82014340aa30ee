"""The `database` marker is set from the fixture closure (tests/conftest.py): a test whose
fixtures reach the database is marked, one that needs none is not, so `-m "not database"`
and `-m database` split the suite without a test running twice or never."""

from __future__ import annotations

import pytest

from agboss_sql.sql.connection import SqlConnection


def test_a_test_without_the_database_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("database") is None


async def test_a_test_on_the_database_is_marked(
    request: pytest.FixtureRequest, sql: SqlConnection
) -> None:
    assert request.node.get_closest_marker("database") is not None
    await sql.ping()
