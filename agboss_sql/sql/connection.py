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

The statements are compiled by `statements.StatementCache`; a runner sends them:
`_inline_runner.InlineRunner` for SQLite, `_pool_runner.PoolRunner` for a server.
Transient conflicts (deadlock, serialization failure) roll the step back and run it
again with backoff, for at most `Timeouts.retry_ms`; they never surface as a wrong
answer. Every wait is bounded by `Timeouts` and ends in a typed error: a
`StoreTimeoutError` naming the wait, a `StoreUnavailableError` when nothing was applied,
or a `CommitOutcomeUnknownError` when the answer to COMMIT (or to an autocommit write)
never came — such a step is never run again blindly.

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

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

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
    StoreTimeoutError,
    StoreUnavailableError,
)
from agboss_sql.sql._inline_runner import InlineRunner, InlineWorkConnection
from agboss_sql.sql._pool_runner import GRACE_S, DeadlinePassed, PoolRunner
from agboss_sql.sql._progress import Progress, feed
from agboss_sql.sql.statements import (
    Compiled,
    Exec,
    Result,
    SqlBuilder,
    StatementCache,
    StatementListener,
    Step,
    Suffixed,
    single,
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
        self._runner: InlineRunner | PoolRunner
        if self.ops.CAPABILITIES.inline:
            self._runner = InlineRunner(
                inline_dialect(backend), self.url.database or "", self.timeouts, self._cache
            )
        else:
            self._runner = PoolRunner(
                server_dialect(backend), self.url, self.timeouts, self._cache, pool_size
            )
        self._engine: AsyncEngine | None = None
        self._kept: list[tuple[sa.Connection, AsyncConnection]] = []
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
        self._runner.capabilities = capabilities
        if isinstance(self._runner, PoolRunner):
            self._runner.pinned = True

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
        self, statement: Any, params: Mapping[str, Any] | None = None, *, priority: bool = False
    ) -> Result:
        """Send one statement alone, in autocommit (retried on transient conflicts)."""
        runner = self._runner
        if isinstance(runner, InlineRunner):
            # SQLite has no transient conflicts (a locked database is waited for inside the
            # runner): nothing to run again, so no step to build.
            try:
                return await runner.run_one(statement, params or {})
            except Exception as exc:
                raise self.translate(exc, False, Progress()) from exc
        return await self._attempts(
            lambda progress: runner.run_one(statement, params or {}, progress, priority),
            transaction=False,
            retryable=True,
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
        priority: bool = False,
    ) -> T:
        """Run an atomic step: in one transaction when `transaction`, else each statement in
        autocommit. A factory (a callable returning a fresh step) is re-run on a transient
        conflict; a bare generator cannot be re-run and is tried once. `priority` takes a
        server connection from the lane kept for lease operations."""
        factory = step if callable(step) else None
        runner = self._runner

        def once(progress: Progress) -> Awaitable[T]:
            current = factory() if factory is not None else step
            if isinstance(runner, InlineRunner):
                return runner.run(current, transaction, progress)  # type: ignore[arg-type]
            return runner.run(current, transaction, progress, priority)  # type: ignore[arg-type]

        return await self._attempts(once, transaction=transaction, retryable=factory is not None)

    async def _attempts(
        self,
        once: Callable[[Progress], Awaitable[T]],
        *,
        transaction: bool,
        retryable: bool,
    ) -> T:
        """`once(progress)` until it answers; when `retryable`, again after a transient
        conflict that applied nothing (`_may_retry`), at most `MAX_ATTEMPTS` times within
        `Timeouts.retry_ms`; its errors translated (`translate`)."""
        attempt = 0
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.timeouts.retry_ms / 1000
        while True:
            attempt += 1
            progress = Progress()
            try:
                return await once(progress)
            except Exception as exc:
                if (
                    not retryable
                    or attempt >= MAX_ATTEMPTS
                    or loop.time() >= give_up_at
                    or not self._may_retry(exc, transaction, progress)
                ):
                    if retryable and self._may_retry(exc, transaction, progress):
                        raise self.conflicts_persisted(exc, attempt) from exc
                    raise self.translate(exc, transaction, progress) from exc
            await asyncio.sleep(min(0.2, 0.002 * 2**attempt) * random.uniform(0.5, 1.5))

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
        return exc

    def _safe_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    async def drive(self, raw: Any, step: Step[T], transaction: bool) -> T:
        """Run `step` on the raw server connection `raw` (in a transaction of its own when
        `transaction`, rolled back when the step or a statement raises). After a cancellation
        no `ROLLBACK` is sent (the connection may be mid-statement): close `raw`."""
        runner = self._runner
        if not isinstance(runner, PoolRunner):
            raise TypeError("drive() takes a server connection; SQLite runs steps inline")
        return await runner.drive(raw, step, transaction, Progress())

    async def drive_on(self, connection: AsyncConnection, step: Step[T]) -> T:
        """Run `step`'s statements on a SQLAlchemy connection's driver connection, inside the
        transaction the caller holds open on it (for work that shares our transaction)."""
        runner = self._runner
        progress = Progress()
        if isinstance(connection, InlineWorkConnection):
            assert isinstance(runner, InlineRunner)
            return await feed(self._cache, step, connection.raw, runner.execute, progress)
        raw = await _driver_connection(connection)
        try:
            if isinstance(runner, PoolRunner):
                return await feed(self._cache, step, raw, runner.bounded_execute, progress)
            return await feed(self._cache, step, raw, _aiosqlite_execute, progress)
        except DeadlinePassed:
            # The socket is gone: SQLAlchemy must not hand this connection out again.
            await connection.invalidate()
            raise

    async def execute_on(
        self, connection: AsyncConnection, statement: Any, params: Mapping[str, Any]
    ) -> Result:
        """`drive_on` of a one-statement step, without the step: one statement in the
        caller's transaction (the hot path of a fenced effect's own statements)."""
        if isinstance(connection, InlineWorkConnection):
            runner = self._runner
            assert isinstance(runner, InlineRunner)
            cache = self._cache
            compiled = cache.compiled(statement)
            sent = cache.params(compiled, params)
            if cache.listeners:
                cache.notify(compiled.sql, sent)
            rows, count = await runner.execute(connection.raw, compiled.sql, sent)
            return Result(rows, count)
        return await self.drive_on(connection, single(statement, params)())

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
            if not self.capabilities.inline:
                options["async_creator"] = self._bounded_creator(options["async_creator"])
            self._engine = create_async_engine(self.url, **options)
            begin = self.ops.BEGIN
            if begin != "BEGIN":
                _begin_with(self._engine, begin)
            if not self.capabilities.inline:
                _statement_deadlines(self._engine, self.timeouts)
        return self._engine

    @property
    def transaction_engine(self) -> sa.Engine:
        """The synchronous SQLAlchemy engine under the connections `transaction()` hands
        out, for its events: `engine.sync_engine` on a server; on SQLite, the engine of
        the inline work connection (its events see the caller's statements only: the
        `BEGIN IMMEDIATE`/`COMMIT`/`ROLLBACK` go to the statement listeners)."""
        runner = self._runner
        if isinstance(runner, InlineRunner):
            if self._closed:
                raise StoreUnavailableError("the connection is closed")
            return runner.work_engine
        return self.engine.sync_engine

    def _bounded_creator(self, create: Callable[[], Any]) -> Callable[[], Any]:
        """`create` (a new driver connection for the engine) bounded by `connect_ms`."""
        bound_ms = self.timeouts.connect_ms
        where = self._safe_url()

        async def bounded() -> Any:
            try:
                async with asyncio.timeout(bound_ms / 1000):
                    return await create()
            except TimeoutError:
                raise StoreTimeoutError(
                    "connect",
                    bound_ms,
                    f"no connection to {where} within {bound_ms} ms (Timeouts.connect_ms); "
                    "nothing was sent",
                ) from None

        return bounded

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
        server they are SQLAlchemy's and are not."""
        runner = self._runner
        if isinstance(runner, InlineRunner):
            if self._closed:
                raise StoreUnavailableError("the connection is closed")
            return runner.transaction(self._the_engine, self._translate_in_transaction)
        return self._server_transaction()

    def _the_engine(self) -> AsyncEngine:
        return self.engine

    def _translate_in_transaction(self, exc: Exception, progress: Progress) -> Exception:
        return self.translate(exc, True, progress)

    @contextlib.asynccontextmanager
    async def _server_transaction(self) -> AsyncIterator[AsyncConnection]:
        progress = Progress()
        progress.sent_write = True
        deadline = _Deadline()
        engine = self.engine
        kept = self._kept
        try:
            if kept:
                # A connection the last transaction left idle (no BEGIN is sent: the driver
                # begins with the first statement).
                sync, connection = kept.pop()
                sync.info[_DEADLINE] = deadline
                sync.begin()
            else:
                # Checkout and BEGIN in one hop into SQLAlchemy's greenlet.
                sync = await greenlet_spawn(_connect_and_begin, engine.sync_engine, deadline)
                connection = AsyncConnection(engine, sync)
            # The info dict lives with the driver connection, across checkouts: the
            # deadline is this transaction's only while it runs.
            info = sync.info
            try:
                try:
                    yield connection
                except BaseException as exc:
                    _end_deadline(info, deadline)
                    if self._unusable_after(exc):
                        await self._drop(connection)
                    else:
                        with contextlib.suppress(Exception):
                            await self._bounded_on(connection, connection.rollback)
                    raise
                _end_deadline(info, deadline)
                progress.committing = True
                try:
                    await self._bounded_on(connection, connection.commit)
                except BaseException as exc:
                    if self._unusable_after(exc):
                        await self._drop(connection)
                    raise
                if len(kept) < _KEPT_CONNECTIONS and not self._closed:
                    # Kept checked out for the next transaction: no pool round trip.
                    kept.append((sync, connection))
                    return
            finally:
                _end_deadline(info, deadline)
                if not sync.closed and (sync, connection) not in kept:
                    await greenlet_spawn(sync.close)
        except asyncio.CancelledError as exc:
            if not deadline.expired:
                raise
            # Our own statement deadline cancelled the task: a typed error, unless its
            # caller cancelled it too (then the caller's cancellation wins).
            task = asyncio.current_task()
            if task is not None and task.uncancel() > 0:
                raise
            raise self.translate(DeadlinePassed(str(exc)), True, progress) from None
        except Exception as exc:
            if self.ops.is_retryable(exc):
                raise
            raise self.translate(exc, True, progress) from exc

    def _unusable_after(self, exc: BaseException) -> bool:
        """Whether a server connection must never be handed out again after `exc`: a
        cancellation may have left it mid-statement (aiomysql then answers every later call
        on it with "Cancelled during execution"), and a disconnect left nothing to reuse."""
        if self.capabilities.inline:
            return False
        if isinstance(exc, asyncio.CancelledError):
            return True
        return isinstance(exc, Exception) and self.ops.is_disconnect(exc)

    async def _drop(self, connection: AsyncConnection) -> None:
        """Close the driver connection under `connection` at once (no ROLLBACK on it: the
        server rolls the session's transaction back when the socket closes) and invalidate
        it, so the pool opens a fresh one; each part bounded by `GRACE_S`."""
        runner = self._runner
        with contextlib.suppress(Exception):
            raw = (await connection.get_raw_connection()).driver_connection
            if isinstance(runner, PoolRunner):
                await asyncio.wait_for(runner.dialect.close(raw), GRACE_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.invalidate(), GRACE_S)

    async def _bounded_on(
        self, connection: AsyncConnection, call: Callable[[], Awaitable[None]]
    ) -> None:
        """`await call()` (a COMMIT or ROLLBACK on `connection`), bounded like a statement."""
        runner = self._runner
        if isinstance(runner, PoolRunner):
            raw = await _driver_connection(connection)
            try:
                await runner.bounded(call(), raw)
            except DeadlinePassed:
                await connection.invalidate()
                raise
        else:
            await call()

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
            await asyncio.sleep(min(0.2, 0.002 * 2**attempt) * random.uniform(0.5, 1.5))

    async def ping(self) -> None:
        """Return when the database answers a trivial statement."""
        await self.execute("SELECT 1")

    async def close(self) -> None:
        """Close every connection; later calls fail with `StoreUnavailableError`. Steps
        already running finish, and their connections are closed when they return them."""
        if self._closed:
            return
        self._closed = True
        await self._runner.close()
        kept, self._kept = self._kept, []
        for sync, _ in kept:
            with contextlib.suppress(Exception):
                await greenlet_spawn(sync.close)
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


