"""`INSERT … ON CONFLICT`: the duplicate-key statements of PostgreSQL and SQLite, written once.

SQLAlchemy's PostgreSQL and SQLite inserts take the same `on_conflict_do_nothing`,
`on_conflict_do_update` and `excluded` (the values the insert proposed), so both dialects
build these statements here: each binds an `OnConflict` to its own `insert` and exports its
methods as the dialect's (`base.Dialect`). MySQL/MariaDB's `ON DUPLICATE KEY UPDATE` is its
own (`mysql`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.expression import ColumnElement


class OnConflict:
    """The `ON CONFLICT` statements of a dialect whose insert is `insert(table)`."""

    def __init__(self, insert: Callable[[sa.Table], Any]) -> None:
        self.insert = insert

    def insert_if_absent(self, table: sa.Table, keys: Sequence[str]) -> Any:
        """`INSERT … ON CONFLICT DO NOTHING` on the unique key `keys`: a duplicate inserts
        nothing (no row counted) and raises nothing."""
        return self.insert(table).on_conflict_do_nothing(index_elements=list(keys))

    def upsert(
        self,
        table: sa.Table,
        keys: Sequence[str],
        values: Mapping[str, Any],
        update: Callable[[Any], Mapping[str, Any]],
    ) -> Any:
        """`INSERT values`; on a duplicate of the unique key `keys`, `SET` what `update(new)`
        maps (column name -> expression), where `new` names the values the insert proposed
        (`new.column`). One statement; the duplicate row is locked by it."""
        statement = self.insert(table).values(dict(values))
        return statement.on_conflict_do_update(
            index_elements=list(keys), set_=dict(update(statement.excluded))
        )

    def upsert_where(
        self,
        insert: Any,
        keys: Sequence[str],
        where: Callable[[Any], ColumnElement[bool]],
        update: Callable[[Any], Sequence[tuple[str, Any]]],
        decided_by: str,
    ) -> Any:
        """`insert`; on a duplicate of the unique key `keys`, when `where(new)` holds for the
        existing row, `SET` the assignments `update(new)` (`new` names the proposed values).
        Each expression sees the row as it was; `decided_by` (a per-call nonce column among
        the assignments) tells the caller whether this call wrote the row."""
        new = insert.excluded
        return insert.on_conflict_do_update(
            index_elements=list(keys), set_=dict(update(new)), where=where(new)
        )

    def insert_or_lock(self, insert: Any, keys: Sequence[str], columns: Sequence[Any]) -> Any:
        """`insert … RETURNING columns`; on a duplicate of the unique key `keys`, a no-op
        update (the first key column set to itself) that locks the existing row, unchanged,
        and makes `RETURNING` give it back: one statement answers the row inserted or found
        (`Capabilities.insert_or_lock_returning`)."""
        first = keys[0]
        return insert.on_conflict_do_update(
            index_elements=list(keys), set_={first: insert.table.c[first]}
        ).returning(*columns)

    def returning(self, statement: Any, *columns: Any) -> Any:
        """`statement … RETURNING columns`."""
        return statement.returning(*columns)

    def skip_duplicates(self, statement: Any, keys: Sequence[str]) -> Any:
        """`statement` (this dialect's insert, any number of rows) skipping rows whose unique
        key `keys` is already taken."""
        return statement.on_conflict_do_nothing(index_elements=list(keys))

    def replace_duplicates(
        self, statement: Any, keys: Sequence[str], columns: Sequence[str]
    ) -> Any:
        """`statement` (this dialect's insert) setting `columns` to the proposed values on a
        row whose unique key `keys` is already taken."""
        new = statement.excluded
        return statement.on_conflict_do_update(
            index_elements=list(keys), set_={column: new[column] for column in columns}
        )


__all__ = ["OnConflict"]
