"""PostgreSQL: psycopg 3 (async), `ON CONFLICT`, `RETURNING`, row locks, `SKIP LOCKED`."""

from __future__ import annotations

import contextlib
import json
import select
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import URL
from sqlalchemy.sql.expression import ColumnElement

from agboss_sql._dialects import _pg_pooling
from agboss_sql._dialects._pg_hosts import libpq_hosts
from agboss_sql._dialects._pg_prepare import prepare
from agboss_sql._dialects.base import Capabilities, migration_lock_timeout, wrapped_driver_error
from agboss_sql._dialects.on_conflict import OnConflict
from agboss_sql._timeouts import Timeouts

NAME = "postgresql"
CAPABILITIES = Capabilities(
    inline=False,
    update_returning=True,
    insert_returning=True,
    upsert_where=True,
    row_locks=True,
    skip_locked=True,
    dml_in_with=True,
    json_key_exact=True,
    insert_if_absent_raises=False,
    insert_or_lock_returning=True,
    batch_migrations=False,
    shared_with=True,
    notifications=True,
)
BEGIN = "BEGIN"
ASYNC_DRIVER = "psycopg"
DRIVER_SENDS_BEGIN = True  # psycopg outside autocommit, before a transaction's first statement

insert = pg.insert
_ON_CONFLICT = OnConflict(insert)
insert_if_absent = _ON_CONFLICT.insert_if_absent
upsert = _ON_CONFLICT.upsert
upsert_where = _ON_CONFLICT.upsert_where
insert_or_lock = _ON_CONFLICT.insert_or_lock
returning = _ON_CONFLICT.returning
skip_duplicates = _ON_CONFLICT.skip_duplicates
replace_duplicates = _ON_CONFLICT.replace_duplicates


def compile_dialect() -> sa.Dialect:
    from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg

    return PGDialectAsync_psycopg(paramstyle="pyformat")  # type: ignore[no-untyped-call]


def now_ms() -> ColumnElement[int]:
    """The database clock in ms. `clock_timestamp()` is volatile: reference it once per
    statement (through `now_source`), never in several places."""
    return sa.cast(
        sa.func.floor(sa.extract("epoch", sa.func.clock_timestamp()) * 1000), sa.BigInteger
    )


def now_source(database_time: bool) -> tuple[sa.CTE, ColumnElement[int]]:
    """A one-row CTE holding the statement's time, read once: the database clock or `:now`."""
    value = (
        now_ms()
        if database_time
        else sa.cast(sa.bindparam("now", type_=sa.BigInteger), sa.BigInteger)
    )
    cte = sa.select(value.label("now")).cte("agboss_now")
    return cte, cte.c.now


def greatest(*values: Any) -> ColumnElement[Any]:
    return sa.func.greatest(*values)


def least(*values: Any) -> ColumnElement[Any]:
    return sa.func.least(*values)


def for_update(select: sa.Select[Any]) -> sa.Select[Any]:
    return select.with_for_update()


def for_share(select: sa.Select[Any]) -> sa.Select[Any]:
    """A shared locking read: the rows read stay as read until the transaction ends."""
    return select.with_for_update(read=True)


def skip_locked(select: sa.Select[Any]) -> sa.Select[Any]:
    return select.with_for_update(skip_locked=True)


def exact_text(expression: ColumnElement[Any]) -> ColumnElement[Any]:
    """`expression` compared and ordered by its exact characters (code point order), whatever
    the database's collation: `COLLATE "C"` (UTF-8 byte order is code point order)."""
    return sa.collate(expression, "C")


# --- the raw async driver -------------------------------------------------------------


