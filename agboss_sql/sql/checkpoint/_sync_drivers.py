"""The synchronous drivers of the saver's sync methods (`_sync`): SQLite's stdlib driver,
psycopg's synchronous connection, PyMySQL. Each opens a connection with the same session
bounds as the async driver of its database (`Timeouts`: PostgreSQL's `statement_timeout`,
`lock_timeout` and idle-transaction timeout in the startup packet; MariaDB's
`innodb_lock_wait_timeout`, `max_statement_time` and `idle_transaction_timeout` at
connect; SQLite's wait for the write lock up to `lock_ms`), and gives up on a server
statement `GRACE_S` past `statement_ms` as the async path does (`DeadlinePassed`): PyMySQL
by its socket's read timeout, psycopg by `Watchdog`, which shuts the socket down.

A URL naming several servers is failed over as the async driver fails it over: PostgreSQL's
`?host=h1:p1&host=h2:p2&target_session_attrs=read-write` by libpq (the first that accepts
writes), a MySQL URL's `failover` alternates by `_mysql_sync` (the first node that answers
and is Synced, each within its share of `connect_ms`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import random
import select
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from sqlalchemy.engine import URL

from agboss_sql._dialects import _mysql_literals as mysql_literals
from agboss_sql._dialects import _mysql_sync as mysql_sync
from agboss_sql._dialects import _pg_pooling as pg_pooling
from agboss_sql._dialects import inline_dialect
from agboss_sql._dialects import mysql as mysql_dialect
from agboss_sql._dialects import postgresql as pg_dialect
from agboss_sql._dialects._mysql_failover import NO_NODE
from agboss_sql._dialects._pg_prepare import prepare as pg_prepare
from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import (
    ServerSettingError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from agboss_sql.sql._deadline import DeadlinePassed, statement_bound_s

Rows = tuple[list[Any] | None, int]

_MAX_BACKOFF_S = 0.005
"""SQLite: the longest pause between two tries of a statement that found the database locked."""


class SyncDriver(Protocol):
    """One database's synchronous driver, as `_sync.SyncDatabase` uses it."""

    writer: threading.Lock | None
    """Where the database takes one writer at a time (SQLite): the lock this process's
    writers take turns on."""

    def connect(self) -> Any:
        """A new connection in autocommit, its session bounded by the `Timeouts`."""
        ...

    def execute(self, raw: Any, sql: str, params: Mapping[str, Any] | None) -> Rows:
        """Run `sql` on `raw`: (rows or None, rowcount)."""
        ...

    def close(self, raw: Any) -> None: ...

    def is_usable(self, raw: Any) -> bool:
        """Open, outside any transaction, nothing unread from the server."""
        ...


