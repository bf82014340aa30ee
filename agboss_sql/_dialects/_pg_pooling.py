"""PostgreSQL through a transaction pooler (PgBouncer `pool_mode = transaction`).

A URL with `?agboss_pooling=transaction` asks for this mode. A transaction pooler lends a
server session to a client for one transaction only, so nothing set on a session reaches
the next transaction: the bounds the direct path sends as startup options (`-c
statement_timeout=…`, which PgBouncer refuses, or drops under `ignore_startup_parameters =
options`) are set inside every transaction instead, with `SET LOCAL`:

- an explicit transaction sends `BEGIN; SET LOCAL statement_timeout = …; SET LOCAL
  lock_timeout = …; SET LOCAL idle_in_transaction_session_timeout = …` (one simple-protocol
  query, one round trip, as the plain `BEGIN` was): the pool's `BEGIN`
  (`run_text`), and psycopg's own `BEGIN` before a non-autocommit connection's first
  statement (`PooledConnection._start_query`: SQLAlchemy's engine);
- a statement sent alone in autocommit runs in a transaction of its own, begun that way
  and committed after it (two round trips more than in the direct mode: the price of a
  bound that survives pooling);
- that first round trip is where the pooler makes a transaction wait for one of its server
  connections (PgBouncer's `default_pool_size` all lent out), a wait it bounds by its own
  `query_wait_timeout` only: ours ends it at `Timeouts.pool_ms` (`SERVER_WAIT_MARGIN_S`
  more), drops the connection and raises `StoreTimeoutError(what="pool")` (`BeginWait`,
  `bounded_begin`); nothing of the transaction was sent yet;
- prepared statements are off (`prepare_threshold=None`): a statement prepared on one server
  session is unknown to the next (PgBouncer before 1.21 passes them through blindly);
- no `LISTEN` (a listening session is not kept between transactions: `postgresql.can_listen`),
  so the child queue's idle claimers poll; `pg_notify` is still sent, and the server
  delivers it to sessions that listen directly;
- migrations hold a transaction-scoped advisory lock (`pg_advisory_xact_lock`) for their one
  transaction, not a session lock a pooler would lend to another client.

Without the mode, a connection checks once per server address and database (per process)
that the startup options reached its session, and refuses one whose bounds are missing
(`BoundsDroppedError`): a pooler that drops them is never used silently unbounded.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy.engine import URL

from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import BoundsDroppedError as BoundsDroppedError
from agboss_sql.contracts.errors import StoreTimeoutError

POOLING_OPTION = "agboss_pooling"
"""The URL query option naming the pooling mode in front of the server."""
TRANSACTION = "transaction"
"""The one pooling mode: a server session is the client's for one transaction."""


def pooling_of(url: URL) -> str | None:
    """The pooling mode `url` names (`TRANSACTION`), or `None` for a direct connection;
    `ValueError` for any other value."""
    value = url.query.get(POOLING_OPTION)
    if value is None:
        return None
    if value != TRANSACTION:
        raise ValueError(
            f"{POOLING_OPTION}={value!r} in the database URL: the only pooling mode is "
            f"{POOLING_OPTION}={TRANSACTION} (PgBouncer's pool_mode = transaction; session "
            "pooling needs no option)"
        )
    return TRANSACTION


def bounds_sql(timeouts: Timeouts) -> str:
    """The statements that bound the transaction they run in by `timeouts`, as the startup
    options bound a direct session (`postgresql.session_options`)."""
    idle_ms = max(timeouts.statement_ms, timeouts.lock_ms)
    return (
        f"SET LOCAL statement_timeout = {timeouts.statement_ms}; "
        f"SET LOCAL lock_timeout = {timeouts.lock_ms}; "
        f"SET LOCAL idle_in_transaction_session_timeout = {idle_ms}"
    )


def begin_sql(timeouts: Timeouts) -> str:
    """`BEGIN` and the transaction's bounds, one simple-protocol query."""
    return f"BEGIN; {bounds_sql(timeouts)}"


SERVER_WAIT_MARGIN_S = 0.5
"""How long past `Timeouts.pool_ms` a transaction's first round trip may still take behind a
transaction pooler: the `BEGIN` and its `SET LOCAL`s' own time on the server and the network."""


class PoolerWaitPassed(StoreTimeoutError):
    """`StoreTimeoutError(what="pool")` of a transaction's first round trip behind a
    transaction pooler: its connection was dropped (a disconnect, `postgresql.is_disconnect`:
    never handed out again)."""


class BeginWait:
    """What bounds a transaction's first round trip behind a transaction pooler, kept on the
    connection (`agboss_wait`): the pooler holds that query until one of its server
    connections is free, a wait PgBouncer bounds by its own `query_wait_timeout` only. Ours
    is `Timeouts.pool_ms` (`SERVER_WAIT_MARGIN_S` more for the round trip itself)."""

    __slots__ = ("begin", "bounds", "dropped", "pool_ms", "seconds")

    def __init__(self, timeouts: Timeouts) -> None:
        self.dropped = False  # the connection was closed by this bound
        self.pool_ms = timeouts.pool_ms
        self.seconds = timeouts.pool_ms / 1000 + SERVER_WAIT_MARGIN_S
        self.bounds = bounds_sql(timeouts).encode()
        self.begin = begin_sql(timeouts).encode()

    def timed_out(self) -> Exception:
        return PoolerWaitPassed(
            "pool",
            self.pool_ms,
            f"the pooler lent no server connection (or the server did not answer BEGIN) "
            f"within {self.pool_ms} ms (Timeouts.pool_ms, {SERVER_WAIT_MARGIN_S} s more for "
            "the round trip); the connection was dropped; nothing was committed",
        )