def session_options(timeouts: Timeouts) -> dict[str, Any]:
    """libpq parameters that bound a session's waits, sent in the startup packet (no extra
    round trip): statement and lock timeouts, a transaction left idle (a frozen client's
    row locks end with its session), and TCP keepalives."""
    idle_ms = max(timeouts.statement_ms, timeouts.lock_ms)
    return {
        # libpq's connect_timeout is whole seconds, at least 2; the caller bounds it exactly.
        "connect_timeout": max(2, -(-timeouts.connect_ms // 1000)),
        "options": (
            f"-c statement_timeout={timeouts.statement_ms} -c lock_timeout={timeouts.lock_ms} "
            f"-c idle_in_transaction_session_timeout={idle_ms}"
        ),
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }


def conninfo(url: URL, timeouts: Timeouts) -> dict[str, Any]:
    """The keyword arguments of psycopg's `connect` for `url` under `timeouts`: libpq's
    parameters, the bounds as startup options; behind a transaction pooler
    (`?agboss_pooling=transaction`, `_pg_pooling`) no startup options and no prepared
    statements."""
    pooled = _pg_pooling.pooling_of(url) is not None
    args: dict[str, Any] = {
        "host": url.host or "localhost",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "dbname": url.database or "postgres",
        **session_options(timeouts),
    }
    if url.password:
        args["password"] = url.password
    args.update(
        {
            k: v
            for k, v in url.query.items()
            if isinstance(v, str) and k != _pg_pooling.POOLING_OPTION
        }
    )
    hosts = libpq_hosts(url)  # several servers: ?host=h1:p1&host=h2:p2 (`_pg_hosts`)
    if hosts is not None:
        args.update(hosts)
    if pooled:
        del args["options"]
        args["prepare_threshold"] = None
    return args


def engine_options(url: URL, timeouts: Timeouts) -> dict[str, Any]:
    async def create() -> Any:
        return await connect(url, timeouts, autocommit=False)

    return {"async_creator": create, "pool_timeout": timeouts.pool_ms / 1000}


_dropping_connection: Any = None


def _connection_class() -> Any:
    """psycopg's connection, except that a cancelled call drops the connection at once.

    On a cancellation psycopg asks the server to cancel the statement, over a new
    connection, and waits for it: up to 10 s when the server does not answer (a network
    cut), holding up the caller's own timeout. Ours refuses to ask, so psycopg closes the
    connection instead; the server's statement and lock timeouts bound what it still runs.
    """
    global _dropping_connection
    if _dropping_connection is None:
        import psycopg

        class DroppingConnection(psycopg.AsyncConnection):
            async def _try_cancel(self, *, timeout: float = 5.0) -> None:
                raise psycopg.OperationalError(
                    "a cancelled call drops its connection instead of cancelling its statement"
                )

        _dropping_connection = DroppingConnection
    return _dropping_connection


async def connect(url: URL, timeouts: Timeouts, *, autocommit: bool = True) -> Any:
    args = conninfo(url, timeouts)
    if "options" not in args:
        # Behind a transaction pooler: the bounds go into every transaction instead.
        raw = await _pg_pooling.pooled_class(_connection_class()).connect(
            **args, autocommit=autocommit
        )
        raw.agboss_begin = _pg_pooling.begin_sql(timeouts)
        raw.agboss_wait = _pg_pooling.BeginWait(timeouts)
        raw.agboss_cursor = raw.cursor()
        return raw
    raw = await _connection_class().connect(**args, autocommit=autocommit)
    raw.agboss_begin = None
    raw.agboss_cursor = raw.cursor()
    key = _pg_pooling.check_key(args)
    if _pg_pooling.needs_check(key):
        try:
            rows = await (await raw.execute(_pg_pooling.CHECK_SQL)).fetchall()
            if not autocommit:
                await raw.rollback()
            _pg_pooling.checked(key, rows, timeouts, _where(url))
        except BaseException:
            abort(raw)
            raise
    return raw


def _where(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def capabilities_of(raw: Any) -> Capabilities:
    return CAPABILITIES


def can_listen(raw: Any) -> bool:
    """Whether `raw`'s session stays its own to `LISTEN` on: not behind a transaction pooler
    (whose transactions still notify, through the server, the sessions that listen)."""
    return getattr(raw, "agboss_begin", None) is None


async def wait_notification(raw: Any, timeout_s: float) -> bool:
    """Wait at most `timeout_s` for a notification on a channel `raw` listens to (`LISTEN`,
    in autocommit): True when one came, including one received before this call."""
    async for _ in raw.notifies(timeout=timeout_s, stop_after=1):
        return True
    return False


def abort(raw: Any) -> None:
    with contextlib.suppress(Exception):
        raw.pgconn.finish()


def close_without_loop(raw: Any) -> None:
    """libpq's own finish needs no loop."""
    abort(raw)


async def execute(
    raw: Any, sql: str, params: Mapping[str, Any] | None
) -> tuple[list[Any] | None, int]:
    """Run `sql` (pyformat) on `raw`; `params=None` sends the text verbatim (no `%` parsing)."""
    # One cursor per connection, made with it (`connect`): a cursor's making (its adapters,
    # its row maker) cost as much as a quarter of a short statement's round trip here.
    cursor = getattr(raw, "agboss_cursor", None)
    if cursor is None:
        cursor = raw.cursor()
    if (
        raw.autocommit
        and getattr(raw, "agboss_begin", None) is not None
        and raw.pgconn.transaction_status == _IDLE
    ):
        # Behind a transaction pooler a statement alone gets a bounded transaction.
        return await _alone(raw, cursor, sql, params)
    try:
        await cursor.execute(sql, params, prepare=prepare(sql, params))
        # The result's status, not `cursor.description`, which builds a column object per
        # column on every call.
        result = cursor.pgresult
        returned = result is not None and result.status == _TUPLES_OK
        rows = await cursor.fetchall() if returned else None
        return rows, cursor.rowcount
    finally:
        # The rows are copied out: the driver's result goes now, not at the next statement.
        _release(cursor)


def _release(cursor: Any) -> None:
    reset = getattr(cursor, "_reset", None)
    if reset is not None:
        reset()


_TUPLES_OK = 2
"""libpq's `PGRES_TUPLES_OK` (`psycopg.pq.ExecStatus.TUPLES_OK`): the statement returned
rows (possibly none)."""


async def _alone(
    raw: Any, cursor: Any, sql: str, params: Mapping[str, Any] | None
) -> tuple[list[Any] | None, int]:
    """`sql` in a transaction of its own, bounded as `BEGIN` bounds one behind a pooler;
    rolled back when it fails (not after a cancellation: the caller drops `raw`)."""
    await _begin(raw)
    try:
        answer = await _statement(cursor, sql, params)
        await cursor.execute("COMMIT")
    except Exception:
        if raw.pgconn.transaction_status != _IDLE:
            with contextlib.suppress(Exception):
                await cursor.execute("ROLLBACK")
        raise
    finally:
        _release(cursor)
    return answer


async def _statement(
    cursor: Any, sql: str, params: Mapping[str, Any] | None
) -> tuple[list[Any] | None, int]:
    try:
        await cursor.execute(sql, params)
        result = cursor.pgresult
        returned = result is not None and result.status == _TUPLES_OK
        rows = await cursor.fetchall() if returned else None
        return rows, cursor.rowcount
    finally:
        _release(cursor)


async def _begin(raw: Any) -> None:
    """Behind a transaction pooler: `BEGIN` with the transaction's bounds, answered within
    `Timeouts.pool_ms` (the pooler's wait for a server connection), else `StoreTimeoutError`
    and `raw` closed (`_pg_pooling.bounded_begin`)."""
    wait = raw.agboss_wait
    await raw.wait(_pg_pooling.bounded_begin(raw.pgconn, wait.begin, wait, raw.pgconn._encoding))


async def run_text(raw: Any, sql: str) -> None:
    if sql == BEGIN and getattr(raw, "agboss_begin", None) is not None:
        await _begin(raw)
        return
    await raw.execute(sql)


async def close(raw: Any) -> None:
    await raw.close()


def is_usable(raw: Any) -> bool:
    """`raw` is open, outside any transaction, and the server sent nothing since its last
    answer (a terminated session leaves its notice and EOF unread): no round trip."""
    if raw.closed or getattr(raw, "broken", False):
        return False
    # The libpq connection's own status: `raw.info` would build an object on every call.
    if raw.pgconn.transaction_status != _IDLE:
        return False
    return not _readable(raw.fileno())


_IDLE = 0
"""libpq's `PQTRANS_IDLE` (`psycopg.pq.TransactionStatus.IDLE`)."""


def _readable(fd: int) -> bool:
    """Data or EOF waits on the socket `fd` (polled, not read; `poll` has no fd limit)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _sqlstate(exc: BaseException) -> str | None:
    found = getattr(exc, "sqlstate", None) or getattr(getattr(exc, "orig", None), "sqlstate", None)
    return found if isinstance(found, str) else None


def is_retryable(exc: BaseException) -> bool:
    """Serialization failure or deadlock: the transaction did not apply."""
    return _sqlstate(exc) in ("40001", "40P01")


def is_lock_timeout(exc: BaseException) -> bool:
    """`lock_timeout` passed (lock_not_available): the statement did not apply."""
    return _sqlstate(exc) == "55P03"


def is_statement_timeout(exc: BaseException) -> bool:
    """`statement_timeout` passed (query_canceled)."""
    return _sqlstate(exc) == "57014"


def is_storage_full(exc: BaseException) -> bool:
    """disk_full, out_of_memory, insufficient_resources."""
    return _sqlstate(exc) in ("53100", "53200", "53000")


def is_busy(exc: BaseException) -> bool:
    """SQLite's "database is locked"; a server waits on its own row locks instead."""
    return False


def is_read_only(exc: BaseException) -> bool:
    """read_only_sql_transaction (25006): a standby in recovery, or a session read-only by
    `default_transaction_read_only`."""
    return _sqlstate(exc) == "25006"


def driver_error(exc: BaseException) -> BaseException | None:
    import psycopg

    return wrapped_driver_error(exc, psycopg.Error)


def is_unique_violation(exc: BaseException) -> bool:
    return _sqlstate(exc) == "23505"


_DISCONNECT_STATES = ("57P01", "57P02", "57P03")  # admin/crash shutdown, cannot connect now


IDLE_IN_TRANSACTION_TIMEOUT = "25P03"


def is_disconnect(exc: BaseException) -> bool:
    """The session is gone: terminated or shut down by the server (class 08 or 57P0x), or lost
    on the client's side (a driver error with no SQLSTATE). A cancelled statement (57014) or
    a lock not granted keeps its session, and is not a disconnect."""
    import psycopg

    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException):
        exc = orig
    if isinstance(exc, _pg_pooling.PoolerWaitPassed):
        return True  # typed already; its connection was dropped
    if getattr(exc, "sqlstate", None) == IDLE_IN_TRANSACTION_TIMEOUT:
        # The server ended the session (idle_in_transaction_session_timeout); psycopg
        # raises it as an InternalError (class 25), not as an OperationalError.
        return True
    if not isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        # psycopg's C wait, handling a connection the server closed, may raise an error of
        # its own (a bare NotImplementedError, seen when a primary died mid-statement)
        # with the lost connection's error as its context.
        context = exc.__context__
        return (
            not isinstance(exc, psycopg.Error)
            and isinstance(context, psycopg.OperationalError)
            and is_disconnect(context)
        )
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is None:
        return True
    return sqlstate.startswith("08") or sqlstate in _DISCONNECT_STATES


# --- migrations ------------------------------------------------------------------------

SYNC_DRIVER = "psycopg"
# Migrations' engines are SQLAlchemy's own: they take a URL naming the pooling mode too.
_pg_pooling.install_engine_hook()
MIGRATION_LOCK_TIMEOUT_S = 600
# A fixed key for every agboss-sql migration of a database (advisory locks are scoped to
# their database): the first 8 bytes of SHA-256("agboss_sql_migrations"), signed.
MIGRATION_LOCK_KEY = -7712121202080047754


@contextlib.contextmanager
def lock_database(connection: sa.Connection, lock_ms: int) -> Iterator[None]:
    """Run the body in one transaction on `connection` (a sync connection with no
    transaction begun) while holding the database's migration lock, a session advisory
    lock taken before the transaction begins and released after it ends, so the next
    holder sees all it committed. Waits up to `MIGRATION_LOCK_TIMEOUT_S` for it; in the
    body, each lock a statement waits for (a table's, a row's) up to `lock_ms`
    (`lock_timeout`, for that transaction only).

    Behind a transaction pooler (`?agboss_pooling=transaction`) a session lock would stay
    with a server session the pooler lends to others: the lock is then transaction-scoped
    (`pg_advisory_xact_lock`), taken first in the body's transaction and released by its
    end; the next holder's statements after its own lock see all it committed."""
    body_bound = f"SET LOCAL lock_timeout = '{int(lock_ms)}ms'"
    if _pg_pooling.pooling_of(connection.engine.url) is not None:
        with connection.begin():
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT_S}s'")
            _take_migration_lock(connection, sa.func.pg_advisory_xact_lock)
            connection.exec_driver_sql(body_bound)
            yield
        return
    with connection.begin():
        # SET LOCAL: this bound applies to waiting for the migration lock only.
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT_S}s'")
        _take_migration_lock(connection, sa.func.pg_advisory_lock)
    try:
        with connection.begin():
            connection.exec_driver_sql(body_bound)
            yield
    finally:
        # A lost connection has lost its session, and the lock with it.
        if not connection.invalidated:
            with connection.begin():
                connection.execute(sa.select(sa.func.pg_advisory_unlock(MIGRATION_LOCK_KEY)))


