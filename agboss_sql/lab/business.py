"""The business table of the test suites: where a fenced effect's work writes its business
rows in the effect's own transaction, and how the committed rows are read back.

It is not part of the project's schema (the migrations never create it): a suite creates
it beside the schema (`create_business_table`) and empties it before each case
(`empty_business_table`). `BusinessRows(insert=insert_business_row, committed=...)` hands
it to the conformance suite and the explorer.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import sync_url

business_metadata = sa.MetaData()
business_rows = sa.Table(
    "conformance_business_rows",
    business_metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("row", sa.String(255), nullable=False),
)
"""The table the conformance suite's and the explorer's fenced effects write their business
rows to."""


def create_business_table(url: str | sa.URL, *, drop_first: bool = False) -> None:
    """Create the business table on `url` (dropped first with `drop_first`)."""
    engine = sa.create_engine(sync_url(url))
    try:
        if drop_first:
            business_metadata.drop_all(engine)
        business_metadata.create_all(engine)
    finally:
        engine.dispose()


def drop_business_table(url: str | sa.URL) -> None:
    """Drop the business table from `url` (nothing when it is not there)."""
    engine = sa.create_engine(sync_url(url))
    try:
        business_metadata.drop_all(engine)
    finally:
        engine.dispose()


_DELETE = sa.delete(business_rows)
_INSERT = sa.insert(business_rows).values(row=sa.bindparam("row"))
_SELECT = sa.select(business_rows.c.row).order_by(business_rows.c.id)


async def empty_business_table(connection: SqlConnection) -> None:
    """Delete every business row."""
    await connection.execute(_DELETE)


async def insert_business_row(tx: Any, row: str) -> None:
    """Write one business row in a fenced effect's transaction (a SQLAlchemy
    `AsyncConnection`), as an application's work would."""
    await tx.execute(_INSERT, {"row": row})


async def committed_business_rows(connection: SqlConnection) -> list[str]:
    """The business rows that were committed, in insertion order."""
    result = await connection.execute(_SELECT)
    return [r[0] for r in result.rows]
