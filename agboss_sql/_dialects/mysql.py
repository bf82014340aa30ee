"""MySQL 8.0+ and MariaDB 10.6+: aiomysql on PyMySQL, `ON DUPLICATE KEY UPDATE`, row locks.

No `UPDATE … RETURNING` anywhere; MySQL 8 has no `RETURNING` at all, MariaDB
accepts it only on `INSERT`. No `WHERE` on the upsert: a conditional take is
`col = IF(cond, new, col)` per column, assignments running left to right.
Connections set `CLIENT.FOUND_ROWS`, so an `UPDATE` counts the rows it matched,
not only the rows whose values changed: compare-and-set reads "one row".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql as my
from sqlalchemy.engine import URL
from sqlalchemy.sql.expression import ColumnElement

NAME = "mysql"
UPDATE_RETURNING = False
INSERT_RETURNING = False  # MariaDB has it, MySQL 8 does not: code for both goes without
UPSERT_RETURNING = False
ROW_LOCKS = True
SKIP_LOCKED = True
BEGIN = "BEGIN"
ASYNC_DRIVER = "aiomysql"

insert = my.insert


def compile_dialect() -> sa.Dialect:
    from sqlalchemy.dialects.mysql.aiomysql import MySQLDialect_aiomysql

    return MySQLDialect_aiomysql(paramstyle="pyformat")


def now_ms() -> ColumnElement[int]:
    """The database clock in ms (`SYSDATE(6)`: the time of execution, not of the statement's
    start). It is read anew at each reference: use `now_source` to read it once."""
    return sa.cast(
        sa.func.floor(sa.func.unix_timestamp(sa.literal_column("SYSDATE(6)")) * 1000),
        sa.BigInteger,
    )


def now_source(database_time: bool) -> tuple[sa.Subquery, ColumnElement[int]]:
    """A one-row derived table holding the statement's time, read once (`LIMIT 1` keeps the
    derived table from being merged into the outer statement and re-evaluated)."""
    value = (
        now_ms()
        if database_time
        else sa.cast(sa.bindparam("now", type_=sa.BigInteger), sa.BigInteger)
    )
    sub = sa.select(value.label("now")).limit(1).subquery("agboss_now")
    return sub, sub.c.now


def greatest(*values: Any) -> ColumnElement[Any]:
    return sa.func.greatest(*values)


def least(*values: Any) -> ColumnElement[Any]:
    return sa.func.least(*values)


def for_update(select: sa.Select[Any]) -> sa.Select[Any]:
    return select.with_for_update()


def skip_locked(select: sa.Select[Any]) -> sa.Select[Any]:
    return select.with_for_update(skip_locked=True)


def insert_if_absent(table: sa.Table, keys: Sequence[str]) -> Any:
    """A plain insert: a duplicate key raises (`is_unique_violation`), which the caller reads
    as "already there". (`INSERT IGNORE` would warn, and turn other errors into warnings.)"""
    return insert(table)


INSERT_IF_ABSENT_RAISES = True


# --- the raw async driver -------------------------------------------------------------


async def connect(url: URL) -> Any:
    import aiomysql
    from pymysql.constants import CLIENT

    return await aiomysql.connect(
        host=url.host or "localhost",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        db=url.database,
        autocommit=True,
        charset="utf8mb4",
        client_flag=CLIENT.FOUND_ROWS,
    )


_quiet_cursor: Any = None


def _cursor_class() -> Any:
    """aiomysql's cursor sends `SHOW WARNINGS` after any statement that warned: a hidden round
    trip. Ours reads no warnings (statements are validated before they are sent)."""
    global _quiet_cursor
    if _quiet_cursor is None:
        import aiomysql

        class QuietCursor(aiomysql.Cursor):  # type: ignore[misc]
            async def _show_warnings(self, conn: Any) -> None:
                return None

        _quiet_cursor = QuietCursor
    return _quiet_cursor


async def execute(raw: Any, sql: str, params: Mapping[str, Any]) -> tuple[list[Any] | None, int]:
    cursor = await raw.cursor(_cursor_class())
    try:
        count = await cursor.execute(sql, params or None)
        rows = list(await cursor.fetchall()) if cursor.description is not None else None
        return rows, count
    finally:
        await cursor.close()


async def run_text(raw: Any, sql: str) -> None:
    cursor = await raw.cursor()
    try:
        await cursor.execute(sql)
    finally:
        await cursor.close()


async def close(raw: Any) -> None:
    raw.close()


_RETRYABLE = {1213, 1205, 1020}  # deadlock, lock wait timeout, record changed since last read


def _code(exc: BaseException) -> int | None:
    for candidate in (exc, getattr(exc, "orig", None)):
        args = getattr(candidate, "args", None)
        if args and isinstance(args[0], int):
            return args[0]
    return None


def is_retryable(exc: BaseException) -> bool:
    return _code(exc) in _RETRYABLE


def is_unique_violation(exc: BaseException) -> bool:
    return _code(exc) == 1062


def is_disconnect(exc: BaseException) -> bool:
    code = _code(exc)
    return code in (2003, 2006, 2013, 2055) or isinstance(exc, ConnectionError)
