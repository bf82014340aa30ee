"""SQLite 3.35+: the stdlib driver inline on the event loop's thread, WAL, `BEGIN IMMEDIATE`.

SQLite has no row locks, and SQLAlchemy silently drops `with_for_update()` on
it: every multi-statement atomic step runs in one `BEGIN IMMEDIATE`
transaction, which takes the database's write lock first. `'now'` is stable
within one statement, so the clock expression may be referenced freely.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sq
from sqlalchemy.engine import URL
from sqlalchemy.sql.expression import ColumnElement

from agboss_sql._dialects.base import Capabilities, migration_lock_timeout, wrapped_driver_error
from agboss_sql._dialects.on_conflict import OnConflict
from agboss_sql._timeouts import Timeouts

NAME = "sqlite"
CAPABILITIES = Capabilities(
    inline=True,
    update_returning=True,
    insert_returning=True,
    upsert_where=True,
    row_locks=False,
    skip_locked=False,
    dml_in_with=False,
    json_key_exact=False,
    insert_if_absent_raises=False,
    insert_or_lock_returning=True,
    batch_migrations=True,
)
BEGIN = "BEGIN IMMEDIATE"
ASYNC_DRIVER = "aiosqlite"
# The engine's connections run with no implicit transactions: its BEGIN IMMEDIATE is a
# statement of its own (`SqlConnection`'s begin hook).
DRIVER_SENDS_BEGIN = False

insert = sq.insert
_ON_CONFLICT = OnConflict(insert)
insert_if_absent = _ON_CONFLICT.insert_if_absent
upsert = _ON_CONFLICT.upsert
upsert_where = _ON_CONFLICT.upsert_where
insert_or_lock = _ON_CONFLICT.insert_or_lock
returning = _ON_CONFLICT.returning
skip_duplicates = _ON_CONFLICT.skip_duplicates
replace_duplicates = _ON_CONFLICT.replace_duplicates


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


def for_share(select: sa.Select[Any]) -> sa.Select[Any]:
    """A shared locking read: the rows read stay as read until the transaction ends."""
    return select  # the step's BEGIN IMMEDIATE holds the write lock already


def skip_locked(select: sa.Select[Any]) -> sa.Select[Any]:
    return select


def exact_text(expression: ColumnElement[Any]) -> ColumnElement[Any]:
    """`expression` compared and ordered by its exact characters (code point order): SQLite's
    default BINARY collation already is."""
    return expression


# --- the stdlib driver, run inline on the event loop's thread -----------------------------


def connect_sync(path: str, lock_ms: int) -> sqlite3.Connection:
    """A connection in autocommit mode with WAL and busy timeout 0: the caller waits for the
    write lock itself, with async sleeps, up to its own bound. Opening waits up to `lock_ms`
    for a lock another connection holds (see `_prepare`)."""
    raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
    try:
        _prepare(raw, lock_ms)
    except BaseException:
        raw.close()
        raise
    return raw


def _prepare(raw: sqlite3.Connection, lock_ms: int) -> None:
    """The session settings of every connection. Setting the journal mode reads the database
    header under a lock that another connection can hold for a moment: the last connection
    closing checkpoints the log and deletes it under an exclusive lock. With busy timeout 0
    that moment failed the open ("database is locked") whenever a connection was opened as
    another closed; so the settings wait up to `lock_ms` like any statement, and only then
    the timeout goes to 0 for the caller's own statements."""
    raw.execute(f"PRAGMA busy_timeout = {max(int(lock_ms), 0)}")
    raw.execute("PRAGMA journal_mode = WAL")
    raw.execute("PRAGMA synchronous = NORMAL")
    raw.execute("PRAGMA foreign_keys = ON")
    raw.execute("PRAGMA busy_timeout = 0")


def execute_sync(
    raw: sqlite3.Connection, sql: str, params: Mapping[str, Any] | None
) -> tuple[list[Any] | None, int]:
    cursor = raw.execute(sql) if params is None else raw.execute(sql, params)
    try:
        rows = cursor.fetchall() if cursor.description is not None else None
        return rows, cursor.rowcount
    finally:
        cursor.close()


def is_retryable(exc: BaseException) -> bool:
    """Never: the one conflict SQLite has, a locked database, is waited for (with async
    sleeps) up to the lock bound by the one who met it, and is a lock timeout after that."""
    return False


def is_lock_timeout(exc: BaseException) -> bool:
    """A locked database still locked when the wait for it ended (`Timeouts.lock_ms`)."""
    return is_busy(exc)


def is_statement_timeout(exc: BaseException) -> bool:
    return False


def is_storage_full(exc: BaseException) -> bool:
    """SQLITE_FULL ("database or disk is full") or SQLITE_IOERR: the write did not land."""
    orig = getattr(exc, "orig", exc)
    if not isinstance(orig, sqlite3.Error):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)
    return "disk is full" in str(orig).lower()


def engine_options(url: URL, timeouts: Timeouts) -> dict[str, Any]:
    return {
        "async_creator": inline_aiosqlite_creator(url.database or "", timeouts.lock_ms),
        "pool_timeout": timeouts.pool_ms / 1000,
    }


def is_busy(exc: BaseException) -> bool:
    """The database is locked by another connection's write: nothing was applied."""
    orig = getattr(exc, "orig", exc)
    if not isinstance(orig, sqlite3.OperationalError):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(orig).lower()
    return "database is locked" in text or "database is busy" in text


def driver_error(exc: BaseException) -> BaseException | None:
    return wrapped_driver_error(exc, sqlite3.Error)