def driver_for(url: URL, timeouts: Timeouts) -> SyncDriver:
    """The synchronous driver of the database `url` names."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        return SqliteDriver(url.database or "", timeouts)
    if backend == "postgresql":
        return PostgresDriver(url, timeouts)
    return MysqlDriver(url, timeouts)


def _unavailable(url: URL, exc: Exception) -> StoreUnavailableError:
    where = url.render_as_string(hide_password=True)
    return StoreUnavailableError(f"cannot connect to {where}: {type(exc).__name__}: {exc}")


class SqliteDriver:
    """The stdlib driver, busy timeout 0: a statement that finds the database locked by
    another connection's write is sent again after a short sleep, up to `lock_ms` from the
    first refusal; then the refusal is raised (a lock timeout: nothing applied)."""

    def __init__(self, path: str, timeouts: Timeouts) -> None:
        self.dialect = inline_dialect("sqlite")
        self.path = path
        self.writer: threading.Lock | None = threading.Lock()
        self.lock_s = timeouts.lock_ms / 1000

    def connect(self) -> Any:
        try:
            return self.dialect.connect_sync(self.path, round(self.lock_s * 1000))
        except Exception as exc:
            raise StoreUnavailableError(
                f"cannot open {self.path!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def execute(self, raw: Any, sql: str, params: Mapping[str, Any] | None) -> Rows:
        # The dialect's `execute_sync`, inline: this runs for every statement of the sync
        # path, and the call through the dialect was a fifth of a lone statement's overhead.
        try:
            cursor = raw.execute(sql) if params is None else raw.execute(sql, params)
        except Exception as exc:
            if not self.dialect.is_busy(exc):
                raise
            cursor = None
        if cursor is None:
            return self._busy(raw, sql, params)
        try:
            return (cursor.fetchall() if cursor.description is not None else None), cursor.rowcount
        finally:
            cursor.close()

    def _busy(self, raw: Any, sql: str, params: Mapping[str, Any] | None) -> Rows:
        """`sql` refused as the database was locked: sent again after short sleeps, up to
        `lock_ms` from now; then the refusal is raised."""
        execute = self.dialect.execute_sync
        deadline = time.monotonic() + self.lock_s
        delay = 0.0005
        while True:
            time.sleep(delay * random.uniform(0.5, 1.5))
            try:
                return execute(raw, sql, params)
            except Exception as exc:
                if not self.dialect.is_busy(exc) or time.monotonic() >= deadline:
                    raise
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def close(self, raw: Any) -> None:
        with contextlib.suppress(Exception):
            raw.close()

    def is_usable(self, raw: Any) -> bool:
        return not raw.in_transaction


class Watchdog:
    """Client deadlines of statements in flight on sockets: past its deadline, a statement's
    socket is shut down (its blocked read ends at once) and `expired` set. One thread for
    every deadline; arming and disarming take a lock, never a thread."""

    def __init__(self) -> None:
        self._guard = threading.Condition()
        self._heap: list[list[Any]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, fd: int) -> list[Any]:
        """Shut down socket `fd` `seconds` from now, unless `disarm` comes first."""
        entry = [time.monotonic() + seconds, next(self._order), fd, True, False]
        with self._guard:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="agboss-checkpoint-deadlines", daemon=True
                )
                self._thread.start()
            elif self._heap[0] is entry:
                self._guard.notify()
        return entry

    def disarm(self, entry: list[Any]) -> bool:
        """No deadline for the statement any more; True if it had passed (`expired`)."""
        with self._guard:
            entry[3] = False
        return bool(entry[4])

    def _serve(self) -> None:
        with self._guard:
            while True:
                heap = self._heap
                while heap and not heap[0][3]:
                    heapq.heappop(heap)
                if not heap:
                    self._guard.wait()
                    continue
                wait = heap[0][0] - time.monotonic()
                if wait > 0:
                    self._guard.wait(wait)
                    continue
                entry = heapq.heappop(heap)
                entry[3], entry[4] = False, True
                with contextlib.suppress(OSError):
                    shut = socket.socket(fileno=os.dup(entry[2]))
                    try:
                        shut.shutdown(socket.SHUT_RDWR)
                    finally:
                        shut.close()


WATCHDOG = Watchdog()


class PostgresDriver:
    """psycopg's synchronous connection, with the session of the async pool's connections
    (`postgresql.conninfo`); a statement unanswered `GRACE_S` past `statement_ms` has its
    socket shut down by the `Watchdog` and raises `DeadlinePassed`."""

    def __init__(self, url: URL, timeouts: Timeouts) -> None:
        self.url = url
        self.timeouts = timeouts
        self.bound_s = statement_bound_s(timeouts)
        self.writer: threading.Lock | None = None

    def connect(self) -> Any:
        import psycopg

        args = pg_dialect.conninfo(self.url, self.timeouts)
        try:
            raw: Any = psycopg.Connection.connect(**args, autocommit=True)
        except Exception as exc:
            if "timeout expired" in str(exc):
                raise StoreTimeoutError(
                    "connect",
                    self.timeouts.connect_ms,
                    f"no connection within {self.timeouts.connect_ms} ms "
                    "(Timeouts.connect_ms, whole seconds for libpq); nothing was sent",
                ) from exc
            raise _unavailable(self.url, exc) from exc
        raw.agboss_cursor = raw.cursor()
        # Behind a transaction pooler (no startup options): the bounds in every transaction.
        pooled = "options" not in args
        raw.agboss_begin = pg_pooling.begin_sql(self.timeouts) if pooled else None
        raw.agboss_wait = pg_pooling.BeginWait(self.timeouts) if pooled else None
        key = pg_pooling.check_key(args)
        if not pooled and pg_pooling.needs_check(key):
            try:
                rows = raw.execute(pg_pooling.CHECK_SQL).fetchall()
                where = self.url.render_as_string(hide_password=True)
                pg_pooling.checked(key, rows, self.timeouts, where)
            except BaseException:
                self.close(raw)
                raise
        return raw

    def execute(self, raw: Any, sql: str, params: Mapping[str, Any] | None) -> Rows:
        cursor = raw.agboss_cursor
        entry = WATCHDOG.arm(self.bound_s, raw.fileno())
        try:
            if raw.agboss_begin is not None:
                if sql == pg_dialect.BEGIN:
                    self._begin(raw)
                    return None, -1
                if raw.pgconn.transaction_status == pg_dialect._IDLE:
                    return self._alone(raw, cursor, sql, params)
            cursor.execute(sql, params, prepare=pg_prepare(sql, params))
            result = cursor.pgresult
            rows = cursor.fetchall() if result is not None and result.status == 2 else None
            return rows, cursor.rowcount
        except Exception as exc:
            if WATCHDOG.disarm(entry):
                raise DeadlinePassed(
                    f"no answer within {self.timeouts.statement_ms} ms (Timeouts.statement_ms)"
                ) from exc
            raise
        finally:
            WATCHDOG.disarm(entry)
            reset = getattr(cursor, "_reset", None)
            if reset is not None:
                reset()

    @staticmethod
    def _alone(raw: Any, cursor: Any, sql: str, params: Mapping[str, Any] | None) -> Rows:
        """Behind a transaction pooler: `sql` in a bounded transaction of its own (as the
        async path's `postgresql._alone`), rolled back when it fails."""
        PostgresDriver._begin(raw)
        try:
            cursor.execute(sql, params)
            result = cursor.pgresult
            rows = cursor.fetchall() if result is not None and result.status == 2 else None
            answer = rows, cursor.rowcount
            cursor.execute("COMMIT")
        except Exception:
            if raw.pgconn.transaction_status != pg_dialect._IDLE:
                with contextlib.suppress(Exception):
                    cursor.execute("ROLLBACK")
            raise
        return answer

    @staticmethod
    def _begin(raw: Any) -> None:
        """Behind a transaction pooler: `BEGIN` with its bounds, answered within `pool_ms`
        (the pooler's wait for a server connection), else `StoreTimeoutError(what="pool")`
        and `raw` closed, as on the async path (`_pg_pooling.bounded_begin`)."""
        wait = raw.agboss_wait
        raw.wait(pg_pooling.bounded_begin(raw.pgconn, wait.begin, wait, raw.pgconn._encoding))

    def close(self, raw: Any) -> None:
        with contextlib.suppress(Exception):
            raw.close()

    def is_usable(self, raw: Any) -> bool:
        try:
            return bool(pg_dialect.is_usable(raw))
        except Exception:
            return False


class MysqlDriver:
    """PyMySQL, with the session of the async pool's connections (`mysql.session_options`,
    Galera's session on a Galera node); a statement unanswered `GRACE_S` past
    `statement_ms` ends at the socket's read timeout and raises `DeadlinePassed`."""

    def __init__(self, url: URL, timeouts: Timeouts) -> None:
        self.url = url
        self.timeouts = timeouts
        self.bound_s = statement_bound_s(timeouts)
        self.writer: threading.Lock | None = None

    def connect(self) -> Any:
        from pymysql.constants import CLIENT

        options = mysql_dialect.session_options(self.timeouts)
        del options["connect_timeout"]  # each node's share of it (`_mysql_sync`)
        try:
            # The first node of the URL's `failover` list that serves, as the async driver.
            return mysql_sync.connect(
                self.url,
                self.timeouts.connect_ms,
                autocommit=True,
                charset="utf8mb4",
                # Bytes sent as `_binary'…'`, as aiomysql sends them: a value's bytes are
                # not text in the connection's character set.
                binary_prefix=True,
                client_flag=CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS,
                read_timeout=self.bound_s,
                write_timeout=self.bound_s,
                **options,
            )
        except ServerSettingError:
            raise
        except Exception as exc:
            if "timed out" in str(exc) and NO_NODE not in str(exc):
                raise StoreTimeoutError(
                    "connect",
                    self.timeouts.connect_ms,
                    f"no connection within {self.timeouts.connect_ms} ms "
                    "(Timeouts.connect_ms); nothing was sent",
                ) from exc
            raise _unavailable(self.url, exc) from exc

    def execute(self, raw: Any, sql: str, params: Mapping[str, Any] | None) -> Rows:
        cursor = raw.cursor()
        try:
            count = cursor.execute(
                sql if params is None else mysql_literals.rendered(raw, sql, params)
            )
            rows = list(cursor.fetchall()) if cursor.description is not None else None
            # A script answers a result per statement: the rows of the last that returns
            # rows, the count of the first.
            while cursor.nextset():
                if cursor.description is not None:
                    rows = list(cursor.fetchall())
            return rows, count
        except Exception as exc:
            if "timed out" in str(exc):
                raise DeadlinePassed(
                    f"no answer within {self.timeouts.statement_ms} ms (Timeouts.statement_ms)"
                ) from exc
            raise
        finally:
            with contextlib.suppress(Exception):
                cursor.close()

    def close(self, raw: Any) -> None:
        with contextlib.suppress(Exception):
            raw.close()

    def is_usable(self, raw: Any) -> bool:
        from pymysql.constants import SERVER_STATUS

        sock = getattr(raw, "_sock", None)
        if not raw.open or sock is None or raw.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return not poller.poll(0)
