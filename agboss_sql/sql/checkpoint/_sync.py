"""The saver's synchronous path: its sync methods on synchronous driver connections, with no
event loop.

The saver's operations are written once, as async methods whose only awaits are on the
database object they are given (`execute` and `run`, as on a `SqlConnection`). Given a
`SyncDatabase`, whose `execute` and `run` are coroutines that never suspend (they call a
synchronous driver and return), such a method runs to its end at its first step:
`run_sync` drives it there, in the caller's thread, and answers its result. So the sync
methods send the very statements the async ones send, built by the same statement sets
(`_statements`), fenced by the same fence, and fail with the same typed errors
(`SqlConnection.translate`), with transient conflicts retried as `SqlConnection` retries
them (`_backoff`, `Timeouts.retry_ms`).

Connections: a pool of the driver's connections (`_sync_drivers`), at most the
connection's `pool_size`, a call waiting `pool_ms` for one when all are busy; a call holds
one for its statement or transaction only. `close()` closes the idle ones and those in use
as their calls end (a call in flight finishes, within its statements' bounds); `final`
refuses every later call with `StoreUnavailableError`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from agboss_sql.contracts.errors import StoreTimeoutError, StoreUnavailableError
from agboss_sql.sql._backoff import backoff_s
from agboss_sql.sql._deadline import DeadlinePassed
from agboss_sql.sql._progress import Progress, sending
from agboss_sql.sql._runner import Lane
from agboss_sql.sql.checkpoint._sync_drivers import driver_for
from agboss_sql.sql.connection import MAX_ATTEMPTS, Exec, Result, SqlBuilder, SqlConnection, Step

T = TypeVar("T")
S = TypeVar("S")

_Work = Callable[[Any, Progress], T]
"""What one attempt runs on a pooled driver connection, counting its statements in the
`Progress`."""


class _Held:
    """A pooled driver connection, and the pool generation it belongs to (`close()` starts
    a new one: connections of an older one are closed when their call returns them)."""

    __slots__ = ("generation", "raw")

    def __init__(self, raw: Any, generation: int) -> None:
        self.raw = raw
        self.generation = generation


class SyncDatabase:
    """The saver's database through a synchronous driver: `prepared`, `execute` and `run`
    as `SqlConnection` has them, run in the calling thread (see the module's docstring).
    Safe across threads."""

    def __init__(self, connection: SqlConnection) -> None:
        self.connection = connection
        self._cache = connection._cache
        self._ops = connection.ops
        self._begin = connection.ops.BEGIN
        self._timeouts = connection.timeouts
        self._driver = driver_for(connection.url, connection.timeouts)
        self._size = connection._pool_size
        # The pool's state is taken under `_lock` (a plain lock: no Python frame on the way
        # in or out); `_guard`, on the same lock, wakes a call waiting for a connection, and
        # is notified only when one waits (`_waiting`).
        self._lock = threading.Lock()
        self._guard = threading.Condition(self._lock)
        self._waiting = 0
        self._idle: list[_Held] = []
        self._open = 0
        self._generation = 0
        self._final = False

    def prepared(self, factory: Callable[[SqlBuilder], S], *, database_time: bool = False) -> S:
        """The statement set `factory` builds, shared with the async path."""
        return self.connection.prepared(factory, database_time=database_time)

    # --- what the saver's operations await ---------------------------------------------

    async def execute(
        self,
        statement: Any,
        params: Mapping[str, Any] | None = None,
        *,
        priority: Lane | bool = False,
    ) -> Result:
        """One statement alone, in autocommit (retried on transient conflicts)."""
        sent = params or {}
        # Sent directly, not as a one-statement step: no generator on the path of every
        # autocommit write (a put_writes).
        return self._attempts(lambda raw, progress: self._one(raw, statement, sent, progress))

    async def run(
        self,
        step: Callable[[], Step[T]] | Step[T],
        *,
        transaction: bool = True,
        priority: Lane | bool = False,
    ) -> T:
        """An atomic step, as `SqlConnection.run` runs it."""
        if callable(step):
            factory = step
            return self._attempts(
                lambda raw, progress: self._drive(raw, factory(), transaction, progress),
                transaction=transaction,
            )
        progress = Progress()
        try:
            return self._attempt(
                lambda raw, progress: self._drive(raw, step, transaction, progress), progress
            )
        except Exception as exc:
            raise self.connection.translate(exc, transaction, progress) from exc

    # --- attempts ----------------------------------------------------------------------

    def _attempts(self, work: _Work[T], *, transaction: bool = False) -> T:
        """`work` on a pooled connection, again on a new attempt after a transient conflict
        that applied nothing."""
        connection = self.connection
        started = time.monotonic()
        attempt = 1
        while True:
            progress = Progress()
            try:
                return self._attempt(work, progress)
            except Exception as exc:
                if not connection._may_retry(exc, transaction, progress):
                    raise connection.translate(exc, transaction, progress) from exc
                give_up = started + self._timeouts.retry_ms / 1000
                if attempt >= MAX_ATTEMPTS or time.monotonic() >= give_up:
                    raise connection.conflicts_persisted(exc, attempt) from exc
            time.sleep(backoff_s(attempt))
            attempt += 1

    def _attempt(self, work: _Work[T], progress: Progress) -> T:
        held = self._checkout()
        reusable = False
        try:
            answer = work(held.raw, progress)
            reusable = True
            return answer
        except Exception as exc:
            reusable = (
                not isinstance(exc, DeadlinePassed)
                and not self._ops.is_disconnect(exc)
                and self._driver.is_usable(held.raw)
            )
            raise
        finally:
            self._checkin(held, reusable)

    def _drive(self, raw: Any, step: Step[T], transaction: bool, progress: Progress) -> T:
        """`step` on `raw`, in a transaction of its own when `transaction` (rolled back when
        the step or a statement raises). Where the database has one writer at a time
        (SQLite), this process's writers take turns on `writer` rather than polling the
        database's lock against each other."""
        writer = self._driver.writer
        if writer is None or not transaction:
            return self._statements(raw, step, transaction, progress, writer)
        self._take(writer)
        try:
            return self._statements(raw, step, transaction, progress, None)
        finally:
            writer.release()

    def _take(self, writer: threading.Lock) -> None:
        if not writer.acquire(timeout=self._timeouts.lock_ms / 1000):
            raise StoreTimeoutError(
                "lock",
                self._timeouts.lock_ms,
                f"another writer of this process held the database for "
                f"{self._timeouts.lock_ms} ms (Timeouts.lock_ms); nothing was applied",
            )

    def _statements(
        self,
        raw: Any,
        step: Step[T],
        transaction: bool,
        progress: Progress,
        writer: threading.Lock | None,
    ) -> T:
        cache = self._cache
        execute = self._driver.execute
        if transaction:
            if cache.listeners:
                cache.notify(self._begin, {})
            execute(raw, self._begin, None)
        try:
            result: Result | None = None
            while True:
                try:
                    request: Exec = step.send(result) if result is not None else next(step)
                except StopIteration as stop:
                    answer: T = stop.value
                    break
                result = self._send(raw, request.statement, request.params, progress, writer)
            if transaction:
                if cache.listeners:
                    cache.notify("COMMIT", {})
                progress.committing = True
                execute(raw, "COMMIT", None)
        except BaseException:
            step.close()
            if progress.in_script:
                # The server stopped the script with its transaction open: the connection
                # goes, and the server rolls the transaction back.
                self._driver.close(raw)
            elif transaction and not progress.committing:
                if cache.listeners:
                    cache.notify("ROLLBACK", {})
                with contextlib.suppress(Exception):
                    execute(raw, "ROLLBACK", None)
            raise
        return answer

    def _send(
        self,
        raw: Any,
        statement: Any,
        params: Mapping[str, Any],
        progress: Progress,
        writer: threading.Lock | None,
    ) -> Result:
        """One statement on `raw`, counted in `progress`; a write under `writer`, if given."""
        compiled, sent = sending(self._cache, statement, params, progress)
        if writer is not None and not compiled.reads_only:
            self._take(writer)
            try:
                rows, count = self._driver.execute(raw, compiled.sql, sent)
            finally:
                writer.release()
        else:
            rows, count = self._driver.execute(raw, compiled.sql, sent)
        progress.in_script = False
        progress.applied += 1
        # The driver's rows are a new list per statement: kept, not copied.
        return Result(rows if rows is None or type(rows) is list else list(rows), count)

    def _one(
        self, raw: Any, statement: Any, params: Mapping[str, Any], progress: Progress
    ) -> Result:
        """One statement alone on `raw`, in autocommit (`execute`)."""
        try:
            return self._send(raw, statement, params, progress, self._driver.writer)
        except BaseException:
            if progress.in_script:
                # The server stopped the script with its transaction open: the connection
                # goes, and the server rolls the transaction back.
                self._driver.close(raw)
            raise

    # --- the pool ----------------------------------------------------------------------

    def _checkout(self) -> _Held:
        deadline: float | None = None
        with self._lock:
            while True:
                if self._final:
                    raise StoreUnavailableError("the checkpoint saver is closed")
                while self._idle:
                    held = self._idle.pop()
                    if self._driver.is_usable(held.raw):
                        return held
                    self._driver.close(held.raw)
                    self._open -= 1
                if self._open < self._size:
                    self._open += 1
                    generation = self._generation
                    break
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._timeouts.pool_ms / 1000
                if now >= deadline:
                    raise StoreTimeoutError(
                        "pool",
                        self._timeouts.pool_ms,
                        f"all {self._size} connections of the saver's sync methods stayed busy "
                        f"for {self._timeouts.pool_ms} ms (Timeouts.pool_ms); nothing was sent",
                    )
                self._waiting += 1
                try:
                    self._guard.wait(deadline - now)
                finally:
                    self._waiting -= 1
        try:
            return _Held(self._driver.connect(), generation)
        except BaseException:
            with self._lock:
                self._open -= 1
                if self._waiting:
                    self._guard.notify()
            raise

    def _checkin(self, held: _Held, reusable: bool) -> None:
        with self._lock:
            if reusable and held.generation == self._generation and not self._final:
                self._idle.append(held)
                if self._waiting:
                    self._guard.notify()
                return
            self._open -= 1
            if self._waiting:
                self._guard.notify()
        self._driver.close(held.raw)

    def close(self, *, final: bool = False) -> None:
        """Close the idle connections, and those in use when their calls end; `final`:
        refuse every later call (`StoreUnavailableError`)."""
        with self._lock:
            self._final = self._final or final
            self._generation += 1
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._guard.notify_all()
        for held in idle:
            self._driver.close(held.raw)

    @property
    def closed(self) -> bool:
        """Closed for good (`close(final=True)`)."""
        return self._final


def run_sync(work: Coroutine[Any, Any, T]) -> T:
    """Run a saver operation given a `SyncDatabase` to its end, in this thread: its every
    await is on that database, which never suspends, so it ends at its first step."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    work.close()
    raise RuntimeError("a synchronous checkpoint call awaited something other than its database")


def next_sync(items: AsyncIterator[T]) -> tuple[bool, T | None]:
    """The next item of an async iterator of a saver operation given a `SyncDatabase`
    (`run_sync` of its `__anext__`): (True, item), or (False, None) at its end."""
    try:
        return True, run_sync(items.__anext__())  # type: ignore[arg-type]
    except StopAsyncIteration:
        return False, None
