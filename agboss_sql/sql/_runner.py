"""The runner interface: how a `SqlConnection` reaches its database.

Two runners implement it: `_inline_runner.InlineRunner` (SQLite's stdlib driver, inline
on the event loop's thread) and `_pool_runner.PoolRunner` (a server's raw async driver
connections, pooled, each statement under the client deadline of `_deadline`). Which one
a connection has is decided once, by the dialect's `Capabilities.inline`, when it is made;
`SqlConnection` then calls the runner through this interface only, and decides itself what
a failure means (a retry, a typed error, an unknown commit outcome) from the `Progress`
the runner recorded.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agboss_sql._dialects import Capabilities
from agboss_sql.sql._progress import Progress
from agboss_sql.sql.statements import Result, Step

T = TypeVar("T")


class Lane(enum.IntEnum):
    """Which of a pool's lanes a call's server connection comes from (`priority`). `False`
    and `True` name the first two, as they did before there were three."""

    WORK = 0
    """Business work, the stores' other calls: `pool_size` connections."""
    TAKE = 1
    """Taking a lease (`acquire`): a take may wait `lock_ms` on a row another session has
    locked, so takes have their own lane, where blocked takes queue only behind takes."""
    HOLD = 2
    """A holder's moves of a lease it holds (renew, release, yield, reclaim, finish): a
    lane that no take and no business work can fill, so a renewal waits only for its own
    lease's row."""


Translate = Callable[[Exception, Progress], Exception]
"""Types a failure of a transaction that got as far as `Progress` (`SqlConnection.translate`
with `transaction=True`): the typed error, or the exception itself when it has no type of
ours."""


class Runner(Protocol):
    """Runs a `SqlConnection`'s steps and statements on one database, every wait bounded by
    the connection's `Timeouts`. A failure is raised as the driver (or the bound) raised
    it, with `progress` telling how far the attempt got; a closed runner raises
    `StoreUnavailableError`."""

    capabilities: Capabilities
    """What the database can do: the dialect's own until a server first answered, then
    that server's, unless `pin` fixed them."""

    closed: bool
    """Set by `close`; from then on every call fails with `StoreUnavailableError`."""

    def pin(self, capabilities: Capabilities) -> None:
        """Use `capabilities` from now on, whatever a server answers."""
        ...

    async def run(
        self, step: Step[T], transaction: bool, progress: Progress, priority: Lane | bool
    ) -> T:
        """Run `step` to its answer: in one transaction when `transaction` (rolled back
        when the step or a statement raises), else each statement in autocommit.
        `priority` names the `Lane` of the connection, where there are lanes."""
        ...

    async def run_one(
        self,
        statement: Any,
        params: Mapping[str, Any],
        progress: Progress,
        priority: Lane | bool,
    ) -> Result:
        """`run` of a one-statement step in autocommit, without the step."""
        ...

    async def drive(self, raw: Any, step: Step[T], transaction: bool, progress: Progress) -> T:
        """Run `step` on the caller's own driver connection `raw`, as `run` would on one of
        the runner's (`TypeError` where steps never leave the runner's connection)."""
        ...

    async def drive_on(self, connection: AsyncConnection, step: Step[T]) -> T:
        """Run `step`'s statements inside the transaction the caller holds open on
        `connection` (one of `transaction()`'s, or the engine's), each under the same
        bounds as the runner's own."""
        ...

    async def execute_on(
        self, connection: AsyncConnection, statement: Any, params: Mapping[str, Any]
    ) -> Result:
        """`drive_on` of a one-statement step, without the step."""
        ...

    def create_engine(self, url: URL, options: dict[str, Any]) -> AsyncEngine:
        """A SQLAlchemy async engine on the database (`create_async_engine(url, **options)`),
        its connections bounded as the runner's are."""
        ...

    def transaction(
        self, engine: Callable[[], AsyncEngine], translate: Translate
    ) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A SQLAlchemy connection in a transaction that holds the write lock first where the
        database has one; committed when the block ends, rolled back when it raises.
        `engine()` is the connection's engine (made on first use); `translate` types every
        failure but a transient conflict, which passes through for the caller's retry."""
        ...

    def transaction_engine(self, engine: Callable[[], AsyncEngine]) -> sa.Engine:
        """The synchronous engine under the connections `transaction()` hands out."""
        ...

    async def close(self) -> None:
        """Close every connection the runner holds idle; those in use close when returned."""
        ...

    def forget(self) -> None:
        """Close, without its event loop (that loop has ended), every connection the runner
        holds idle, and refuse every later call."""
        ...


async def driver_connection(connection: AsyncConnection) -> Any:
    """The driver connection under `connection`: read directly while it is valid (no hop
    into SQLAlchemy's greenlet), else through `get_raw_connection` (which may reconnect)."""
    sync = connection.sync_connection
    if sync is not None and not sync.invalidated:
        return sync.connection.driver_connection
    return (await connection.get_raw_connection()).driver_connection


__all__ = ["Lane", "Runner", "Translate", "driver_connection"]
