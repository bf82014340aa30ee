"""The inline runner: SQLite's stdlib driver, each step run to the end on the loop's thread.

A SQLite statement costs tens of microseconds, less than a hop to another thread and
back, so a step runs right here, inside `BEGIN IMMEDIATE` when it needs a transaction.
The one wait SQLite has is for the write lock (another connection's write transaction):
the connection's busy timeout is 0, and a busy statement is sent again after an async
sleep, so the loop keeps serving everything else while it waits, up to
`Timeouts.lock_ms`; then `StoreTimeoutError(what="lock")`. The sleeps stay short (at most
`_MAX_BACKOFF_S`), so a writer in another process that releases the lock for a moment
is caught: a busy neighbour delays a step, it does not starve it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from agboss_sql._dialects import Capabilities, InlineDialect
from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import StoreTimeoutError, StoreUnavailableError
from agboss_sql.sql._progress import Progress, feed
from agboss_sql.sql.statements import StatementCache, Step

T = TypeVar("T")

_MAX_BACKOFF_S = 0.005


class InlineRunner:
    """One SQLite connection, its steps never interleaved, run inline on the event loop."""

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
        self._gate: asyncio.Lock | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._raw is None:
            try:
                self._raw = self.dialect.connect_sync(self.path)
            except Exception as exc:
                raise StoreUnavailableError(
                    f"cannot open {self.path!r}: {type(exc).__name__}: {exc}"
                ) from exc
        return self._raw

    async def _execute(
        self, raw: sqlite3.Connection, sql: str, params: Mapping[str, Any] | None
    ) -> tuple[list[Any] | None, int]:
        """One statement; while the database is busy, wait (asynchronously) and send it again
        (a busy statement applied nothing), up to the lock bound."""
        execute = self.dialect.execute_sync
        try:
            return execute(raw, sql, params)
        except Exception as exc:
            if not self.dialect.is_busy(exc):
                raise
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeouts.lock_ms / 1000
        delay = 0.0005
        while True:
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            try:
                return execute(raw, sql, params)
            except Exception as exc:
                if not self.dialect.is_busy(exc):
                    raise
                if loop.time() >= deadline:
                    raise StoreTimeoutError(
                        "lock",
                        self.timeouts.lock_ms,
                        f"{self.path!r} stayed locked by another connection's write for "
                        f"{self.timeouts.lock_ms} ms (Timeouts.lock_ms); nothing was applied",
                    ) from exc
            delay = min(delay * 2, _MAX_BACKOFF_S)

    async def run(self, step: Step[T], transaction: bool, progress: Progress) -> T:
        if self._gate is None:
            self._gate = asyncio.Lock()
        # Steps of this connection never interleave (a step may wait for the write lock).
        async with self._gate:
            if self.closed:
                raise StoreUnavailableError("the connection is closed")
            answer = await self._drive(step, transaction, progress)
        # A step that found the database free never suspended: give the loop one turn, so a
        # caller looping over store calls cannot starve the rest (a lease renewal, say).
        await asyncio.sleep(0)
        return answer

    async def _drive(self, step: Step[T], transaction: bool, progress: Progress) -> T:
        raw = self._connection()
        cache = self.cache
        begin = self.dialect.BEGIN
        try:
            if transaction:
                if cache.listeners:
                    cache.notify(begin, {})
                await self._execute(raw, begin, None)
            answer = await feed(cache, step, raw, self._execute, progress)
            if transaction:
                if cache.listeners:
                    cache.notify("COMMIT", {})
                progress.committing = True
                await self._execute(raw, "COMMIT", None)
        except BaseException:
            step.close()
            if raw.in_transaction:
                if cache.listeners:
                    cache.notify("ROLLBACK", {})
                with contextlib.suppress(Exception):
                    raw.execute("ROLLBACK")
                if raw.in_transaction:
                    # Still holding the write lock: drop the connection (closing rolls back).
                    self._raw = None
                    with contextlib.suppress(Exception):
                        raw.close()
            raise
        return answer

    def raw_connection(self) -> sqlite3.Connection:
        """The runner's own stdlib connection (opened on first use)."""
        return self._connection()

    async def close(self) -> None:
        self.closed = True
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.close()
