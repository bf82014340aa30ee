"""Database helpers for tests of SQL store sets: schema, reset, a business table."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import sync_url
from agboss_sql.sql.schema import metadata

business_metadata = sa.MetaData()
business_rows = sa.Table(
    "conformance_business_rows",
    business_metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("row", sa.String(255), nullable=False),
)
"""The table the conformance and fault suites' fenced effects write their business rows to.
It is not part of the project's schema (the migrations never create it)."""


def create_schema(url: str | sa.URL, *, drop_first: bool = False) -> None:
    """Create every table of the project's metadata (and the business table) on `url`."""
    engine = sa.create_engine(sync_url(url))
    try:
        if drop_first:
            business_metadata.drop_all(engine)
            metadata.drop_all(engine)
        metadata.create_all(engine)
        business_metadata.create_all(engine)
    finally:
        engine.dispose()


def drop_schema(url: str | sa.URL) -> None:
    """Drop every table of the project's metadata (and the business table) from `url`."""
    engine = sa.create_engine(sync_url(url))
    try:
        business_metadata.drop_all(engine)
        metadata.drop_all(engine)
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP TABLE IF EXISTS agboss_alembic_version")
    finally:
        engine.dispose()


_TABLES = [*metadata.sorted_tables, *business_metadata.sorted_tables]


async def truncate_all(connection: SqlConnection) -> None:
    """Delete every row of every store table (and of the business table)."""
    for table in reversed(_TABLES):
        if table.name in metadata.tables or table.name in business_metadata.tables:
            await connection.execute(_delete_all(table))


_DELETES: dict[str, Any] = {}


def _delete_all(table: sa.Table) -> Any:
    found = _DELETES.get(table.name)
    if found is None:
        found = _DELETES[table.name] = sa.delete(table)
    return found


_INSERT = sa.insert(business_rows).values(row=sa.bindparam("row"))
_SELECT = sa.select(business_rows.c.row).order_by(business_rows.c.id)


async def insert_business_row(tx: Any, row: str) -> None:
    """Write one business row in a fenced effect's transaction (a SQLAlchemy
    `AsyncConnection`), as an application's work would."""
    await tx.execute(_INSERT, {"row": row})


async def committed_business_rows(connection: SqlConnection) -> list[str]:
    """The business rows that were committed, in insertion order."""
    result = await connection.execute(_SELECT)
    return [r[0] for r in result.rows]
