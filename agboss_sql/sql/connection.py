"""`SqlConnection`: one per application instance; runs atomic steps at the driver's floor,
every wait bounded.

Statements are written once with SQLAlchemy Core and compiled once per
dialect; each execution then goes straight to the async driver (psycopg,
aiomysql) or, for SQLite, to the stdlib driver, inline on the event loop's
thread. An atomic step is written once as a generator of statements
(`Step`): on SQLite the whole step runs inline, without a thread hop, inside
`BEGIN IMMEDIATE` (a statement that finds the database locked by another
connection is retried after an async sleep, so the loop never blocks on the
write lock); on a server each statement is one await on one pooled
connection, inside `BEGIN … COMMIT` when the step needs a transaction. A
single-statement operation is sent alone, in autocommit: no `BEGIN`/`COMMIT`
round trips around it.

The statements are compiled by `statements.StatementCache`; a runner sends them, through
one interface (`_runner.Runner`): `_inline_runner.InlineRunner` for SQLite,
`_pool_runner.PoolRunner` for a server, chosen once by the dialect. Transient conflicts
(deadlock, serialization failure) roll the step back and run it again with backoff
(`_backoff`), for at most `Timeouts.retry_ms`; they never surface as a wrong answer.
Every wait is bounded by `Timeouts` and ends in a typed error: a `StoreTimeoutError`
naming the wait, a `StoreUnavailableError` when nothing was applied, or a
`CommitOutcomeUnknownError` when the answer to COMMIT (or to an autocommit write) never
came — such a step is never run again blindly.

What each call sends (what the statement listener sees), on every dialect
unless noted:

- `execute(statement)`, `insert_if_absent(statement)`, `ping()`: the statement
  alone, in autocommit. No `BEGIN`/`COMMIT` (SQLite runs it in its implicit
  transaction; a writer blocked by another connection's write lock waits, with
  async sleeps, up to the busy timeout).
- `run(step)` (`transaction=True`): `BEGIN` (SQLite `BEGIN IMMEDIATE`, which
  takes the write lock first), the step's statements, `COMMIT`; when the step
  or a statement raises, `ROLLBACK` instead of `COMMIT` (none after a
  cancellation on a server: the connection is closed instead, which rolls back).
- `run(step, transaction=False)`: the step's statements, each in autocommit.
- `transaction()`: on a server, SQLAlchemy's `BEGIN`/`COMMIT`/`ROLLBACK` (not seen by
  the listener); the connection of a committed transaction is kept checked out for the
  next one (no pool round trip; aiomysql's reset `ROLLBACK` comes only after a failed
  one). On SQLite, the inline runner's `BEGIN IMMEDIATE`, `COMMIT` or `ROLLBACK` on its
  work connection (seen by the listener). The caller's own statements are not seen.
- `drive_on(tx, step)`: the step's statements, in the caller's transaction.
- a retried step sends all of it again, once per attempt. Retried (only a step
  given as a factory): a transient conflict in a transaction step, or in a
  transaction-less step before any of its statements applied; a lost
  connection in a transaction step before its `COMMIT` was sent (the server
  rolled it back), or in a step that sent only reads. A lost connection after
  COMMIT or an autocommit write was sent surfaces as `CommitOutcomeUnknownError`.
- a new pooled connection costs its handshake only (psycopg and aiomysql send no
  set-up statement); an idle one is checked without a round trip before reuse
  (`is_usable`: open, outside any transaction, nothing unread from the server).
  SQLite's single connection sets its pragmas once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agboss_sql._dialects import (
    Capabilities,
    Dialect,
    dialect_for,
    inline_dialect,
    server_dialect,
)
from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import (
    AgbossError,
    CommitOutcomeUnknownError,
    StoreReadOnlyError,
    StoreRefusedError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from agboss_sql.sql._backoff import back_off
from agboss_sql.sql._deadline import DeadlinePassed
from agboss_sql.sql._inline_runner import InlineRunner
from agboss_sql.sql._pool_runner import PoolRunner
from agboss_sql.sql._progress import Progress
from agboss_sql.sql._runner import Lane, Runner
from agboss_sql.sql.statements import (
    Compiled,
    Exec,
    Result,
    SqlBuilder,
    StatementCache,
    StatementListener,
    Step,
    Suffixed,
)

T = TypeVar("T")
S = TypeVar("S")

MAX_ATTEMPTS = 12


def normalize_url(url: str | URL) -> URL:
    """A plain URL (`sqlite:///…`, `postgresql://…`, `mysql://…`) as its async-driver URL."""
    parsed = make_url(url)
    try:
        dialect = dialect_for(parsed.get_backend_name())
    except ValueError:
        raise ValueError(
            f"unsupported database URL {parsed!r}: use sqlite, postgresql or mysql"
        ) from None
    return parsed.set(drivername=f"{dialect.NAME}+{dialect.ASYNC_DRIVER}")


class SqlConnection:
    """The database of one application instance: a runner for the stores' atomic steps
    (SQLite inline, or a server's raw-driver pool), and (lazily) a SQLAlchemy
    `AsyncEngine` for work that needs one. Every wait is bounded by `timeouts`.

    `async with SqlConnection(url) as connection:` closes it on exit."""

    def __init__(
        self,
        url: str | URL,
        *,
        database: str | None = None,
        pool_size: int = 8,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.url = normalize_url(url)
        self.timeouts = timeouts if timeouts is not None else Timeouts()
        if not isinstance(self.timeouts, Timeouts):
            raise TypeError(f"timeouts must be a Timeouts, got {type(self.timeouts).__name__}")
        backend = self.url.get_backend_name()
        self.ops: Dialect = dialect_for(backend)
        self.dialect_name: str = self.ops.NAME
        self.backend = self.dialect_name if database is None else f"{self.dialect_name}:{database}"
        self._pool_size = pool_size
        self._cache = StatementCache(self.ops)
        self._runner: Runner
        if self.ops.CAPABILITIES.inline:
            self._runner = InlineRunner(
                inline_dialect(backend), self.url.database or "", self.timeouts, self._cache
            )
        else:
            self._runner = PoolRunner(
                server_dialect(backend), self.url, self.timeouts, self._cache, pool_size
            )
        self._engine: AsyncEngine | None = None
        self._closed = False

    @property
    def dialect(self) -> Dialect:
        """The database's dialect (what differs per database)."""
        return self.ops

    @property
    def capabilities(self) -> Capabilities:
        """What the database can do: the dialect's own until a server first answered, then
        that server's (resolved once per connection). Inside a step it is always resolved."""
        return self._runner.capabilities

    def pin_capabilities(self, capabilities: Capabilities) -> None:
        """Use `capabilities` from now on, whatever the server can do: to run a weaker
        server's statements (MySQL 8's, without `RETURNING`) on a stronger one (MariaDB)."""
        self._runner.pin(capabilities)

    def for_another_loop(self) -> SqlConnection:
        """A new connection to the same database with the same settings, for use on another
        event loop (pooled connections belong to the loop that opened them)."""
        database = self.backend.partition(":")[2] or None
        return SqlConnection(
            self.url, database=database, pool_size=self._pool_size, timeouts=self.timeouts
        )

    # --- statements -----------------------------------------------------------------

    def prepared(self, factory: Callable[[SqlBuilder], S], *, database_time: bool = False) -> S:
        """The statement set built by `factory` for this dialect, built once and reused."""
        return self._cache.prepared(factory, database_time=database_time)

    def compiled(self, statement: Any) -> Compiled:
        """`statement` compiled for this dialect, once per statement object."""
        return self._cache.compiled(statement)

    def add_statement_listener(self, listener: StatementListener) -> Callable[[], None]:
        """Call `listener(sql, params)` before every statement this connection sends
        (`BEGIN`/`COMMIT`/`ROLLBACK` included; `drive_on` reports the step's statements only).
        Returns a function that removes it."""
        listeners = self._cache.listeners
        listeners.append(listener)
        return lambda: listeners.remove(listener)

    # --- running steps ----------------------------------------------------------------

    async def execute(
        self,
        statement: Any,
        params: Mapping[str, Any] | None = None,
        *,
        priority: Lane | bool = False,
    ) -> Result:
        """Send one statement alone, in autocommit (retried on transient conflicts)."""
        runner = self._runner
        sent = params or {}
        started = time.monotonic()
        progress = Progress()
        try:
            return await runner.run_one(statement, sent, progress, priority)
        except Exception as exc:
            failure = exc
        return await self._after(
            failure,
            progress,
            lambda again: runner.run_one(statement, sent, again, priority),
            transaction=False,
            started=started,
        )

    async def insert_if_absent(self, statement: Any, params: Mapping[str, Any]) -> bool:
        """Send an `insert_if_absent` statement; True when it inserted the row."""
        try:
            return (await self.execute(statement, params)).rowcount == 1
        except Exception as exc:
            if self.capabilities.insert_if_absent_raises and self.ops.is_unique_violation(exc):
                return False
            raise

    async def run(
        self,
        step: Callable[[], Step[T]] | Step[T],
        *,
        transaction: bool = True,
        priority: Lane | bool = False,
    ) -> T:
        """Run an atomic step: in one transaction when `transaction`, else each statement in
        autocommit. A factory (a callable returning a fresh step) is re-run on a transient
        conflict; a bare generator cannot be re-run and is tried once. `priority` takes a
        server connection from that `Lane` (`True`: the takes' lane)."""
        runner = self._runner
        progress = Progress()
        if not callable(step):
            try:
                return await runner.run(step, transaction, progress, priority)
            except Exception as exc:
                raise self.translate(exc, transaction, progress) from exc
        factory = step
        started = time.monotonic()
        try:
            return await runner.run(factory(), transaction, progress, priority)
        except Exception as exc:
            failure = exc
        return await self._after(
            failure,
            progress,
            lambda again: runner.run(factory(), transaction, again, priority),
            transaction=transaction,
            started=started,
        )

    async def _after(
        self,
        exc: Exception,
        progress: Progress,
        once: Callable[[Progress], Awaitable[T]],
        *,
        transaction: bool,
        started: float,
    ) -> T:
        """The attempts after a first one (begun at `started`, on `time.monotonic()`) that
        failed with `exc`, having got as far as `progress`: `once(progress)` again after
        each transient conflict that applied nothing (`_may_retry`), with backoff, until it
        answers, at most `MAX_ATTEMPTS` attempts in all within `Timeouts.retry_ms` of
        `started`; the last failure raised typed (`translate`, or `conflicts_persisted` for
        a conflict that outlasted them). Kept off the first attempt's path."""
        give_up_at = started + self.timeouts.retry_ms / 1000
        attempt = 1
        while True:
            if not self._may_retry(exc, transaction, progress):
                raise self.translate(exc, transaction, progress) from exc
            if attempt >= MAX_ATTEMPTS or time.monotonic() >= give_up_at:
                raise self.conflicts_persisted(exc, attempt) from exc
            await back_off(attempt)
            attempt += 1
            progress = Progress()
            try:
                return await once(progress)
            except Exception as failed:
                exc = failed

    def _may_retry(self, exc: Exception, transaction: bool, progress: Progress) -> bool:
        """Whether running the step again can apply none of it twice."""
        if isinstance(exc, AgbossError | DeadlinePassed):
            return False
        if self.ops.is_retryable(exc):
            # The conflict undid the whole transaction, or the one statement it hit.
            return transaction or progress.applied == 0
        if self.ops.is_disconnect(exc):
            # The server rolls back a transaction whose session it lost before COMMIT.
            return not progress.committing and (transaction or not progress.sent_write)
        return False

    def conflicts_persisted(self, exc: Exception, attempts: int) -> StoreTimeoutError:
        """The typed error for a step still meeting transient conflicts (deadlocks,
        serialization failures) after `attempts` tries or `Timeouts.retry_ms`: nothing of it
        was applied."""
        return StoreTimeoutError(
            "retry",
            self.timeouts.retry_ms,
            f"transient conflicts on {self._safe_url()} persisted through {attempts} attempts "
            f"(Timeouts.retry_ms {self.timeouts.retry_ms} ms, last: {type(exc).__name__}: "
            f"{exc}); nothing was committed",
        )

    def translate(self, exc: Exception, transaction: bool, progress: Progress) -> Exception:
        """The typed error for a step that failed with `exc` after getting as far as
        `progress` (or `exc` itself: the step's own errors, and conflicts the caller may
        retry, pass through)."""
        if isinstance(exc, AgbossError):
            return exc
        ops = self.ops
        bounds = self.timeouts
        in_doubt = progress.committing or (not transaction and progress.sent_write)
        where = self._safe_url()
        if isinstance(exc, DeadlinePassed) or ops.is_disconnect(exc):
            what = (
                f"no answer from {where} within {bounds.statement_ms} ms"
                if isinstance(exc, DeadlinePassed)
                else f"lost the connection to {where}: {type(exc).__name__}: {exc}"
            )
            if in_doubt:
                return CommitOutcomeUnknownError(
                    f"{what}, after the write was sent: it may or may not have committed; "
                    "call the operation again once the database answers (it replays or "
                    "compares, never applies twice)"
                )
            if isinstance(exc, DeadlinePassed):
                return StoreTimeoutError(
                    "statement", bounds.statement_ms, f"{what}; nothing was committed"
                )
            return StoreUnavailableError(f"{what}; nothing was committed")
        if ops.is_lock_timeout(exc):
            return StoreTimeoutError(
                "lock",
                bounds.lock_ms,
                f"a lock on {where} was not granted within {bounds.lock_ms} ms "
                "(Timeouts.lock_ms): another session holds it; nothing was committed",
            )
        if ops.is_statement_timeout(exc):
            return StoreTimeoutError(
                "statement",
                bounds.statement_ms,
                f"a statement on {where} passed {bounds.statement_ms} ms "
                "(Timeouts.statement_ms); nothing was committed",
            )
        if isinstance(exc, sa.exc.TimeoutError):
            return StoreTimeoutError(
                "pool",
                bounds.pool_ms,
                f"no pooled connection to {where} within {bounds.pool_ms} ms "
                "(Timeouts.pool_ms); nothing was sent",
            )
        if ops.is_storage_full(exc):
            return StoreUnavailableError(
                f"{where} cannot write (storage full): {exc}; nothing was committed"
            )
        return self.read_only(exc) or self.refused(exc) or exc

    def read_only(self, exc: BaseException) -> StoreReadOnlyError | None:
        """The typed error of a write the server refused because it takes none now (a
        standby, a read-only session: `Dialect.is_read_only`), else `None`."""
        if isinstance(exc, AgbossError | DeadlinePassed) or not self.ops.is_read_only(exc):
            return None
        driver = self.ops.driver_error(exc) or exc
        said = str(driver).strip().splitlines()[0] if str(driver).strip() else ""
        return StoreReadOnlyError(
            f"{self._safe_url()} is read-only ({said}): it is a standby, or its sessions are "
            "read-only by default; nothing was committed: call again once the primary "
            "answers (a URL naming every server, with target_session_attrs=read-write, "
            "connects to the one promoted)"
        )

    def refused(self, exc: BaseException) -> StoreRefusedError | None:
        """The typed error of a statement the database refused with `exc` (a trigger, a
        constraint, a check), its driver's error as `orig`; `None` for anything else (not
        the driver's, or a failure `translate` types otherwise: a conflict, a lost
        connection, a bound, a full disk)."""
        if isinstance(exc, AgbossError | DeadlinePassed):
            return None
        ops = self.ops
        driver = ops.driver_error(exc)
        if driver is None or (
            ops.is_retryable(exc)
            or ops.is_disconnect(exc)
            or ops.is_lock_timeout(exc)
            or ops.is_statement_timeout(exc)
            or ops.is_busy(exc)
            or ops.is_storage_full(exc)
            or ops.is_read_only(exc)
        ):
            return None
        return StoreRefusedError(
            f"{self._safe_url()} refused a statement: {type(driver).__name__}: {driver}"
            f"; it was not applied",
            orig=driver,
        )

    def _safe_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    async def drive(self, raw: Any, step: Step[T], transaction: bool) -> T:
        """Run `step` on the raw server connection `raw` (in a transaction of its own when
        `transaction`, rolled back when the step or a statement raises). After a cancellation
        no `ROLLBACK` is sent (the connection may be mid-statement): close `raw`. On SQLite,
        `TypeError` (its steps run inline, on the runner's own connection)."""
        return await self._runner.drive(raw, step, transaction, Progress())

    async def drive_on(self, connection: AsyncConnection, step: Step[T]) -> T:
        """Run `step`'s statements on a SQLAlchemy connection's driver connection, inside the
        transaction the caller holds open on it (for work that shares our transaction), each
        under the same bounds as a step's; a server connection past its statement deadline
        is invalidated (SQLAlchemy never hands it out again). A statement the database
        refused is a `StoreRefusedError` (`refused`)."""
        try:
            return await self._runner.drive_on(connection, step)
        except Exception as exc:
            refused = self.read_only(exc) or self.refused(exc)
            if refused is None:
                raise
            raise refused from exc

    async def execute_on(
        self, connection: AsyncConnection, statement: Any, params: Mapping[str, Any]
    ) -> Result:
        """`drive_on` of a one-statement step, without the step: one statement in the
        caller's transaction (the hot path of a fenced effect's own statements)."""
        try:
            return await self._runner.execute_on(connection, statement, params)
        except Exception as exc:
            refused = self.read_only(exc) or self.refused(exc)
            if refused is None:
                raise
            raise refused from exc

    # --- SQLAlchemy engine, for work that wants an AsyncConnection -------------------------

    @property
    def engine(self) -> AsyncEngine:
        """A SQLAlchemy async engine on the same database (created on first use), under the
        same `timeouts`."""
        if self._closed:
            raise StoreUnavailableError("the connection is closed")
        if self._engine is None:
            # Every user of this engine ends its transaction (SQLAlchemy's connection rolls an
            # open one back on close), so the pool's own reset would only add a ROLLBACK round
            # trip per checkin (aiomysql sends it even on an idle connection).
            options: dict[str, Any] = {
                "pool_pre_ping": False,
                "pool_reset_on_return": None,
                "pool_size": self._pool_size,
                "max_overflow": 0,  # `pool_size` caps the work's connections too
                **self.ops.engine_options(self.url, self.timeouts),
            }
            self._engine = self._runner.create_engine(self.url, options)
        return self._engine

    @property
    def transaction_engine(self) -> sa.Engine:
        """The synchronous SQLAlchemy engine under the connections `transaction()` hands
        out, for its events: `engine.sync_engine` on a server; on SQLite, the engine of
        the inline work connection (its events see the caller's statements only: the
        `BEGIN IMMEDIATE`/`COMMIT`/`ROLLBACK` go to the statement listeners)."""
        return self._runner.transaction_engine(self._the_engine)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A SQLAlchemy connection in a transaction that took the write lock first on SQLite
        (`BEGIN IMMEDIATE`); committed on success, rolled back on any exception. Failures
        come out typed (`StoreUnavailableError`, `StoreTimeoutError`,
        `CommitOutcomeUnknownError` when COMMIT got no answer); transient conflicts pass
        through for the caller's retry (`is_transient`).

        On SQLite the connection is an `InlineWorkConnection` (an `AsyncConnection` whose
        calls run at once on the loop's thread, on the runner's work connection): one such
        transaction at a time per `SqlConnection`, the next waiting up to `lock_ms`. Its
        `BEGIN IMMEDIATE`/`COMMIT`/`ROLLBACK` are seen by the statement listeners; on a
        server they are SQLAlchemy's and are not. On a server, the connection of a committed
        transaction is kept checked out for the next one."""
        return self._runner.transaction(self._the_engine, self._translate_in_transaction)

    def _the_engine(self) -> AsyncEngine:
        return self.engine

    def _translate_in_transaction(self, exc: Exception, progress: Progress) -> Exception:
        return self.translate(exc, True, progress)

    def is_transient(self, exc: BaseException) -> bool:
        """A conflict that undid the whole transaction: running it again is safe."""
        return self.ops.is_retryable(exc)

    async def run_in_transaction(
        self, body: Callable[[AsyncConnection], Any], *, attempts: int = MAX_ATTEMPTS
    ) -> Any:
        """`await body(connection)` in a transaction, run again on a transient conflict."""
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self.transaction() as connection:
                    return await body(connection)
            except Exception as exc:
                if attempt >= attempts or not self.ops.is_retryable(exc):
                    raise
            await back_off(attempt)

    async def ping(self) -> None:
        """Return when the database answers a trivial statement."""
        await self.execute("SELECT 1")

    def forget(self) -> None:
        """Close this connection's idle connections without its event loop (that loop has
        ended: a saver used from several threads' loops drops the dead ones' this way);
        later calls fail with `StoreUnavailableError`."""
        self._closed = True
        self._runner.forget()

    async def close(self) -> None:
        """Close every connection; later calls fail with `StoreUnavailableError`. Steps
        already running finish, and their connections are closed when they return them."""
        if self._closed:
            return
        self._closed = True
        await self._runner.close()
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def __aenter__(self) -> SqlConnection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"SqlConnection({self.url.render_as_string(hide_password=True)!r})"


__all__ = [
    "MAX_ATTEMPTS",
    "Compiled",
    "Exec",
    "Result",
    "SqlBuilder",
    "SqlConnection",
    "StatementListener",
    "Step",
    "Suffixed",
    "Timeouts",
    "normalize_url",
]
