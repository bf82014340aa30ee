"""The inline runner: SQLite's stdlib driver, each step run to the end on the loop's thread.

A SQLite statement costs tens of microseconds, less than a hop to another thread and
back, so a step runs right here, inside `BEGIN IMMEDIATE` when it needs a transaction.
The one wait SQLite has is for the write lock (another connection's write transaction):
the connection's busy timeout is 0, and a busy statement is sent again after an async
sleep, so the loop keeps serving everything else while it waits, up to `Timeouts.lock_ms`
from the call's start; then `StoreTimeoutError(what="lock")`. A call waiting outside a
transaction lets go of the connection: reads and other calls run beside it. The sleeps stay short (at most
`_MAX_BACKOFF_S`), so a writer in another process that releases the lock for a moment
is caught: a busy neighbour delays a step, it does not starve it.

A transaction whose caller writes its own rows in it (`SqlConnection.transaction()`, the
fenced effect's work) runs inline too, on a second stdlib connection of the runner (the
work connection), so the runner's steps go on beside it (reads at once, writes once the
transaction lets go of the write lock). The caller gets an `InlineWorkConnection`: a
SQLAlchemy `AsyncConnection` whose statements run on a synchronous SQLAlchemy
`Connection` over that stdlib connection, without a greenlet or a thread hop. One such
transaction at a time per runner: the next waits for it (it would wait for the write
lock anyway), up to `Timeouts.lock_ms`.

SQLite has no transient conflicts and no session to lose: no failure here leaves an
outcome in doubt, and no statement needs a client deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from agboss_sql._dialects import Capabilities, InlineDialect
from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import StoreTimeoutError, StoreUnavailableError
from agboss_sql.sql._gate import Gate
from agboss_sql.sql._inline_work import (
    InlineWorkConnection,
    WorkConnection,
    aiosqlite_execute,
)
from agboss_sql.sql._progress import Progress, feed
from agboss_sql.sql._runner import Lane, Translate, driver_connection
from agboss_sql.sql.statements import Result, StatementCache, Step, single

T = TypeVar("T")

_MAX_BACKOFF_S = 0.005

_CALLS_PER_TURN = 8
"""At most this many calls of one runner in a row answer before it gives the event loop a
turn (`InlineRunner._owes_turn`)."""

_TURN_S = 0.001
"""A call answering this long (on the loop's clock) after the runner last gave the event
loop a turn gives it one, however few calls came between."""


class InlineRunner:
    """One SQLite connection, its steps never interleaved, run inline on the event loop (a
    `_runner.Runner`)."""

    def __init__(
        self, dialect: InlineDialect, path: str, timeouts: Timeouts, cache: StatementCache
    ) -> None:
        if path in ("", ":memory:"):
            raise ValueError(
                "sqlite:///:memory: is one database per connection: use a file "
                "(instances sharing a store must share one file)"
            )
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.dialect = dialect
        self.path = path
        self.timeouts = timeouts
        self.cache = cache
        self.capabilities: Capabilities = dialect.CAPABILITIES
        self.closed = False
        self._raw: sqlite3.Connection | None = None
        self._gate = Gate()
        self._work: WorkConnection | None = None
        self._work_gate = Gate()
        self._work_engine: sa.Engine | None = None
        self._calls = 0  # calls answered since this runner last gave the loop a turn
        self._turn_due = 0.0  # when (the loop's clock) the next call gives one regardless

    def pin(self, capabilities: Capabilities) -> None:
        """Use `capabilities` from now on."""
        self.capabilities = capabilities

    def _connection(self) -> sqlite3.Connection:
        if self._raw is None:
            try:
                self._raw = self.dialect.connect_sync(self.path, self.timeouts.lock_ms)
            except Exception as exc:
                raise StoreUnavailableError(
                    f"cannot open {self.path!r}: {type(exc).__name__}: {exc}"
                ) from exc
        return self._raw

    async def execute(
        self,
        raw: sqlite3.Connection,
        sql: str,
        params: Mapping[str, Any] | None,
        deadline: float | None = None,
        turn: _Turn | None = None,
    ) -> tuple[list[Any] | None, int]:
        """One statement; while the database is busy, wait (asynchronously) and send it again
        (a busy statement applied nothing), until `deadline` (on the loop's clock; by default
        `lock_ms` after the first busy answer). With `turn`, a call holding the runner's own
        connection (used instead of `raw`) until `turn.deadline`: while it has no transaction
        open, the call lets go of the connection between attempts, so other calls (reads
        above all, which WAL serves beside a writer) run meanwhile and each call's wait ends
        `lock_ms` after its own start, never one `lock_ms` per call queued before it."""
        if turn is not None:
            raw, deadline = self._connection(), turn.deadline
        try:
            return self.dialect.execute_sync(raw, sql, params)
        except Exception as exc:
            if not self.dialect.is_busy(exc):
                raise
            busy = exc
        return await self._when_free(raw, sql, params, busy, deadline, turn)

    async def _when_free(
        self,
        raw: sqlite3.Connection,
        sql: str,
        params: Mapping[str, Any] | None,
        busy: Exception,
        deadline: float | None,
        turn: _Turn | None,
    ) -> tuple[list[Any] | None, int]:
        """`execute`'s wait after the busy answer `busy`: the statement sent again after
        async sleeps until it goes through, or `StoreTimeoutError(what="lock")` at
        `deadline`."""
        execute = self.dialect.execute_sync
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.timeouts.lock_ms / 1000
        delay = 0.0005
        while True:
            if loop.time() >= deadline:
                raise self._lock_timeout() from busy
            # Inside a transaction the connection is the call's until it ends: kept.
            let_go = turn if turn is not None and not raw.in_transaction else None
            if let_go is not None:
                self._leave(let_go)
            pause = min(delay * random.uniform(0.5, 1.5), deadline - loop.time())
            await asyncio.sleep(max(0.0, pause))
            if let_go is not None:
                await self._enter(let_go)
                raw = self._connection()  # the connection may have been replaced meanwhile
            try:
                return execute(raw, sql, params)
            except Exception as exc:
                if not self.dialect.is_busy(exc):
                    raise
                busy = exc
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def _lock_timeout(self) -> StoreTimeoutError:
        return StoreTimeoutError(
            "lock",
            self.timeouts.lock_ms,
            f"{self.path!r} stayed locked by another connection's write for "
            f"{self.timeouts.lock_ms} ms (Timeouts.lock_ms); nothing was applied",
        )

    # --- the runner's own connection, one call at a time --------------------------------

    async def _enter(self, turn: _Turn) -> None:
        """Hold the runner's connection for `turn`, waiting for the call using it no later
        than `turn.deadline` (then `StoreTimeoutError(what="lock")`)."""
        gate = self._gate
        if not gate.take() and not await gate.enter(turn.deadline):
            raise self._lock_timeout()
        turn.held = True
        if self.closed:
            self._leave(turn)
            raise StoreUnavailableError("the connection is closed")

    def _leave(self, turn: _Turn) -> None:
        if turn.held:
            turn.held = False
            self._gate.leave()

    async def run(
        self, step: Step[T], transaction: bool, progress: Progress, priority: Lane | bool
    ) -> T:
        """Run `step` on the runner's connection, never interleaved with another call's
        transaction (one lane: `priority` changes nothing). Its wait for the write lock, and
        for the connection, ends `lock_ms` after the call began."""
        turn = _Turn(self.timeouts.lock_ms)
        # Steps of this connection never interleave inside a transaction.
        await self._enter(turn)
        try:
            answer = await self._drive(step, transaction, progress, turn)
        finally:
            self._leave(turn)
        if self._owes_turn():
            await self._give_turn()
        return answer

    async def run_one(
        self,
        statement: Any,
        params: Mapping[str, Any],
        progress: Progress,
        priority: Lane | bool,
    ) -> Result:
        """One statement alone, in autocommit: `run` of a one-statement step without the
        step (the hot path of single-statement operations: a lease renewal, a claim).
        `progress` is left as it is: no failure of a lone statement here is in doubt."""
        turn = _Turn(self.timeouts.lock_ms)
        await self._enter(turn)
        try:
            cache = self.cache
            compiled = cache.compiled(statement)
            sent = cache.params(compiled, params)
            try:
                if cache.listeners:
                    cache.notify(compiled.sql, sent)
                rows, count = await self.execute(self._connection(), compiled.sql, sent, turn=turn)
            except BaseException:
                self._abandon_in(turn)
                raise
        finally:
            self._leave(turn)
        if self._owes_turn():
            await self._give_turn()  # as in `run`
        return Result(rows, count)

    # --- the event loop's turns ------------------------------------------------------------

    def _owes_turn(self) -> bool:
        """Whether the call answering now gives the event loop a turn first. A call that
        found the database free never suspended; so that a caller looping over store calls
        cannot starve the loop's other tasks (a lease renewal, say), every
        `_CALLS_PER_TURN`-th call of the runner gives it one, and so does any call answering
        `_TURN_S` or more (on the loop's clock) after the last turn it gave. In between,
        calls answer without one: a loop turn costs more than a claim's Python work, and
        each turn that lets another connection's caller in makes this connection read its
        pages again (SQLite drops a connection's page cache when another has written)."""
        self._calls += 1
        return self._calls >= _CALLS_PER_TURN or asyncio.get_running_loop().time() >= self._turn_due

    async def _give_turn(self) -> None:
        await asyncio.sleep(0)
        self._calls = 0
        self._turn_due = asyncio.get_running_loop().time() + _TURN_S

    async def _drive(self, step: Step[T], transaction: bool, progress: Progress, turn: _Turn) -> T:
        """Send `step`'s statements (inside `BEGIN`/`COMMIT` when `transaction`), each as
        `_progress.send` sends one, counted in `progress`: a statement goes to the driver
        at once, and only a busy answer waits (`_when_free`), so a step that finds the
        database free costs no coroutine per statement."""
        cache = self.cache
        begin = self.dialect.BEGIN
        try:
            if transaction:
                if cache.listeners:
                    cache.notify(begin, {})
                await self.execute(self._connection(), begin, None, turn=turn)
            execute = self.dialect.execute_sync
            is_busy = self.dialect.is_busy
            result: Result | None = None
            while True:
                try:
                    request = step.send(result) if result is not None else next(step)
                except StopIteration as stop:
                    answer: T = stop.value
                    break
                compiled = cache.compiled(request.statement)
                sent = cache.params(compiled, request.params)
                if cache.listeners:
                    cache.notify(compiled.sql, sent)
                if not compiled.reads_only:
                    progress.sent_write = True
                progress.in_script = compiled.script
                raw = self._connection()
                try:
                    rows, count = execute(raw, compiled.sql, sent)
                except Exception as exc:
                    if not is_busy(exc):
                        raise
                    rows, count = await self._when_free(
                        raw, compiled.sql, sent, exc, turn.deadline, turn
                    )
                progress.in_script = False
                progress.applied += 1
                result = Result(rows, count)
            if transaction:
                if cache.listeners:
                    cache.notify("COMMIT", {})
                progress.committing = True
                await self.execute(self._connection(), "COMMIT", None, turn=turn)
        except BaseException:
            step.close()
            self._abandon_in(turn)
            raise
        return answer

    def _abandon_in(self, turn: _Turn) -> None:
        """After a failed call: roll back what the runner's connection has open, when the
        call still holds it (one that let go of it while waiting left nothing open)."""
        if turn.held and self._raw is not None:
            self._abandon(self._raw)

    def _abandon(self, raw: sqlite3.Connection) -> None:
        """After a failed step: roll back what `raw` still has open."""
        if raw.in_transaction:
            if self.cache.listeners:
                self.cache.notify("ROLLBACK", {})
            with contextlib.suppress(Exception):
                raw.execute("ROLLBACK")
            if raw.in_transaction:
                # Still holding the write lock: drop the connection (closing rolls back).
                self._raw = None
                with contextlib.suppress(Exception):
                    raw.close()

    def raw_connection(self) -> sqlite3.Connection:
        """The runner's own stdlib connection (opened on first use)."""
        return self._connection()

    async def drive(self, raw: Any, step: Step[T], transaction: bool, progress: Progress) -> T:
        """Always `TypeError`: SQLite's steps run on the runner's own connection (`run`)."""
        step.close()
        raise TypeError("drive() takes a server connection; SQLite runs steps inline")

    async def drive_on(self, connection: AsyncConnection, step: Step[T]) -> T:
        """Run `step`'s statements in the caller's transaction: inline on the work
        connection under an `InlineWorkConnection` (a locked database waited for as
        `execute` does), else on the engine's aiosqlite connection."""
        if isinstance(connection, InlineWorkConnection):
            return await feed(self.cache, step, connection.raw, self.execute, Progress())
        raw = await driver_connection(connection)
        return await feed(self.cache, step, raw, aiosqlite_execute, Progress())

    async def execute_on(
        self, connection: AsyncConnection, statement: Any, params: Mapping[str, Any]
    ) -> Result:
        """`drive_on` of a one-statement step; on the work connection without the step (the
        hot path of a fenced effect's own statements)."""
        if isinstance(connection, InlineWorkConnection):
            raw = connection.raw  # refused by a fenced effect's ended handle: nothing sent
            cache = self.cache
            compiled = cache.compiled(statement)
            sent = cache.params(compiled, params)
            if cache.listeners:
                cache.notify(compiled.sql, sent)
            rows, count = await self.execute(raw, compiled.sql, sent)
            return Result(rows, count)
        return await self.drive_on(connection, single(statement, params)())

    def create_engine(self, url: URL, options: dict[str, Any]) -> AsyncEngine:
        """The engine of `options` (aiosqlite connections from the dialect's inline
        creator: no implicit transactions, busy timeout 0), its transactions opened with
        the dialect's `BEGIN IMMEDIATE` (pysqlite's own BEGIN is deferred and would take the
        write lock only at the first write)."""
        engine = create_async_engine(url, **options)
        begin = self.dialect.BEGIN

        @sa.event.listens_for(engine.sync_engine, "begin")
        def _begin(connection: Any) -> None:
            connection.exec_driver_sql(begin)

        return engine

    # --- transactions shared with the caller's own statements ---------------------------

    @property
    def work_engine(self) -> sa.Engine:
        """The synchronous SQLAlchemy engine of the work connection (created on first use;
        the connection itself is opened by the first transaction). Its events see the
        caller's statements in `transaction()`, and only those."""
        if self._work_engine is None:
            # One connection, held for the runner's life (StaticPool): the stdlib connection
            # the creator hands over, opened like the runner's own.
            self._work_engine = sa.create_engine(
                f"sqlite+pysqlite:///{self.path}",
                creator=self._open_work_raw,
                poolclass=StaticPool,
            )
        return self._work_engine

    def _open_work_raw(self) -> sqlite3.Connection:
        return self.dialect.connect_sync(self.path, self.timeouts.lock_ms)

    def _work_connection(self, engine: Callable[[], AsyncEngine]) -> WorkConnection:
        if self._work is None:
            try:
                connection = self.work_engine.connect()
            except Exception as exc:
                raise StoreUnavailableError(
                    f"cannot open {self.path!r}: {type(exc).__name__}: {exc}"
                ) from exc
            self._work = WorkConnection(engine(), connection)
        return self._work

    async def _enter_work_gate(self, deadline: float) -> Gate:
        gate = self._work_gate
        if not await gate.enter(deadline):
            raise StoreTimeoutError(
                "lock",
                self.timeouts.lock_ms,
                f"another transaction on {self.path!r} held the write lock for "
                f"{self.timeouts.lock_ms} ms (Timeouts.lock_ms); nothing was applied",
            )
        return gate

    def transaction(
        self, engine: Callable[[], AsyncEngine], translate: Translate
    ) -> InlineTransaction:
        """`BEGIN IMMEDIATE` on the work connection, the caller's statements (its
        `InlineWorkConnection`, and `feed` on `InlineWorkConnection.raw`), then `COMMIT`;
        `ROLLBACK` when the body raises or is cancelled. `engine()` is the async engine the
        connection names as its own (`AsyncConnection.engine`); `translate` types a failure
        (the exception itself when it has no type of ours). A closed runner raises
        `StoreUnavailableError` at once."""
        if self.closed:
            raise StoreUnavailableError("the connection is closed")
        return InlineTransaction(self, engine, translate)

    def transaction_engine(self, engine: Callable[[], AsyncEngine]) -> sa.Engine:
        """The work connection's engine (`work_engine`): its events see the caller's
        statements only."""
        if self.closed:
            raise StoreUnavailableError("the connection is closed")
        return self.work_engine

    def _roll_back(self, work: WorkConnection) -> None:
        raw = work.raw
        if raw.in_transaction:
            if self.cache.listeners:
                with contextlib.suppress(Exception):
                    self.cache.notify("ROLLBACK", {})
            with contextlib.suppress(Exception):
                raw.execute("ROLLBACK")
        with contextlib.suppress(Exception):
            work.sync.rollback()  # no statement: the transaction is over already
        if raw.in_transaction or work.sync.in_transaction():
            # Still holding the write lock: drop the connection (closing rolls back).
            self._drop_work()

    def _drop_work(self) -> None:
        work, self._work = self._work, None
        engine, self._work_engine = self._work_engine, None
        if work is not None:
            with contextlib.suppress(Exception):
                work.raw.close()
            with contextlib.suppress(Exception):
                work.sync.invalidate()
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.dispose()

    async def close(self) -> None:
        self.closed = True
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.close()
        gate = self._work_gate
        if gate.held:
            return  # the transaction in flight closes the work connection when it ends
        self._drop_work()

    def forget(self) -> None:
        self.closed = True
        raw, self._raw = self._raw, None
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.close()


class _Turn:
    """One call's use of the runner's connection: whether it holds it now, and when its
    wait for the write lock (and for the connection) ends: `lock_ms` after the call began,
    on the loop's clock."""

    __slots__ = ("deadline", "held")

    def __init__(self, lock_ms: int) -> None:
        self.deadline = asyncio.get_running_loop().time() + lock_ms / 1000
        self.held = False


class InlineTransaction:
    """`async with` one transaction on the work connection (`InlineRunner.transaction`): a
    plain class, not a generator, since it is on every fenced effect's path."""

    __slots__ = ("engine", "gate", "progress", "runner", "translate", "work")

    def __init__(
        self, runner: InlineRunner, engine: Callable[[], AsyncEngine], translate: Translate
    ) -> None:
        self.runner = runner
        self.engine = engine
        self.translate = translate
        self.progress = Progress()
        self.progress.sent_write = True
        self.gate: Gate | None = None
        self.work: WorkConnection | None = None

    async def __aenter__(self) -> InlineWorkConnection:
        runner = self.runner
        # One bound for the whole wait, the transaction before this one's and the write
        # lock's together: `lock_ms` from the start.
        deadline = asyncio.get_running_loop().time() + runner.timeouts.lock_ms / 1000
        try:
            gate = await runner._enter_work_gate(deadline)
        except Exception as exc:
            raise self._typed(exc) from exc
        work: WorkConnection | None = None
        try:
            if runner.closed:
                raise StoreUnavailableError("the connection is closed")
            work = runner._work_connection(self.engine)
            cache = runner.cache
            if cache.listeners:
                cache.notify(runner.dialect.BEGIN, {})
            await runner.execute(work.raw, runner.dialect.BEGIN, None, deadline)
            # SQLAlchemy's view of the transaction we began (pysqlite sends no BEGIN).
            work.sync.begin()
        except BaseException as exc:
            if work is not None:
                runner._roll_back(work)
            self._end(gate)
            if isinstance(exc, Exception):
                raise self._typed(exc) from exc
            raise
        self.gate, self.work = gate, work
        return work.facade

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        runner, work, gate = self.runner, self.work, self.gate
        assert work is not None and gate is not None
        try:
            if exc is None:
                cache = runner.cache
                try:
                    if cache.listeners:
                        cache.notify("COMMIT", {})
                    self.progress.committing = True
                    await runner.execute(work.raw, "COMMIT", None)
                    work.sync.commit()  # no statement: the transaction is over already
                except BaseException as failed:
                    runner._roll_back(work)
                    if isinstance(failed, Exception):
                        raise self._typed(failed) from failed
                    raise
            else:
                runner._roll_back(work)
                if isinstance(exc, Exception):
                    typed = self.translate(exc, self.progress)
                    if typed is not exc:
                        raise typed from exc
        finally:
            self._end(gate)
        return False

    def _typed(self, exc: Exception) -> Exception:
        return self.translate(exc, self.progress)

    def _end(self, gate: Gate) -> None:
        if self.runner.closed:
            self.runner._drop_work()
        gate.leave()


__all__ = ["InlineRunner", "InlineTransaction", "InlineWorkConnection"]
