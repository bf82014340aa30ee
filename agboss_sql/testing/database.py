"""The project's own tables on a test database: created (at the head revision), emptied,
dropped.

`create_project_schema`, `drop_project_schema` and `empty_project_tables` work on
`agboss_sql.sql.schema.metadata` alone and know nothing of any test table: a store
author's suite adds its own business table beside them (the project's suites add theirs
with `agboss_sql.lab.database`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext

from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import VERSION_TABLE, head, sync_url
from agboss_sql.sql.schema import metadata


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


_TABLES = list(reversed(metadata.sorted_tables))  # each table before those it refers to
_DELETES = [sa.delete(table) for table in _TABLES]
_HOLDING = sa.select(*(sa.exists().select_from(table).label(table.name) for table in _TABLES))


async def empty_project_tables(connection: SqlConnection) -> None:
    """Delete every row of every table of the project's metadata.

    Which tables hold a row is asked first, in one statement, and only those are emptied:
    a test writes a few of the tables, and each statement is a round trip to a server."""
    (holding,) = (await connection.execute(_HOLDING)).rows
    for holds_rows, delete in zip(holding, _DELETES, strict=True):
        if holds_rows:
            await connection.execute(delete)


__all__ = [
    "create_project_schema",
    "drop_project_schema",
    "empty_project_tables",
    "sync_url",
]
