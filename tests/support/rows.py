"""One row in each of a list of tables, its values made from the column types alone: what
a test of a reset writes before it resets, to see every table emptied."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from agboss_sql.sql.migrate import sync_url


def _value(column: sa.Column[Any]) -> Any:
    kind = column.type
    if isinstance(kind, sa.Boolean):
        return False
    if isinstance(kind, sa.Integer | sa.Numeric | sa.Float):
        return 1
    if isinstance(kind, sa.DateTime):
        return datetime.datetime(2026, 1, 1)
    if isinstance(kind, sa.LargeBinary):
        return b"x"
    if isinstance(kind, sa.JSON):
        return {}
    if isinstance(kind, sa.String):
        return "x"
    raise TypeError(f"no test value for {column.table}.{column.name} ({kind!r})")


def fill(url: str, tables: Iterable[sa.Table]) -> None:
    """Leave exactly one row in each table (committed): what earlier tests left there is
    deleted first, by a plain `DELETE` (not the reset under test), so the row's fixed key
    never meets one of theirs."""
    engine = sa.create_engine(sync_url(url), poolclass=sa.NullPool)
    try:
        with engine.begin() as connection:
            for table in tables:
                connection.execute(sa.delete(table))
                row = {column.name: _value(column) for column in table.columns}
                connection.execute(sa.insert(table).values(row))
    finally:
        engine.dispose()


def counts(url: str, tables: Iterable[sa.Table]) -> dict[str, int]:
    """Each table's row count, by name."""
    engine = sa.create_engine(sync_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            return {
                table.name: int(
                    connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
                )
                for table in tables
            }
    finally:
        engine.dispose()
