"""`SqlConnection`: one per application instance; runs atomic steps at the driver's floor.

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

Transient conflicts (deadlock, serialization failure, lock timeout,
`SQLITE_BUSY`) roll the step back and run it again with backoff; they never
surface as a wrong answer.

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
- `drive_on(tx, step)`: the step's statements, in the caller's transaction (its
  `BEGIN`/`COMMIT` are SQLAlchemy's and not seen by the listener).
- a retried step sends all of it again, once per attempt. Retried (only a step
  given as a factory): a transient conflict in a transaction step, or in a
  transaction-less step before any of its statements applied; a lost
  connection in a transaction step before its `COMMIT` was sent (the server
  rolled it back). A lost connection otherwise surfaces as
  `StoreUnavailableError`: an autocommit statement's outcome is unknown.
- a new pooled connection costs its handshake only (psycopg and aiomysql send no
  set-up statement); an idle one is checked without a round trip before reuse
  (`is_usable`: open, outside any transaction, nothing unread from the server).
  SQLite's single connection sets its pragmas once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agboss_sql._dialects import dialect_module
from agboss_sql.contracts.errors import StoreUnavailableError
from agboss_sql.sql.timeouts import Timeouts

T = TypeVar("T")
S = TypeVar("S")

MAX_ATTEMPTS = 12


@dataclass(frozen=True, slots=True)
class Exec:
    """One statement of a step, with its parameters."""

    statement: Any
    params: Mapping[str, Any]


class Result:
    """The rows a statement returned (if any) and the rows it changed or matched."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[Any] | None, rowcount: int) -> None:
        self.rows = rows if rows is not None else []
        self.rowcount = rowcount

    def first(self) -> Any | None:
        """The first row, or `None` when there is none."""
        return self.rows[0] if self.rows else None

    def scalar(self) -> Any | None:
        """The first column of the first row, or `None` when there is no row."""
        return self.rows[0][0] if self.rows else None


Step = Generator[Exec, Result, T]
"""An atomic step: yields statements, receives their results, returns its answer."""


class _Progress:
    """How far one attempt of a step got: statements applied, and whether COMMIT was sent."""

    __slots__ = ("applied", "committing")

    def __init__(self) -> None:
        self.applied = 0
        self.committing = False


@dataclass(frozen=True, slots=True)
class Suffixed:
    """A statement with text appended after compilation (a clause SQLAlchemy will not
    compile for this dialect, e.g. MariaDB's `INSERT … RETURNING`)."""

    statement: Any
    suffix: str


@dataclass(frozen=True, slots=True)
class Compiled:
    sql: str
    defaults: Mapping[str, Any]
    verbatim: bool = False  # a text statement, sent as written when it has no params


class SqlBuilder:
    """What a statement set needs to build its statements for one dialect."""

    def __init__(self, ops: ModuleType, database_time: bool) -> None:
        self.ops = ops
        self.dialect_name: str = ops.NAME
        self.database_time = database_time

    def now(self) -> tuple[Any, Any]:
        """`(source, now)`: a FROM to join (or `None`) and the statement's time, read once."""
        return self.ops.now_source(self.database_time)  # type: ignore[no-any-return]


StatementListener = Callable[[str, Mapping[str, Any]], None]


