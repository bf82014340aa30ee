"""SQLite 3.35+: the stdlib driver on a dedicated thread, WAL, `BEGIN IMMEDIATE`.

SQLite has no row locks, and SQLAlchemy silently drops `with_for_update()` on
it: every multi-statement atomic step runs in one `BEGIN IMMEDIATE`
transaction, which takes the database's write lock first. `'now'` is stable
within one statement, so the clock expression may be referenced freely.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sq
from sqlalchemy.sql.expression import ColumnElement

NAME = "sqlite"
UPDATE_RETURNING = True
INSERT_RETURNING = True
UPSERT_RETURNING = True
ROW_LOCKS = False
SKIP_LOCKED = False
BEGIN = "BEGIN IMMEDIATE"
ASYNC_DRIVER = "aiosqlite"
BUSY_TIMEOUT_MS = 10_000

insert = sq.insert


def compile_dialect() -> sa.Dialect:
    from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

    return SQLiteDialect_pysqlite(paramstyle="named")


def now_ms() -> ColumnElement[int]:
    # 3.40 has no 'subsec' modifier: julianday('now') carries the milliseconds.
    return sa.cast(
        (sa.func.julianday(sa.literal_column("'now'")) - 2440587.5) * 86400000.0, sa.BigInteger
    )


def now_source(database_time: bool) -> tuple[None, ColumnElement[int]]:
    """No FROM needed: `'now'` is the same for every reference within one statement."""
    if database_time:
        return None, now_ms()
    return None, sa.bindparam("now", type_=sa.BigInteger)


def greatest(*values: Any) -> ColumnElement[Any]:
    return sa.func.max(*values)


def least(*values: Any) -> ColumnElement[Any]:
    return sa.func.min(*values)


def for_update(select: sa.Select[Any]) -> sa.Select[Any]:
    return select  # the step's BEGIN IMMEDIATE holds the write lock already


def skip_locked(select: sa.Select[Any]) -> sa.Select[Any]:
    return select


def insert_if_absent(table: sa.Table, keys: Sequence[str]) -> Any:
    return insert(table).on_conflict_do_nothing(index_elements=list(keys))


# --- the stdlib driver, run on the connection's own thread -----------------------------


def connect_sync(path: str) -> sqlite3.Connection:
    raw = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    raw.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    raw.execute("PRAGMA journal_mode = WAL")
    raw.execute("PRAGMA synchronous = NORMAL")
    raw.execute("PRAGMA foreign_keys = ON")
    return raw


def execute_sync(
    raw: sqlite3.Connection, sql: str, params: Mapping[str, Any]
) -> tuple[list[Any] | None, int]:
    cursor = raw.execute(sql, params)
    try:
        rows = cursor.fetchall() if cursor.description is not None else None
        return rows, cursor.rowcount
    finally:
        cursor.close()


def is_retryable(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", exc)
    if isinstance(orig, sqlite3.OperationalError):
        text = str(orig).lower()
        return "database is locked" in text or "database is busy" in text or "busy" in text
    return False


def is_unique_violation(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", exc)
    return isinstance(orig, sqlite3.IntegrityError) and "UNIQUE" in str(orig)


def is_disconnect(exc: BaseException) -> bool:
    return False
