"""The database a test suite runs on: the project's schema and the suites' business table.

Two parts, composed here:

- the project's own tables (`agboss_sql.sql.schema.metadata`): `create_project_schema`,
  `drop_project_schema`, `empty_project_tables`, which know nothing of any test table;
- the suites' business table (`agboss_sql.testing.business`), which is not part of the
  project's schema.

`create_schema`, `drop_schema` and `truncate_all` do both, as a suite needs them. The
business table's names are importable from here too.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext

from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import VERSION_TABLE, head, sync_url
from agboss_sql.sql.schema import metadata
from agboss_sql.testing.business import (
    _INSERT,
    business_metadata,
    business_rows,
    committed_business_rows,
    create_business_table,
    drop_business_table,
    empty_business_table,
    insert_business_row,
)


def create_project_schema(url: str | sa.URL, *, drop_first: bool = False) -> None:
    """Create every table of the project's metadata on `url` (dropped first with
    `drop_first`), and record the head revision in its version table when none is
    recorded (or, with `drop_first`, in any case): the tables are the head's schema, so
    `Application.start()` accepts the database."""
    engine = sa.create_engine(sync_url(url))
    try:
        if drop_first:
            metadata.drop_all(engine)
        metadata.create_all(engine)
        with engine.begin() as connection:
            _record_head(connection, replace=drop_first)
    finally:
        engine.dispose()


def _record_head(connection: sa.Connection, *, replace: bool) -> None:
    """Record the head revision, unless (without `replace`) a revision is recorded
    already: tables that existed before `create_all` may be an older revision's."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    context._ensure_version_table()
    version = sa.table(VERSION_TABLE, sa.column("version_num"))
    if not replace and connection.execute(sa.select(version.c.version_num)).first():
        return
    connection.execute(sa.delete(version))
    connection.execute(sa.insert(version).values(version_num=head()))


def drop_project_schema(url: str | sa.URL) -> None:
    """Drop every table of the project's metadata, and its migration version table."""
    engine = sa.create_engine(sync_url(url))
    try:
        metadata.drop_all(engine)
        with engine.begin() as connection:
            connection.exec_driver_sql(f"DROP TABLE IF EXISTS {VERSION_TABLE}")
    finally:
        engine.dispose()


_DELETES = [sa.delete(table) for table in reversed(metadata.sorted_tables)]


async def empty_project_tables(connection: SqlConnection) -> None:
    """Delete every row of every table of the project's metadata."""
    for delete in _DELETES:
        await connection.execute(delete)


def create_schema(url: str | sa.URL, *, drop_first: bool = False) -> None:
    """Create the project's schema and the business table on `url`."""
    if drop_first:
        drop_business_table(url)
    create_project_schema(url, drop_first=drop_first)
    create_business_table(url)


def drop_schema(url: str | sa.URL) -> None:
    """Drop the business table and the project's schema (with its version table)."""
    drop_business_table(url)
    drop_project_schema(url)


async def truncate_all(connection: SqlConnection) -> None:
    """Delete every row of every project table and of the business table."""
    await empty_project_tables(connection)
    await empty_business_table(connection)


__all__ = [
    "_INSERT",
    "business_metadata",
    "business_rows",
    "committed_business_rows",
    "create_project_schema",
    "create_schema",
    "drop_project_schema",
    "drop_schema",
    "empty_project_tables",
    "insert_business_row",
    "sync_url",
    "truncate_all",
]