def is_unique_violation(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", exc)
    return isinstance(orig, sqlite3.IntegrityError) and "UNIQUE" in str(orig)


def is_disconnect(exc: BaseException) -> bool:
    return False


def is_read_only(exc: BaseException) -> bool:
    """Never: a file SQLite cannot write (SQLITE_READONLY) is no server that may take the
    write later; it stays a refusal (`StoreRefusedError`)."""
    return False


def is_usable(raw: sqlite3.Connection) -> bool:
    """`raw` is outside any transaction (a file has no session to lose)."""
    return not raw.in_transaction


# --- migrations ------------------------------------------------------------------------

SYNC_DRIVER = "pysqlite"
MIGRATION_LOCK_TIMEOUT_S = 600


@contextlib.contextmanager
def lock_database(connection: sa.Connection, lock_ms: int) -> Iterator[None]:
    """Run the body in one `BEGIN IMMEDIATE` transaction on `connection` (a sync
    pysqlite connection with no transaction begun): the database's write lock, held from
    the first statement until commit. Waits up to `MIGRATION_LOCK_TIMEOUT_S` for it; in the
    body, up to `lock_ms` for any other lock (a commit outside WAL waits for readers)."""
    with connection.begin():
        previous = int(connection.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0)
        connection.exec_driver_sql(f"PRAGMA busy_timeout = {MIGRATION_LOCK_TIMEOUT_S * 1000}")
        try:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException as exc:
            connection.exec_driver_sql(f"PRAGMA busy_timeout = {previous}")
            if isinstance(exc, sa.exc.DBAPIError) and is_busy(exc):
                raise migration_lock_timeout(MIGRATION_LOCK_TIMEOUT_S, "the write lock") from exc
            raise
        connection.exec_driver_sql(f"PRAGMA busy_timeout = {int(lock_ms)}")
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                connection.exec_driver_sql(f"PRAGMA busy_timeout = {previous}")


# --- checkpoints: folded writes, duplicate handling, metadata filters -------------------


def json_key_equals(document: Any, index: int) -> ColumnElement[bool]:
    """The JSON object in the text column `document` has key `:meta_key<index>` of JSON type
    `:meta_type<index>` (or `:meta_alt_type<index>`) and, when `:meta_value<index>` is not
    NULL, that value (`json_each` of the top-level keys: no path quoting). Params:
    `json_key_params`."""
    entries = (
        sa.func.json_each(document).table_valued("key", "type", "atom").alias(f"agboss_meta{index}")
    )
    value: sa.BindParameter[Any] = sa.bindparam(f"meta_value{index}")
    return sa.exists(
        sa.select(sa.literal(1))
        .select_from(entries)
        .where(
            entries.c.key == sa.bindparam(f"meta_key{index}", type_=sa.Text),
            entries.c.type.in_(
                [
                    sa.bindparam(f"meta_type{index}", type_=sa.Text),
                    sa.bindparam(f"meta_alt_type{index}", type_=sa.Text),
                ]
            ),
            sa.or_(value.is_(None), entries.c.atom == value),
        )
    )


def json_key_params(index: int, key: str, value: Any) -> dict[str, Any]:
    """The parameters of `json_key_equals(document, index)` for `key` and a JSON value."""
    compared: Any = None
    if value is None:
        kinds = ("null", "null")
    elif isinstance(value, bool):
        kinds = ("true", "true") if value else ("false", "false")
    elif isinstance(value, (int, float)):
        kinds, compared = ("integer", "real"), value
    elif isinstance(value, str):
        kinds, compared = ("text", "text"), value
    elif isinstance(value, dict):
        kinds = ("object", "object")
    else:
        kinds = ("array", "array")
    return {
        f"meta_key{index}": key,
        f"meta_type{index}": kinds[0],
        f"meta_alt_type{index}": kinds[1],
        f"meta_value{index}": compared,
    }


def inline_aiosqlite_creator(path: str, lock_ms: int) -> Any:
    """An `async_creator` for SQLAlchemy's aiosqlite dialect whose connections run each call
    inline on the event loop's thread, instead of one hop per call to aiosqlite's worker
    thread; a call that finds the database locked is retried after an async sleep (the
    connection's busy timeout is 0), so the loop is never blocked waiting for the lock.
    The worker thread still opens and closes the connection."""
    import asyncio
    import random

    import aiosqlite

    class InlineConnection(aiosqlite.Connection):
        async def _execute(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._running or not self._connection:
                raise ValueError("Connection closed")
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not is_busy(exc):
                    raise
            loop = asyncio.get_running_loop()
            deadline = loop.time() + lock_ms / 1000
            delay = 0.0005
            while True:
                await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    if not is_busy(exc) or loop.time() >= deadline:
                        raise
                delay = min(delay * 2, 0.05)

    def connector() -> sqlite3.Connection:
        raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
        try:
            _prepare(raw, lock_ms)
        except BaseException:
            raw.close()
            raise
        return raw

    async def create() -> Any:
        return await InlineConnection(connector, 64)

    return create


def analyze_sql(table: str) -> str:
    """The statement that refreshes the planner's statistics of `table`."""
    return f"ANALYZE {table}"


def truncate_sql(tables: Sequence[str]) -> list[str]:
    """No `TRUNCATE` in SQLite: a `DELETE` without `WHERE` per table, children first (its
    truncate optimisation drops the pages at once)."""
    return [f"DELETE FROM {table}" for table in reversed(tables)]
