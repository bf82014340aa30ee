"""The project's schema for tests of SQL store sets: create it, drop it, empty it.

Only the project's own tables (`agboss_sql.sql.schema.metadata`); the suites' business
table is `agboss_sql.testing.business`.
"""

from __future__ import annotations

import warnings
from typing import Any

import sqlalchemy as sa

from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import VERSION_TABLE, sync_url
from agboss_sql.sql.schema import metadata


def create_schema(url: str | sa.URL, *, drop_first: bool = False) -> None:
    """Create every table of the project's metadata on `url` (dropped first with
    `drop_first`)."""
    engine = sa.create_engine(sync_url(url))
    try:
        if drop_first:
            metadata.drop_all(engine)
        metadata.create_all(engine)
    finally:
        engine.dispose()


def drop_schema(url: str | sa.URL) -> None:
    """Drop every table of the project's metadata, and its migration version table, from
    `url`."""
    engine = sa.create_engine(sync_url(url))
    try:
        metadata.drop_all(engine)
        with engine.begin() as connection:
            connection.exec_driver_sql(f"DROP TABLE IF EXISTS {VERSION_TABLE}")
    finally:
        engine.dispose()


_DELETES = [sa.delete(table) for table in reversed(metadata.sorted_tables)]


async def truncate_all(connection: SqlConnection) -> None:
    """Delete every row of every table of the project's metadata."""
    for delete in _DELETES:
        await connection.execute(delete)


_MOVED = ("business_metadata", "business_rows", "insert_business_row", "committed_business_rows")


def __getattr__(name: str) -> Any:
    # The business table moved to agboss_sql.testing.business; the old names still resolve.
    if name in (*_MOVED, "_INSERT"):
        from agboss_sql.testing import business

        warnings.warn(
            f"agboss_sql.testing.database.{name} moved to agboss_sql.testing.business",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(business, name)
    raise AttributeError(name)