def bounded_begin(pgconn: Any, query: bytes, wait: BeginWait, encoding: str) -> Any:
    """A psycopg generator (`PQGen`): `query` (a `BEGIN` with its bounds, one simple-protocol
    query) sent on `pgconn` and answered within `wait.seconds`, else `pgconn` closed (never
    reused: the pooler may still lend it a server connection) and `wait.timed_out()` raised.
    Nothing before this query is in its transaction, so nothing committed is ever reported
    as not committed. The deadline is checked each time psycopg's wait resumes the generator,
    which it does every 0.1 s when nothing arrives (its `_WAIT_INTERVAL`)."""
    from psycopg import errors, generators, pq

    deadline = time.monotonic() + wait.seconds
    pgconn.send_query(query)
    running = generators.execute(pgconn)
    try:
        state = next(running)
        while True:
            ready = yield state
            if not ready and time.monotonic() >= deadline:
                pgconn.finish()
                wait.dropped = True
                raise wait.timed_out()
            state = running.send(ready)
    except StopIteration as done:
        results = done.value
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(result, encoding=encoding)


_pooled_classes: dict[Any, Any] = {}


def pooled_class(base: Any) -> Any:
    """`base` (psycopg's async connection class) whose implicit `BEGIN` (outside autocommit,
    before a transaction's first statement) also sets the transaction's bounds and is bounded
    by `Timeouts.pool_ms` (`bounded_begin`), read from the connection's `agboss_wait` (a
    `BeginWait`)."""
    made = _pooled_classes.get(base)
    if made is not None:
        return made
    from psycopg import pq

    idle = pq.TransactionStatus.IDLE

    class PooledConnection(base):  # type: ignore[misc]
        def _start_query(self) -> Any:
            wait = getattr(self, "agboss_wait", None)
            if (
                wait is None
                or self._autocommit
                or self._pipeline
                or self.pgconn.transaction_status != idle
            ):
                return (yield from super()._start_query())
            self._check_connection_ok()
            # One query of several statements (psycopg's own `_exec_command` takes one).
            query = self._get_tx_start_command() + b"; " + wait.bounds
            yield from bounded_begin(self.pgconn, query, wait, self.pgconn._encoding)
            return None

        async def rollback(self) -> None:
            # SQLAlchemy rolls back after an error outside its transactions (its first
            # connection's set-up query): after `bounded_begin` dropped the connection there
            # is nothing to roll back, and the error it raised must not be replaced by
            # "the connection is closed".
            wait = getattr(self, "agboss_wait", None)
            if wait is not None and wait.dropped:
                return
            await super().rollback()

    PooledConnection.__name__ = PooledConnection.__qualname__ = f"Pooled{base.__name__}"
    _pooled_classes[base] = PooledConnection
    return PooledConnection


# --- the direct mode: bounds that did not arrive are refused ------------------------------

_checked: set[tuple[Any, ...]] = set()
_checked_guard = threading.Lock()

CHECK_SQL = (
    "SELECT setting FROM pg_settings WHERE name IN ('statement_timeout', 'lock_timeout') "
    "ORDER BY name DESC"
)
"""The session's statement and lock timeouts, in ms (in that order)."""


def check_key(args: dict[str, Any]) -> tuple[Any, ...]:
    """Where a connection of libpq arguments `args` lands: its server and database."""
    return (args.get("host"), args.get("port"), args.get("dbname"), args.get("user"))


def needs_check(key: tuple[Any, ...]) -> bool:
    """Whether connections to `key` have not yet shown their bounds arrive."""
    return key not in _checked


def checked(key: tuple[Any, ...], rows: Any, timeouts: Timeouts, where: str) -> None:
    """Record that `key`'s sessions get their bounds, from `rows` (`CHECK_SQL`'s answer on
    a new connection); `BoundsDroppedError` when they did not arrive."""
    found = [str(row[0]) for row in rows or ()]
    wanted = [str(timeouts.statement_ms), str(timeouts.lock_ms)]
    if found != wanted:
        raise BoundsDroppedError(
            f"the session on {where} has statement_timeout and lock_timeout {found} ms, not "
            f"the {wanted} ms sent as startup options: a pooler in between (PgBouncer with "
            "ignore_startup_parameters = options?) dropped them, and every wait would be "
            f"unbounded. Behind a transaction pooler add ?{POOLING_OPTION}={TRANSACTION} to "
            "the URL (docs/operations.md, 'Running behind PgBouncer'); else connect to the "
            "server directly"
        )
    with _checked_guard:
        _checked.add(key)


# --- SQLAlchemy's own engines (migrations) -----------------------------------------------


def _strip_option(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    """A SQLAlchemy engine on a URL with `POOLING_OPTION` (a migration's): the option is
    ours, not libpq's, and its connections prepare no statement (psycopg)."""
    value = cparams.pop(POOLING_OPTION, None)
    if value is None or dialect.name != "postgresql":
        return
    if value != TRANSACTION:
        raise ValueError(f"{POOLING_OPTION}={value!r}: the only pooling mode is {TRANSACTION}")
    if dialect.driver == "psycopg":
        cparams["prepare_threshold"] = None


def install_engine_hook() -> None:
    """Let every SQLAlchemy engine of this process connect with a URL naming the pooling
    mode (once; the hook touches only connections whose arguments carry the option)."""
    import sqlalchemy as sa

    if not sa.event.contains(sa.engine.Engine, "do_connect", _strip_option):
        sa.event.listen(sa.engine.Engine, "do_connect", _strip_option)
