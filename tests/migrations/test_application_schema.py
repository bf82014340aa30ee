"""`Application.start()` and readiness verify the schema revision: a database that is
unmigrated or behind the head is refused at once, with the command to run."""

from __future__ import annotations

import pytest
from alembic.script import ScriptDirectory
from migration_support import connected

from agboss_sql.application import Application, DatabaseUrl, HealthStatus, sql_stores
from agboss_sql.contracts import ExecutionLeaseRepository, SchemaNotReadyError
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import metadata


def first_revision() -> str:
    scripts = ScriptDirectory(str(migrate.script_location()))
    return [s.revision for s in scripts.walk_revisions()][-1]


def shown(url: str) -> str:
    from agboss_sql.cli import shown as cli_shown

    return cli_shown(url)


async def test_start_refuses_an_unmigrated_database(empty_url: str) -> None:
    app = Application("support", sql_stores(), {DatabaseUrl: DatabaseUrl(empty_url)})

    with pytest.raises(SchemaNotReadyError) as refused:
        await app.start()

    assert refused.value.revision is None and refused.value.head == migrate.head()
    assert f"run `agboss-sql upgrade --url {shown(empty_url)}`" in str(refused.value)
    assert app._owned_connections == []  # closed on the way out
    with pytest.raises(RuntimeError, match="start"):
        app.store(ExecutionLeaseRepository)


async def test_start_refuses_tables_without_a_revision(empty_url: str) -> None:
    with connected(empty_url) as connection, connection.begin():
        metadata.create_all(connection)
    app = Application("support", sql_stores(), {DatabaseUrl: DatabaseUrl(empty_url)})

    with pytest.raises(SchemaNotReadyError, match="agboss-sql stamp"):
        await app.start()


async def test_start_refuses_a_database_behind_head_and_readiness_says_why(
    empty_url: str,
) -> None:
    first, head = first_revision(), migrate.head()
    assert first != head
    migrate.upgrade(empty_url, first)
    values = {DatabaseUrl: DatabaseUrl(empty_url)}

    with pytest.raises(SchemaNotReadyError, match=f"at revision {first}, behind {head}"):
        await Application("support", sql_stores(), values).start()

    async with Application("support", sql_stores(), values, require_schema=False) as app:
        report = await app.check_readiness()
        assert report.status is HealthStatus.DOWN
        (schema,) = [c for c in report.components if c.name.startswith("schema (")]
        assert schema.status is HealthStatus.DOWN
        assert f"at revision {first}, behind {head}" in (schema.error or "")

        migrate.upgrade(empty_url)
        report = await app.check_readiness()
        assert report.status is HealthStatus.UP, report


async def test_start_accepts_a_database_at_head_given_as_a_connection(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    connection = SqlConnection(empty_url)
    try:
        async with Application("support", sql_stores(), {SqlConnection: connection}) as app:
            report = await app.check_readiness()
            assert report.status is HealthStatus.UP
            assert sum(c.name.startswith("schema (") for c in report.components) == 1
    finally:
        await connection.close()


async def test_the_test_kits_schema_records_head_and_never_overwrites_an_older_revision(
    empty_url: str,
) -> None:
    from agboss_sql.lab.database import create_schema, drop_schema

    create_schema(empty_url)
    assert migrate.current(empty_url) == migrate.head()
    async with Application("support", sql_stores(), {DatabaseUrl: DatabaseUrl(empty_url)}):
        pass

    drop_schema(empty_url)
    migrate.upgrade(empty_url, first_revision())
    create_schema(empty_url)  # adds what is missing; the tables may still be the older ones
    assert migrate.current(empty_url) == first_revision()
    create_schema(empty_url, drop_first=True)  # every table made anew: the head's
    assert migrate.current(empty_url) == migrate.head()