async def _aiosqlite_execute(
    raw: Any, sql: str, params: Mapping[str, Any] | None
) -> tuple[list[Any] | None, int]:
    cursor = await raw.execute(sql, params if params is not None else ())
    try:
        rows = await cursor.fetchall() if cursor.description is not None else None
        return rows, cursor.rowcount
    finally:
        await cursor.close()


_DEADLINE = "agboss.deadline"

_KEPT_CONNECTIONS = 1
"""How many of the engine's connections `transaction()` keeps checked out while idle, for the
next transaction (the rest of the pool stays free for other users of the engine)."""


async def _driver_connection(connection: AsyncConnection) -> Any:
    """The driver connection under `connection`: read directly while it is valid (no hop
    into SQLAlchemy's greenlet), else through `get_raw_connection` (which may reconnect)."""
    sync = connection.sync_connection
    if sync is not None and not sync.invalidated:
        return sync.connection.driver_connection
    return (await connection.get_raw_connection()).driver_connection


def _connect_and_begin(engine: sa.Engine, deadline: _Deadline) -> sa.Connection:
    """A pooled connection with `deadline` as its statements' deadline, in a transaction
    (run in SQLAlchemy's greenlet)."""
    connection = engine.connect()
    try:
        connection.info[_DEADLINE] = deadline
        connection.begin()
    except BaseException:
        connection.info.pop(_DEADLINE, None)
        connection.close()
        raise
    return connection