def normalize_url(url: str | URL) -> URL:
    """A plain URL (`sqlite:///…`, `postgresql://…`, `mysql://…`) as its async-driver URL."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend == "postgresql":
        return parsed.set(drivername="postgresql+psycopg")
    if backend in ("mysql", "mariadb"):
        return parsed.set(drivername="mysql+aiomysql")
    raise ValueError(f"unsupported database URL {parsed!r}: use sqlite, postgresql or mysql")


class SqlConnection:
    """The database of one application instance: the raw-driver pool for the stores'
    atomic steps, and (lazily) a SQLAlchemy `AsyncEngine` for work that needs one."""

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
        self.ops = dialect_module(self.url.get_backend_name())
        self.dialect_name: str = self.ops.NAME
        self.backend = self.dialect_name if database is None else f"{self.dialect_name}:{database}"
        self._dialect = self.ops.compile_dialect()
        self._compiled: dict[int, tuple[Any, Compiled]] = {}
        self._prepared: dict[tuple[Any, bool], Any] = {}
        self._listeners: list[StatementListener] = []
        self._pool_size = pool_size
        self._engine: AsyncEngine | None = None
        self._closed = False
        if self.dialect_name == "sqlite":
            database_path = self.url.database or ""
            if database_path in ("", ":memory:"):
                raise ValueError(
                    "sqlite:///:memory: is one database per connection: use a file "
                    "(instances sharing a store must share one file)"
                )
            Path(database_path).parent.mkdir(parents=True, exist_ok=True)
            self._sqlite_path = database_path
            self._sqlite_raw: Any = None
            self._sqlite_gate: asyncio.Lock | None = None
        else:
            self.is_mariadb: bool | None = None
            self._idle: list[Any] = []
            self._open = 0
            self._available: asyncio.Condition | None = None

    # --- statements -----------------------------------------------------------------

    def prepared(self, factory: Callable[[SqlBuilder], S], *, database_time: bool = False) -> S:
        """The statement set built by `factory` for this dialect, built once and reused."""
        cache_key: tuple[Any, bool] = (factory, database_time)
        found = self._prepared.get(cache_key)
        if found is None:
            found = factory(SqlBuilder(self.ops, database_time))
            self._prepared[cache_key] = found
        return found

    def compiled(self, statement: Any) -> Compiled:
        """`statement` compiled for this dialect, once per statement object. Its bind params'
        values (constant literals; `None` for a param with no value, which is how
        `insert(table)` fills columns not given) are defaults under the caller's params. A
        `str` is sent as written, in the driver's own paramstyle."""
        entry = self._compiled.get(id(statement))
        if entry is not None and entry[0] is statement:
            return entry[1]
        if isinstance(statement, str):
            compiled = Compiled(statement, {}, verbatim=True)
        elif isinstance(statement, Suffixed):
            inner = self.compiled(statement.statement)
            compiled = Compiled(inner.sql + statement.suffix, inner.defaults, inner.verbatim)
        else:
            result = statement.compile(dialect=self._dialect)
            if "__[POSTCOMPILE_" in result.string:
                raise ValueError(
                    "an expanding IN parameter cannot be sent to the raw driver: name one "
                    f"bind param per value instead ({result.string!r})"
                )
            compiled = Compiled(result.string, dict(result.params))
        # Keep the statement alive with its compiled form, so its id is never reused.
        self._compiled[id(statement)] = (statement, compiled)
        return compiled

    def add_statement_listener(self, listener: StatementListener) -> Callable[[], None]:
        """Call `listener(sql, params)` before every statement this connection sends
        (`BEGIN`/`COMMIT`/`ROLLBACK` included; `drive_on` reports the step's statements only).
        Returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _params(self, compiled: Compiled, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The params to send; `None` sends a text statement as written. A compiled statement
        always gets a mapping, even empty: the driver then reads its `%%` as `%`."""
        if not compiled.defaults:
            if compiled.verbatim and not params:
                return None
            return params
        merged = dict(compiled.defaults)
        merged.update(params)
        return merged

    def _notify(self, sql: str, params: Mapping[str, Any] | None) -> None:
        for listener in self._listeners:
            listener(sql, params if params is not None else {})

    # --- running steps ----------------------------------------------------------------

    async def execute(self, statement: Any, params: Mapping[str, Any] | None = None) -> Result:
        """Send one statement alone, in autocommit (retried on transient conflicts)."""
        return await self.run(_single(statement, params or {}), transaction=False)

    async def insert_if_absent(self, statement: Any, params: Mapping[str, Any]) -> bool:
        """Send an `insert_if_absent` statement; True when it inserted the row."""
        try:
            return (await self.execute(statement, params)).rowcount == 1
        except Exception as exc:
            if self.ops.INSERT_IF_ABSENT_RAISES and self.ops.is_unique_violation(exc):
                return False
            raise

    async def run(self, step: Callable[[], Step[T]] | Step[T], *, transaction: bool = True) -> T:
        """Run an atomic step: in one transaction when `transaction`, else each statement in
        autocommit. A factory (a callable returning a fresh step) is re-run on a transient
        conflict; a bare generator cannot be re-run and is tried once."""
        factory = step if callable(step) else None
        attempt = 0
        while True:
            attempt += 1
            current = factory() if factory is not None else step
            progress = _Progress()
            try:
                if self.dialect_name == "sqlite":
                    return await self._run_sqlite(current, transaction, progress)  # type: ignore[arg-type]
                return await self._run_server(current, transaction, progress)  # type: ignore[arg-type]
            except Exception as exc:
                if (
                    factory is None
                    or attempt >= MAX_ATTEMPTS
                    or not self._may_retry(exc, transaction, progress)
                ):
                    if self.ops.is_disconnect(exc):
                        raise StoreUnavailableError(
                            f"lost the connection to {self._safe_url()}: "
                            f"{type(exc).__name__}: {exc}"
                        ) from exc
                    raise
            await asyncio.sleep(min(0.2, 0.002 * 2**attempt) * random.uniform(0.5, 1.5))

    def _may_retry(self, exc: Exception, transaction: bool, progress: _Progress) -> bool:
        """Whether running the step again can apply none of it twice."""
        if self.ops.is_retryable(exc):
            # The conflict undid the whole transaction, or the one statement it hit.
            return transaction or progress.applied == 0
        if self.ops.is_disconnect(exc):
            # The server rolls back a transaction whose session it lost before COMMIT.
            return transaction and not progress.committing
        return False

    def _safe_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    # SQLite: the whole step inline, on the event loop's own thread.
    #
    # A SQLite statement costs tens of microseconds, less than a hop to another thread and
    # back, so the step runs right here, to the end, without yielding. The one wait SQLite
    # has is for the write lock (another connection's write transaction): the connection's
    # busy timeout is 0, and a busy statement is retried after an async sleep, so the loop
    # keeps serving the other connections, in this process too, while it waits.

    def _sqlite_connection(self) -> Any:
        if self._sqlite_raw is None:
            try:
                raw = self.ops.connect_sync(self._sqlite_path)
                raw.execute("PRAGMA busy_timeout = 0")
            except Exception as exc:
                raise StoreUnavailableError(
                    f"cannot open {self._sqlite_path!r}: {type(exc).__name__}: {exc}"
                ) from exc
            self._sqlite_raw = raw
        return self._sqlite_raw

    async def _sqlite_execute(
        self, raw: Any, sql: str, params: Mapping[str, Any] | None
    ) -> tuple[list[Any] | None, int]:
        """One statement; while the database is busy, wait (asynchronously) and send it again:
        a busy statement applied nothing."""
        try:
            return self.ops.execute_sync(raw, sql, params)  # type: ignore[no-any-return]
        except Exception as exc:
            if not self.ops.is_busy(exc):
                raise
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ops.BUSY_TIMEOUT_MS / 1000
        delay = 0.0005
        while True:
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            try:
                return self.ops.execute_sync(raw, sql, params)  # type: ignore[no-any-return]
            except Exception as exc:
                if not self.ops.is_busy(exc) or loop.time() >= deadline:
                    raise
            delay = min(delay * 2, 0.05)

    async def _run_sqlite(self, step: Step[T], transaction: bool, progress: _Progress) -> T:
        if self._sqlite_gate is None:
            self._sqlite_gate = asyncio.Lock()
        # Steps of this connection never interleave (a step may wait for the write lock).
        async with self._sqlite_gate:
            if self._closed:
                raise StoreUnavailableError("the connection is closed")
            answer = await self._drive_sqlite(step, transaction, progress)
        # A step that found the database free never suspended: give the loop one turn, so a
        # caller looping over store calls cannot starve the rest (a lease renewal, say).
        await asyncio.sleep(0)
        return answer

    async def _drive_sqlite(self, step: Step[T], transaction: bool, progress: _Progress) -> T:
        raw = self._sqlite_connection()
        execute = self._sqlite_execute
        listeners = self._listeners
        try:
            if transaction:
                if listeners:
                    self._notify(self.ops.BEGIN, {})
                await execute(raw, self.ops.BEGIN, None)
            answer = await self._feed(step, raw, execute, progress)
            if transaction:
                if listeners:
                    self._notify("COMMIT", {})
                progress.committing = True
                await execute(raw, "COMMIT", None)
        except BaseException:
            step.close()
            if raw.in_transaction:
                if listeners:
                    self._notify("ROLLBACK", {})
                with contextlib.suppress(Exception):
                    raw.execute("ROLLBACK")
                if raw.in_transaction:
                    # Still holding the write lock: drop the connection (closing rolls back).
                    self._sqlite_raw = None
                    with contextlib.suppress(Exception):
                        raw.close()
            raise
        return answer

    # Servers: one pooled raw connection per step.

    @contextlib.asynccontextmanager
    async def _raw(self) -> AsyncIterator[Any]:
        if self._closed:
            raise StoreUnavailableError("the connection is closed")
        raw = await self._checkout()
        reusable = False
        try:
            yield raw
            reusable = True
        except Exception as exc:
            # A failed step's connection is kept when alive and idle (its ROLLBACK done).
            reusable = not self.ops.is_disconnect(exc) and self._usable(raw)
            raise
        finally:
            # Cancelled mid-statement, the protocol state is unknown: the connection goes.
            await self._checkin(raw, reusable)

    def _usable(self, raw: Any) -> bool:
        try:
            return bool(self.ops.is_usable(raw))
        except Exception:
            return False

    async def _checkout(self) -> Any:
        """An idle connection still usable, else a new one while fewer than `pool_size` are
        open, else the next one returned."""
        if self._available is None:
            self._available = asyncio.Condition()
        available = self._available
        while True:
            async with available:
                try:
                    while not self._closed and not self._idle and self._open >= self._pool_size:
                        await available.wait()
                except BaseException:
                    # Woken and then cancelled, this waiter would swallow the wake-up meant for
                    # the connection just returned: pass it on.
                    available.notify()
                    raise
                if self._closed:
                    raise StoreUnavailableError("the connection is closed")
                raw = self._idle.pop() if self._idle else None
                if raw is None:
                    self._open += 1
            if raw is None:
                return await self._connect()
            if self._usable(raw):
                return raw
            await self._discard(raw)

    async def _connect(self) -> Any:
        """A new raw connection, for a slot already counted in `_open`."""
        try:
            raw = await self.ops.connect(self.url)
        except BaseException as exc:
            await self._release_slot()
            if not isinstance(exc, Exception):
                raise  # cancelled (e.g. a readiness timeout): never turned into an error
            raise StoreUnavailableError(
                f"cannot connect to {self._safe_url()}: {type(exc).__name__}: {exc}"
            ) from exc
        if self._closed:
            await self._discard(raw)
            raise StoreUnavailableError("the connection is closed")
        if self.dialect_name == "mysql" and self.is_mariadb is None:
            self.is_mariadb = "mariadb" in str(raw.get_server_info()).lower()
        return raw

    async def _release_slot(self) -> None:
        # The condition's lock is never held across an await: taking it does not suspend,
        # so a cancellation cannot interrupt this bookkeeping.
        assert self._available is not None
        async with self._available:
            self._open -= 1
            self._available.notify()

    async def _discard(self, raw: Any) -> None:
        await self._release_slot()
        with contextlib.suppress(Exception):
            await self.ops.close(raw)

    async def _checkin(self, raw: Any, reusable: bool) -> None:
        if reusable and not self._closed:
            assert self._available is not None
            async with self._available:
                self._idle.append(raw)
                self._available.notify()
        else:
            await self._discard(raw)

    async def _run_server(self, step: Step[T], transaction: bool, progress: _Progress) -> T:
        async with self._raw() as raw:
            return await self._drive(raw, step, transaction, progress)

    async def drive(self, raw: Any, step: Step[T], transaction: bool) -> T:
        """Run `step` on the raw driver connection `raw` (in a transaction of its own when
        `transaction`, rolled back when the step or a statement raises). After a cancellation
        no `ROLLBACK` is sent (the connection may be mid-statement): close `raw`."""
        return await self._drive(raw, step, transaction, _Progress())

    async def _drive(self, raw: Any, step: Step[T], transaction: bool, progress: _Progress) -> T:
        ops = self.ops
        execute = ops.execute
        listeners = self._listeners
        if transaction:
            if listeners:
                self._notify(ops.BEGIN, {})
            await ops.run_text(raw, ops.BEGIN)
        try:
            answer = await self._feed(step, raw, execute, progress)
            if transaction:
                if listeners:
                    self._notify("COMMIT", {})
                progress.committing = True
                await ops.run_text(raw, "COMMIT")
        except Exception:
            step.close()
            # A failed COMMIT ended the transaction already.
            if transaction and not progress.committing:
                if listeners:
                    self._notify("ROLLBACK", {})
                with contextlib.suppress(Exception):
                    await ops.run_text(raw, "ROLLBACK")
            raise
        except BaseException:
            step.close()
            raise
        return answer

    async def _feed(
        self,
        step: Step[T],
        raw: Any,
        execute: Callable[[Any, str, Mapping[str, Any] | None], Awaitable[tuple[Any, int]]],
        progress: _Progress,
    ) -> T:
        """Drive `step`: send each statement it yields through `execute` on `raw`, and feed
        its result back, until the step returns its answer."""
        listeners = self._listeners
        result: Result | None = None
        while True:
            try:
                request = step.send(result) if result is not None else next(step)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            compiled = self.compiled(request.statement)
            params = self._params(compiled, request.params)
            if listeners:
                self._notify(compiled.sql, params)
            rows, count = await execute(raw, compiled.sql, params)
            progress.applied += 1
            result = Result(list(rows) if rows is not None else None, count)

    async def drive_on(self, connection: AsyncConnection, step: Step[T]) -> T:
        """Run `step`'s statements on a SQLAlchemy connection's driver connection, inside the
        transaction the caller holds open on it (for work that shares our transaction)."""
        raw: Any = (await connection.get_raw_connection()).driver_connection
        execute = _aiosqlite_execute if self.dialect_name == "sqlite" else self.ops.execute
        return await self._feed(step, raw, execute, _Progress())

    # --- SQLAlchemy engine, for work that wants an AsyncConnection -------------------------

    @property
    def engine(self) -> AsyncEngine:
        """A SQLAlchemy async engine on the same database (created on first use)."""
        if self._closed:
            raise StoreUnavailableError("the connection is closed")
        if self._engine is None:
            # Every user of this engine ends its transaction (SQLAlchemy's connection rolls an
            # open one back on close), so the pool's own reset would only add a ROLLBACK round
            # trip per checkin (aiomysql sends it even on an idle connection).
            kwargs: dict[str, Any] = {"pool_pre_ping": False, "pool_reset_on_return": None}
            if self.dialect_name == "sqlite":
                # Each call inline on the loop's thread, a locked database waited for with
                # async sleeps: no thread hop per statement of the work's transaction.
                kwargs["async_creator"] = self.ops.inline_aiosqlite_creator(self._sqlite_path)
            self._engine = create_async_engine(self.url, **kwargs)
            if self.dialect_name == "sqlite":
                _sqlite_begin_immediate(self._engine)
        return self._engine

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A SQLAlchemy connection in a transaction that took the write lock first on SQLite
        (`BEGIN IMMEDIATE`); committed on success, rolled back on any exception."""
        async with self.engine.connect() as connection, connection.begin():
            yield connection

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

    async def server_flavour(self) -> str:
        """`sqlite`, `postgresql`, `mysql` or `mariadb` (connects once to find out)."""
        if self.dialect_name != "mysql":
            return self.dialect_name
        if self.is_mariadb is None:
            await self.ping()
        return "mariadb" if self.is_mariadb else "mysql"

    async def ping(self) -> None:
        """Return when the database answers a trivial statement."""
        await self.execute("SELECT 1")

    async def close(self) -> None:
        """Close every connection; later calls fail with `StoreUnavailableError`. Steps
        already running finish, and their connections are closed when they return them."""
        if self._closed:
            return
        self._closed = True
        if self.dialect_name == "sqlite":
            raw, self._sqlite_raw = self._sqlite_raw, None
            if raw is not None:
                raw.close()
        else:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            if self._available is not None:
                async with self._available:
                    self._available.notify_all()  # waiters for a connection fail now
            for raw in idle:
                with contextlib.suppress(Exception):
                    await self.ops.close(raw)
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

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


def _single(statement: Any, params: Mapping[str, Any]) -> Callable[[], Step[Result]]:
    def step() -> Step[Result]:
        return (yield Exec(statement, params))

    return step


def _sqlite_begin_immediate(engine: AsyncEngine) -> None:
    """Make the engine's transactions `BEGIN IMMEDIATE` (pysqlite's own BEGIN is deferred
    and would take the write lock only at the first write)."""

    # The connections come from `inline_aiosqlite_creator`: no implicit transactions, WAL,
    # busy timeout 0 (a locked database is waited for with async sleeps).

    @sa.event.listens_for(engine.sync_engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
