"""The database the project's own suites and the lab run on: the project's schema
(`agboss_sql.testing.database`) plus the business table (`agboss_sql.lab.business`).

`create_schema`, `drop_schema` and `truncate_all` do both, as a suite needs them; the
business table's names are importable from here too.
"""

from __future__ import annotations

import sqlalchemy as sa

from agboss_sql.lab.business import (
    business_metadata,
    business_rows,
    committed_business_rows,
    create_business_table,
    drop_business_table,
    empty_business_table,
    insert_business_row,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.testing.database import (
    create_project_schema,
    drop_project_schema,
    empty_project_tables,
    sync_url,
)


def create_schema(url: str | sa.URL, *, drop_first: bool = False) -> None:
    """Create the project's schema (at the head revision) and the business table on `url`
    (both dropped first with `drop_first`)."""
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