def _take_migration_lock(connection: sa.Connection, taking: Any) -> None:
    """`taking(MIGRATION_LOCK_KEY)` within the `lock_timeout` set; its timeout typed."""
    try:
        connection.execute(sa.select(taking(MIGRATION_LOCK_KEY)))
    except sa.exc.DBAPIError as exc:
        if is_lock_timeout(exc):
            raise migration_lock_timeout(MIGRATION_LOCK_TIMEOUT_S, "an advisory lock") from exc
        raise


# --- checkpoints: folded writes, duplicate handling, metadata filters -------------------


def json_key_equals(document: Any, index: int) -> ColumnElement[bool]:
    """The JSON object in the text column `document` has key `:meta_key<index>` equal to the
    JSON value `:meta_value<index>` (structural `jsonb` equality). Params: `json_key_params`."""
    value = sa.cast(document, pg.JSONB).op("->", return_type=pg.JSONB)(
        sa.bindparam(f"meta_key{index}", type_=sa.Text)
    )
    return value == sa.cast(sa.bindparam(f"meta_value{index}", type_=sa.Text), pg.JSONB)


def json_key_params(index: int, key: str, value: Any) -> dict[str, Any]:
    """The parameters of `json_key_equals(document, index)` for `key` and a JSON value."""
    return {f"meta_key{index}": key, f"meta_value{index}": json.dumps(value)}


def analyze_sql(table: str) -> str:
    """The statement that refreshes the planner's statistics of `table`."""
    return f"ANALYZE {table}"


def truncate_sql(tables: Sequence[str]) -> list[str]:
    """One `TRUNCATE` of them all (references between them allowed)."""
    return ["TRUNCATE " + ", ".join(tables)] if tables else []