def _end_deadline(info: dict[Any, Any], deadline: _Deadline) -> None:
    """No statement deadline for this transaction any more (none is in flight)."""
    info.pop(_DEADLINE, None)
    if deadline.timer is not None:
        deadline.timer.cancel()
        deadline.timer = None


class _Deadline:
    """The statement deadline of one engine transaction: the timer of the statement in
    flight, and whether it went off."""

    __slots__ = ("expired", "timer")

    def __init__(self) -> None:
        self.expired = False
        self.timer: asyncio.TimerHandle | None = None


def _statement_deadlines(engine: AsyncEngine, timeouts: Timeouts) -> None:
    """Bound every statement the work sends on the engine's connections, as the runners
    bound their own: a statement still unanswered `statement_ms` (and a grace) after it
    was sent cancels the transaction's task; the driver drops the connection (see the
    dialects' `connect`), and `transaction()` turns the cancellation into a typed error. A
    statement the server ends at its own timeout answers first."""
    seconds = timeouts.statement_ms / 1000 + GRACE_S

    def expire(deadline: _Deadline, task: asyncio.Task[Any]) -> None:
        deadline.expired = True
        task.cancel()

    @sa.event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _arm(connection: Any, *_args: Any) -> None:
        deadline = connection.info.get(_DEADLINE)
        task = asyncio.current_task()
        if deadline is None or task is None:
            return
        deadline.timer = asyncio.get_running_loop().call_later(seconds, expire, deadline, task)

    def _disarm(connection: Any, *_args: Any) -> None:
        if connection is None:
            return
        deadline = connection.info.get(_DEADLINE)
        if deadline is not None and deadline.timer is not None:
            deadline.timer.cancel()
            deadline.timer = None

    sa.event.listen(engine.sync_engine, "after_cursor_execute", _disarm)
    sa.event.listen(engine.sync_engine, "handle_error", lambda context: _disarm(context.connection))


def _begin_with(engine: AsyncEngine, begin: str) -> None:
    """Make the engine's transactions open with `begin` (SQLite's `BEGIN IMMEDIATE`:
    pysqlite's own BEGIN is deferred and would take the write lock only at the first
    write). The connections come from the dialect's inline creator: no implicit
    transactions, busy timeout 0 (a locked database is waited for with async sleeps)."""

    @sa.event.listens_for(engine.sync_engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)


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
