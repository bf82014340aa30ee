"""MySQL 8.0+ and MariaDB 10.6+: aiomysql on PyMySQL, `ON DUPLICATE KEY UPDATE`, row locks.

No `UPDATE … RETURNING` anywhere; MySQL 8 has no `RETURNING` at all, MariaDB
accepts it only on `INSERT`. No `WHERE` on the upsert: a conditional take is
`col = IF(cond, new, col)` per column, assignments running left to right.
Connections set `CLIENT.FOUND_ROWS`, so an `UPDATE` counts the rows it matched,
not only the rows whose values changed: compare-and-set reads "one row".

A MariaDB Galera node (`wsrep_on`, asked at connect) is the same dialect with
`Capabilities.certified_writes` and a session set for the cluster (`GALERA_SESSION`);
migrations there take a lock row instead of `GET_LOCK` (dialects/galera/QUIRKS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import select
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql as my
from sqlalchemy.engine import URL
from sqlalchemy.sql.expression import ColumnElement

from agboss_sql._dialects._mysql_checkpoints import json_key_equals as json_key_equals
from agboss_sql._dialects._mysql_checkpoints import json_key_params as json_key_params
from agboss_sql._dialects._mysql_checkpoints import replace_duplicates as replace_duplicates
from agboss_sql._dialects._mysql_checkpoints import skip_duplicates as skip_duplicates
from agboss_sql._dialects._mysql_failover import _PREFERRED as _PREFERRED
from agboss_sql._dialects._mysql_failover import FAILOVER_PARAM as FAILOVER_PARAM
from agboss_sql._dialects._mysql_failover import NODE_STATE_QUERY as NODE_STATE_QUERY
from agboss_sql._dialects._mysql_failover import first_serving, node_state
from agboss_sql._dialects._mysql_failover import nodes_of as nodes_of
from agboss_sql._dialects._mysql_failover import without_failover as without_failover
from agboss_sql._dialects._mysql_galera_lock import MIGRATION_LOCK_TABLE as MIGRATION_LOCK_TABLE
from agboss_sql._dialects._mysql_galera_lock import galera_lock
from agboss_sql._dialects._mysql_literals import rendered
from agboss_sql._dialects._mysql_lock_waits import bounded_lock_waits
from agboss_sql._dialects.base import (
    Capabilities,
    Suffixed,
    migration_lock_timeout,
    wrapped_driver_error,
)
from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import ServerSettingError
from agboss_sql.contracts.limits import MIN_MAX_ALLOWED_PACKET

NAME = "mysql"
CAPABILITIES = Capabilities(
    inline=False,
    update_returning=False,
    # MariaDB has `INSERT … RETURNING`, MySQL 8 does not: `capabilities_of` tells them apart.
    insert_returning=False,
    upsert_where=False,
    row_locks=True,
    skip_locked=True,
    dml_in_with=False,
    json_key_exact=False,
    insert_if_absent_raises=True,
    batch_migrations=False,
    # The pool's connections are opened with `CLIENT.MULTI_STATEMENTS` (`connect`).
    scripts=True,
)
MARIADB_CAPABILITIES = dataclasses.replace(CAPABILITIES, insert_returning=True)
GALERA_CAPABILITIES = dataclasses.replace(MARIADB_CAPABILITIES, certified_writes=True)
GALERA_SESSION = "SET SESSION wsrep_sync_wait = 7, wsrep_retry_autocommit = 0"
"""What a session on a Galera node sets (see dialects/galera/QUIRKS.md): every `SELECT`,
`BEGIN`, `UPDATE`, `DELETE` and `INSERT` first waits until the node has applied all the
cluster committed before it (causal reads: no decision from a lagging node's stale rows);
an autocommit statement that fails certification comes back as a deadlock (1213) for the
caller to run again, never silently re-executed by the server (whose second run may
answer rows of the run that lost)."""
BEGIN = "BEGIN"
ASYNC_DRIVER = "aiomysql"
DRIVER_SENDS_BEGIN = False  # outside autocommit, the first statement starts the transaction

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


def now_source(database_time: bool) -> tuple[None, ColumnElement[int]]:
    """No FROM needed: `NOW(6)` is the statement's start, the same at every reference within
    one statement (a derived one-row table would be materialised on every statement).

    A statement that waits for a row lock decides with the time it started: earlier, never
    later, than the truth. For a take that errs towards refusing; for a fence or a renewal
    it may accept a lease that ran out during the wait, which is safe: whoever would take it
    over must write the row, so waits for the lock this statement now holds, and reads the
    row as it left it. `now_ms()` (`SYSDATE(6)`) reads the time again where an answer must
    count from after the wait."""
    if database_time:
        return None, sa.cast(
            sa.func.floor(sa.func.unix_timestamp(sa.literal_column("NOW(6)")) * 1000),
            sa.BigInteger,
        )
    return None, sa.cast(sa.bindparam("now", type_=sa.BigInteger), sa.BigInteger)


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


def insert_if_absent(table: sa.Table, keys: Sequence[str]) -> Any:
    """A plain insert: a duplicate key raises (`is_unique_violation`), which the caller reads
    as "already there". (`INSERT IGNORE` would warn, and turn other errors into warnings.)"""
    return insert(table)


def insert_or_lock(insert: Any, keys: Sequence[str], columns: Sequence[Any]) -> Any:
    """The plain insert (`Capabilities.insert_or_lock_returning` is False): a duplicate of
    `keys` raises (`is_unique_violation`) without ending the transaction, and the caller
    reads the existing row."""
    return insert


def upsert(
    table: sa.Table,
    keys: Sequence[str],
    values: Mapping[str, Any],
    update: Callable[[Any], Mapping[str, Any]],
) -> Any:
    """`INSERT values`; on a duplicate of the unique key `keys`, `SET` what `update(new)`
    maps (column name -> expression), where `new` names the values the insert proposed
    (`new.column`). One statement; the duplicate row is locked by it. `ON DUPLICATE KEY
    UPDATE` matches any unique key, so `keys` must be the table's only one."""
    statement = insert(table).values(dict(values))
    # A list keeps the assignments in order: MySQL runs them left to right.
    return statement.on_duplicate_key_update(list(update(statement.inserted).items()))


def upsert_where(
    insert: Any,
    keys: Sequence[str],
    where: Callable[[Any], ColumnElement[bool]],
    update: Callable[[Any], Sequence[tuple[str, Any]]],
    decided_by: str,
) -> Any:
    """`insert`; on a duplicate of the unique key `keys`, when `where(new)` holds for the
    existing row, `SET` the assignments `update(new)` (`new` names the proposed values).

    MySQL's upsert takes no `WHERE`: each column becomes `IF(taken, new, old)`. Assignments
    run left to right and see the columns already assigned, so the decision is written
    first, into `decided_by` (a per-call nonce column), and read by all the rest; list the
    other assignments so that an expression reads only columns assigned after it."""
    table = insert.table
    new = insert.inserted
    nonce = table.c[decided_by]
    taken = nonce == new[decided_by]
    assignments: list[tuple[str, Any]] = [
        (decided_by, sa.func.IF(where(new), new[decided_by], nonce))
    ]
    assignments += [
        (column, sa.func.IF(taken, value, table.c[column]))
        for column, value in update(new)
        if column != decided_by
    ]
    return insert.on_duplicate_key_update(assignments)


def returning(statement: Any, *columns: Any) -> Any:
    """MariaDB's `INSERT … RETURNING`, which SQLAlchemy's MySQL dialect will not compile: a
    column by its name, any other expression (a scalar subquery) compiled on its own (its
    parameters are the statement's)."""
    dialect = compile_dialect()
    parts = []
    for column in columns:
        if isinstance(column, sa.Column):
            parts.append(column.name)
        else:
            text = column.compile(dialect=dialect).string
            parts.append(text if text.startswith("(") else f"({text})")
    return Suffixed(statement, " RETURNING " + ", ".join(parts))


def exact_text(expression: ColumnElement[Any]) -> ColumnElement[Any]:
    """`expression` compared and ordered by its exact characters (code point order): its UTF-8
    bytes, so no PAD SPACE collation ignores trailing spaces in the comparison."""
    return sa.cast(expression, my.BINARY())


# --- the raw async driver -------------------------------------------------------------


def session_options(timeouts: Timeouts) -> dict[str, Any]:
    """Driver arguments that bound a session's waits: the connect timeout, and one
    `init_command` at connect setting the row-lock wait (whole seconds, at least 1) and, on
    MariaDB only (a `/*M! … */` comment MySQL skips), the statement bound and the idle
    transaction bound (a frozen client's row locks end with its session)."""
    lock_s = max(1, -(-timeouts.lock_ms // 1000))
    statement_s = timeouts.statement_ms / 1000
    idle_s = max(1, -(-max(timeouts.statement_ms, timeouts.lock_ms) // 1000))
    return {
        "connect_timeout": timeouts.connect_ms / 1000,
        "init_command": (
            f"SET SESSION innodb_lock_wait_timeout = {lock_s}"
            f"/*M! , max_statement_time = {statement_s:.3f}"
            f", idle_transaction_timeout = {idle_s} */"
        ),
    }


def engine_options(url: URL, timeouts: Timeouts) -> dict[str, Any]:
    async def create() -> Any:
        return await connect(url, timeouts, autocommit=False)

    return {"async_creator": create, "pool_timeout": timeouts.pool_ms / 1000}


SETTINGS_QUERY = "SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'max_allowed_packet')"
"""What a new connection asks its server: whether it is a Galera node, and the largest
statement it takes (checked against `MIN_MAX_ALLOWED_PACKET`)."""


def checked_settings(rows: Any) -> bool:
    """Whether the server answering `SETTINGS_QUERY` with `rows` is a Galera node; a
    `max_allowed_packet` under `MIN_MAX_ALLOWED_PACKET` is `ServerSettingError`."""
    settings = {str(name).lower(): value for name, value in rows or ()}
    packet = int(settings.get("max_allowed_packet") or 0)
    if packet < MIN_MAX_ALLOWED_PACKET:
        raise ServerSettingError("max_allowed_packet", packet, MIN_MAX_ALLOWED_PACKET)
    return str(settings.get("wsrep_on", "")).upper() == "ON"


async def connect(url: URL, timeouts: Timeouts, *, autocommit: bool = True) -> Any:
    """A new connection; on a MariaDB Galera node (`wsrep_on`, asked once per connection)
    its session is set for the cluster (`GALERA_SESSION`). A server whose
    `max_allowed_packet` is under `MIN_MAX_ALLOWED_PACKET` (asked in the same statement) is
    `ServerSettingError`, and the connection is closed: a statement at the limits would be
    refused by the server.

    With `failover` alternates in the URL (`nodes_of`), the nodes are tried in turn,
    starting from the one the last new connection reached, each within its share of
    `connect_ms` (a frozen node accepts TCP and never greets): the first node that answers
    and is in the cluster's primary component and Synced (`wsrep_ready`, `wsrep_local_state`)
    serves; a ready node that is not Synced (a donor, which rsync blocks) only when none is.
    No node answering is the last node's error."""
    nodes = nodes_of(url)
    if len(nodes) == 1:
        return await _connect_node(url, nodes[0], timeouts, autocommit, timeouts.connect_ms)

    async def open_node(node: tuple[str, int], bound_ms: int) -> tuple[Any, tuple[str, str]]:
        async with asyncio.timeout(bound_ms / 1000):
            raw = await _connect_node(url, node, timeouts, autocommit, bound_ms)
            return raw, await node_state(raw)

    return await first_serving(nodes, timeouts.connect_ms, open_node, abort)


async def _connect_node(
    url: URL, node: tuple[str, int], timeouts: Timeouts, autocommit: bool, bound_ms: int
) -> Any:
    import aiomysql
    from pymysql.constants import CLIENT

    options = session_options(timeouts)
    options["connect_timeout"] = bound_ms / 1000
    raw = await aiomysql.connect(
        host=node[0],
        port=node[1],
        user=url.username or "root",
        password=url.password or "",
        db=url.database,
        autocommit=autocommit,
        charset="utf8mb4",
        # The pool's connections (in autocommit) take a transaction as one text (`Script`):
        # every parameter is still escaped by the driver, as in a single statement.
        client_flag=CLIENT.FOUND_ROWS | (CLIENT.MULTI_STATEMENTS if autocommit else 0),
        **options,
    )
    try:
        cursor = await raw.cursor()
        try:
            await cursor.execute(SETTINGS_QUERY)
            galera = checked_settings(await cursor.fetchall())
            if galera:
                await cursor.execute(GALERA_SESSION)
        finally:
            await cursor.close()
        if not autocommit and raw.get_transaction_status():
            await raw.commit()  # end a transaction the reads began, if any
    except BaseException:
        raw.close()
        raise
    raw._agboss_galera = galera
    return raw


def _is_mariadb(raw: Any) -> bool:
    return "mariadb" in str(raw.get_server_info()).lower()


def _wsrep_on(rows: Any) -> bool:
    return any(str(row[1]).upper() == "ON" for row in rows or ())


def capabilities_of(raw: Any) -> Capabilities:
    """MariaDB (it names itself in its version) has `INSERT … RETURNING`; a Galera node
    (found at connect) certifies write sets."""
    if getattr(raw, "_agboss_galera", False):
        return GALERA_CAPABILITIES
    return MARIADB_CAPABILITIES if _is_mariadb(raw) else CAPABILITIES


async def wait_notification(raw: Any, timeout_s: float) -> bool:
    """MySQL/MariaDB have no notifications (`Capabilities.notifications` is false)."""
    raise NotImplementedError("MySQL and MariaDB have no notifications: poll")


def abort(raw: Any) -> None:
    with contextlib.suppress(Exception):
        raw.close()


def close_without_loop(raw: Any) -> None:
    """aiomysql closes through its stream writer, on its loop: close the socket under the
    writer's transport directly, and drop the streams."""
    writer = getattr(raw, "_writer", None)
    if writer is None:
        abort(raw)
        return
    with contextlib.suppress(Exception):
        writer.transport._sock.close()
    raw._writer = raw._reader = None


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


async def execute(
    raw: Any, sql: str, params: Mapping[str, Any] | None
) -> tuple[list[Any] | None, int]:
    """Run `sql` (pyformat) on `raw`; `params=None` sends the text verbatim. Empty params still
    format the text, which turns a compiled `%%` back into `%`."""
    cursor = await raw.cursor(_cursor_class())
    try:
        count = await cursor.execute(sql if params is None else rendered(raw, sql, params))
        rows = list(await cursor.fetchall()) if cursor.description is not None else None
        # A script (several statements in one text) answers a result per statement: the
        # rows are those of the last one that returns rows, the count the first one's.
        while await cursor.nextset():
            if cursor.description is not None:
                rows = list(await cursor.fetchall())
        return rows, count
    finally:
        await cursor.close()


async def run_text(raw: Any, sql: str) -> None:
    cursor = await raw.cursor(_cursor_class())
    try:
        await cursor.execute(sql)
    finally:
        await cursor.close()


async def close(raw: Any) -> None:
    raw.close()


def is_usable(raw: Any) -> bool:
    """`raw` is open, outside any transaction, and its socket shows no EOF (a killed session's
    socket stays readable once the server closed it): no round trip."""
    if raw.closed or raw.get_transaction_status():
        return False
    sock = raw._writer.get_extra_info("socket")  # aiomysql keeps its stream private
    if sock is None:
        return True
    return not _readable(sock.fileno())


def _readable(fd: int) -> bool:
    """Data or EOF waits on the socket `fd` (polled, not read; `poll` has no fd limit)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


# Deadlock, record changed since last read.
_RETRYABLE = {1213, 1020}
# Lock wait timeout, NOWAIT lock not granted (MySQL 8).
_LOCK_TIMEOUTS = {1205, 3572}
# MariaDB's max_statement_time, MySQL 8's max_execution_time, query interrupted.
_STATEMENT_TIMEOUTS = {1969, 3024, 1317}
# Disk full, table full, out of memory, record file full.
_STORAGE_FULL = {1021, 1114, 1041}
# Can't connect, server gone away, lost during query, lost at handshake, server shutdown,
# connection killed (MariaDB), disconnected by the server (MySQL 8.0.24+), and a Galera
# node out of the primary component (1047, "WSREP has not yet prepared node for application
# use": it applies nothing until it rejoins, so its connections are dropped like lost ones).
_DISCONNECTS = {2003, 2006, 2013, 2055, 1053, 1927, 4031, 1047}


def _code(exc: BaseException) -> int | None:
    for candidate in (exc, getattr(exc, "orig", None)):
        args = getattr(candidate, "args", None)
        if args and isinstance(args[0], int):
            return args[0]
    return None


def is_retryable(exc: BaseException) -> bool:
    return _code(exc) in _RETRYABLE


def is_lock_timeout(exc: BaseException) -> bool:
    return _code(exc) in _LOCK_TIMEOUTS


def is_statement_timeout(exc: BaseException) -> bool:
    return _code(exc) in _STATEMENT_TIMEOUTS


def is_storage_full(exc: BaseException) -> bool:
    return _code(exc) in _STORAGE_FULL


def is_busy(exc: BaseException) -> bool:
    """SQLite's "database is locked"; a server waits on its own row locks instead."""
    return False


def is_read_only(exc: BaseException) -> bool:
    """A server run `--read-only` (1290, the option named in its text; 1836, MySQL's
    read-only mode), or a read-only transaction (1792)."""
    code = _code(exc)
    if code == 1290:
        return "read-only" in str(exc) or "read_only" in str(exc)
    return code in (1792, 1836)


def driver_error(exc: BaseException) -> BaseException | None:
    from pymysql.err import MySQLError

    return wrapped_driver_error(exc, MySQLError)


def is_unique_violation(exc: BaseException) -> bool:
    return _code(exc) == 1062


def is_disconnect(exc: BaseException) -> bool:
    """The session is gone (lost, killed, server shut down), or the driver already knows its
    connection is closed (`InterfaceError`, e.g. "Not connected")."""
    from pymysql.err import InterfaceError

    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException):
        exc = orig
    return _code(exc) in _DISCONNECTS or isinstance(exc, (InterfaceError, ConnectionError))


# --- migrations ------------------------------------------------------------------------

SYNC_DRIVER = "pymysql"
MIGRATION_LOCK_TIMEOUT_S = 600
# GET_LOCK names are server-wide: migrations of two databases on one server take turns.
MIGRATION_LOCK_NAME = "agboss_sql_migrations"


@contextlib.contextmanager
def lock_database(connection: sa.Connection, lock_ms: int) -> Iterator[None]:
    """Run the body in one transaction on `connection` (a sync connection with no
    transaction begun) while holding the migration lock, taken before the transaction
    begins and released after it ends, so the next holder sees all it committed (DDL
    commits implicitly here). Waits up to `MIGRATION_LOCK_TIMEOUT_S` for it; in the body,
    each lock a statement waits for (a table's metadata lock, a row's) up to `lock_ms` in
    whole seconds, at least one (`lock_wait_timeout`, `innodb_lock_wait_timeout`, set for
    the body and given back after it).

    The lock is `GET_LOCK` on one server; on a Galera cluster, where `GET_LOCK` is local to
    a node, it is a row of `MIGRATION_LOCK_TABLE` (see `galera_lock`), and the session is
    set for the cluster (`GALERA_SESSION`) for the rest of the connection's life."""
    if _galera_session(connection):
        with (
            galera_lock(connection, MIGRATION_LOCK_NAME, MIGRATION_LOCK_TIMEOUT_S, _conflict),
            bounded_lock_waits(connection, lock_ms),
            connection.begin(),
        ):
            yield
        return
    with connection.begin():
        got = connection.execute(
            sa.select(sa.func.get_lock(MIGRATION_LOCK_NAME, MIGRATION_LOCK_TIMEOUT_S))
        ).scalar()
    if got != 1:
        raise migration_lock_timeout(MIGRATION_LOCK_TIMEOUT_S, f"GET_LOCK('{MIGRATION_LOCK_NAME}')")
    try:
        with bounded_lock_waits(connection, lock_ms), connection.begin():
            yield
    finally:
        # A lost connection has lost its session, and the lock with it.
        if not connection.invalidated:
            with connection.begin():
                connection.execute(sa.select(sa.func.release_lock(MIGRATION_LOCK_NAME)))


def _conflict(exc: BaseException) -> bool:
    """Another taker of the lock row won certification, or its insert came first."""
    return is_retryable(exc) or is_unique_violation(exc)


def _galera_session(connection: sa.Connection) -> bool:
    """Whether `connection` is to a Galera node; if so its session is set for the cluster."""
    if not getattr(connection.dialect, "is_mariadb", False):
        return False  # MySQL has no wsrep_on
    with connection.begin():
        rows = connection.exec_driver_sql("SHOW VARIABLES LIKE 'wsrep_on'").fetchall()
        if not _wsrep_on(rows):
            return False
        connection.exec_driver_sql(GALERA_SESSION)
    return True


def analyze_sql(table: str) -> str:
    """The statement that refreshes the planner's statistics of `table`."""
    return f"ANALYZE TABLE {table}"


def truncate_sql(tables: Sequence[str]) -> list[str]:
    """A `TRUNCATE TABLE` per table, children first."""
    return [f"TRUNCATE TABLE {table}" for table in reversed(tables)]
