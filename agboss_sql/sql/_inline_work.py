"""SQLite's work connection: the transaction a fenced effect's work (or
`SqlConnection.transaction()`) gets on the inline runner, as an `AsyncConnection` whose
calls run at once on the event loop's thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any, NoReturn

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


class WorkConnection:
    """The work connection: the stdlib connection, SQLAlchemy's `Connection` on it and the
    `InlineWorkConnection` handed to callers."""

    __slots__ = ("facade", "raw", "sync")

    def __init__(self, engine: AsyncEngine, sync: sa.Connection) -> None:
        raw = sync.connection.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        # Rows are read at once, as an async driver's buffered result has them.
        sync.execution_options(prebuffer_rows=True)
        self.raw = raw
        self.sync = sync
        self.facade = InlineWorkConnection(engine, sync, raw)


class InlineWorkConnection(AsyncConnection):
    """The `AsyncConnection` of a SQLite transaction (`SqlConnection.transaction()`, a
    fenced effect's work): a SQLAlchemy `Connection` on the runner's inline work
    connection, every call run at once on the event loop's thread. `execute`, `scalar`,
    `scalars` and `exec_driver_sql` answer as an `AsyncConnection` does (a buffered
    result); `run_sync` hands over the synchronous `Connection`. The transaction is the
    store's: `commit`, `rollback` and `close` raise `InvalidRequestError`, since ending
    it early would split what must commit as one."""

    __slots__ = ("raw",)

    def __init__(self, engine: AsyncEngine, sync: sa.Connection, raw: sqlite3.Connection) -> None:
        # Not AsyncConnection.__init__: the synchronous engine is the connection's own.
        self.engine = engine
        self.sync_engine = sync.engine
        self.sync_connection = self._assign_proxied(sync)
        self.raw = raw

    async def execute(
        self,
        statement: sa.Executable,
        parameters: Any = None,
        *,
        execution_options: Any = None,
    ) -> CursorResult[Any]:
        """Execute `statement` (SQLAlchemy Core) in the transaction; a buffered result."""
        return self._proxied.execute(statement, parameters, execution_options=execution_options)

    async def exec_driver_sql(
        self, statement: str, parameters: Any = None, execution_options: Any = None
    ) -> CursorResult[Any]:
        """Execute driver-level SQL text in the transaction; a buffered result."""
        return self._proxied.exec_driver_sql(statement, parameters, execution_options)

    async def commit(self) -> NoReturn:
        raise sa.exc.InvalidRequestError(STORE_OWNS_IT)

    async def rollback(self) -> NoReturn:
        raise sa.exc.InvalidRequestError(STORE_OWNS_IT)

    async def close(self) -> NoReturn:
        raise sa.exc.InvalidRequestError(STORE_OWNS_IT)


STORE_OWNS_IT = (
    "this transaction ends with the store's operation (COMMIT when it succeeds, ROLLBACK "
    "when it raises): raise to roll it back"
)


async def aiosqlite_execute(
    raw: Any, sql: str, params: Mapping[str, Any] | None
) -> tuple[list[Any] | None, int]:
    """One statement on an aiosqlite connection (the engine's)."""
    cursor = await raw.execute(sql, params if params is not None else ())
    try:
        rows = await cursor.fetchall() if cursor.description is not None else None
        return rows, cursor.rowcount
    finally:
        await cursor.close()


__all__ = ["STORE_OWNS_IT", "InlineWorkConnection", "WorkConnection", "aiosqlite_execute"]
