"""`SqlCheckpointSaver`: LangGraph's `BaseCheckpointSaver` on the project's `SqlConnection`.

How it stores and what it sends per operation: the package's docstring
(`agboss_sql.sql.checkpoint`). The async methods are the core (`_aio`: `_writes`, `_reads`,
on the shared state of `_core`); this module adds the synchronous methods, which run the
same operations in the caller's thread on synchronous driver connections (`_sync`), and
the saver's lifecycle. The statements are in
`_statements`, the writer's lease in `_lease`; fenced writes use the fence of the
fenced-effect store (`agboss_sql.sql._fence`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from sqlalchemy.engine import URL

from agboss_sql.contracts.clocks import StoreClock
from agboss_sql.contracts.types import ApplicationContext
from agboss_sql.sql.checkpoint._aio import AsyncSaver
from agboss_sql.sql.checkpoint._sync import next_sync, run_sync
from agboss_sql.sql.checkpoint._values import DEFAULT_VALUE_CACHE_BYTES
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.timeouts import Timeouts

T = TypeVar("T")


class SqlCheckpointSaver(AsyncSaver):
    """LangGraph checkpoints on SQLite, PostgreSQL or MySQL/MariaDB, on this instance's
    `SqlConnection` (the tables come from the project's schema and migrations).

    Built on a connection the caller owns (`SqlCheckpointSaver(connection)`, which stays
    open after the saver is closed), or on one of its own, as LangGraph's savers are (with
    `async with` or `with`; `setup()` runs the project's migrations):

        async with SqlCheckpointSaver.from_conn_string("postgresql://…") as saver:
            await saver.setup()
            graph = builder.compile(checkpointer=saver)

    Any event loop, any thread: the async methods run on the caller's loop, on the saver's
    connection on the first loop it serves and on a connection of its own on any other (a
    second `asyncio.run`, say). The sync methods (`put`, `get_tuple`, `list`, ...) need no
    loop: they run in the caller's thread on synchronous driver connections of the saver's
    (at most the connection's `pool_size`), sending the statements the async methods send,
    under the same bounds and fence (see `_sync`). Sync and async calls mix freely;
    `close()` never leaves a sync call waiting.

    `value_cache_bytes`: how many bytes of serialised values the saver keeps to answer later
    reads without fetching them again, at most as many again of decoded lists kept to
    decode a growing list's next value from, and at most as many again of the checkpoint
    bodies a `DeltaChannel`'s history walk (`get_delta_channel_history`) decoded, their
    channel versions with their bytes, so that the next turn's walk decodes only the new
    ones (see the package's docstring; 0 keeps none of the three).

    `fenced=True`: every checkpoint and pending write is written only while the lease in
    `configurable["agboss_lease"]` is held at its epoch by the instance it names (checked
    in the write's transaction, by
    `store_clock`'s time: database time by default), else `ExecutionFencedError`.
    Deleting, copying and pruning threads are not fenced.
    """

    @classmethod
    def from_conn_string(
        cls,
        conn_string: str | URL,
        *,
        serde: SerializerProtocol | None = None,
        fenced: bool = False,
        store_clock: StoreClock | None = None,
        application: ApplicationContext | None = None,
        pool_size: int = 8,
        timeouts: Timeouts | None = None,
        value_cache_bytes: int = DEFAULT_VALUE_CACHE_BYTES,
    ) -> OwnedSaver:
        """A saver on a `SqlConnection` of its own to `conn_string` (a database URL:
        `sqlite:///path`, `postgresql://…`, `mysql://…`, or a bare SQLite file path as
        LangGraph's SQLite savers take; `pool_size` and `timeouts` are the
        connection's), to open with `async with` or `with` (as LangGraph's
        `AsyncPostgresSaver` / `PostgresSaver` and the SQLite ones are): the saver and every
        connection it opened are closed when the block exits, however it exits. The other
        options are the constructor's (a bad one is refused here, before any block runs).
        The tables come from the project's migrations: `setup()` runs them. Opening it sends
        nothing: the first call connects."""
        if isinstance(conn_string, str) and "://" not in conn_string:
            # A bare path, as `SqliteSaver.from_conn_string("checkpoints.sqlite")` takes.
            conn_string = f"sqlite:///{conn_string}"
        connection = SqlConnection(conn_string, pool_size=pool_size, timeouts=timeouts)
        saver = cls(
            connection,
            serde=serde,
            fenced=fenced,
            store_clock=store_clock,
            application=application,
            value_cache_bytes=value_cache_bytes,
        )
        saver._owns_connection = True
        return OwnedSaver(saver)

    def setup(self) -> _Done:
        """Bring the database's schema to the project's head revision (the migrations `agboss-sql
        upgrade` runs, under the database's migration lock, so instances starting together
        take turns; at head it only checks). Synchronous, and awaitable too, so both
        `saver.setup()` (as with `PostgresSaver`) and `await saver.setup()` (as with
        `AsyncPostgresSaver`) work; from async code `await saver.asetup()` does not block the
        event loop meanwhile."""
        from agboss_sql.sql.migrate import upgrade

        upgrade(self.connection.url)
        return _Done()

    async def asetup(self) -> None:
        """`setup()` on a worker thread, without blocking the caller's event loop."""
        from agboss_sql.sql.migrate import upgrade

        await asyncio.to_thread(upgrade, self.connection.url)

    # --- synchronous methods: the async ones on the synchronous driver (`_sync`) ---------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`aput`, from synchronous code."""
        return run_sync(self._put(self._native, config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`aput_writes`, from synchronous code."""
        run_sync(self._put_writes(self._native, config, writes, task_id, task_path))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`aget_tuple`, from synchronous code."""
        return run_sync(self._get_tuple(self._native, config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """`alist`, from synchronous code (read a page at a time, each checkpoint decoded as
        it is taken)."""
        plan = self._list_plan(self._native, config, filter, before, limit)
        if plan is None:
            return
        pages = self._pages(self._native, plan)
        remaining = limit
        try:
            while True:
                more, found_tuples = next_sync(pages)
                if not more:
                    return
                assert found_tuples is not None
                for listed in self._listed(plan, found_tuples):
                    yield listed
                    if remaining is not None:
                        remaining -= 1
                        if remaining <= 0:
                            return
        finally:
            with contextlib.suppress(StopAsyncIteration, RuntimeError):
                run_sync(pages.aclose())

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """`aget_delta_channel_history`, from synchronous code."""
        return run_sync(self._delta_history(self._native, config, channels))

    def delete_thread(self, thread_id: str) -> None:
        """`adelete_thread`, from synchronous code."""
        run_sync(self._delete_thread(self._native, thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`adelete_for_runs`, from synchronous code."""
        run_sync(self._delete_for_runs(self._native, run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`acopy_thread`, from synchronous code."""
        run_sync(self._copy_thread(self._native, source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`aprune`, from synchronous code."""
        run_sync(self._prune(self._native, thread_ids, strategy))

    def close(self) -> None:
        """Close the connections of the sync methods (a later sync call opens new ones). A
        sync call in flight finishes, within its statements' bounds, and its connection is
        closed then. The saver's own connection is not closed here: one given to the
        constructor stays its owner's, one from `from_conn_string` is closed on leaving the
        block (or by `aclose()`)."""
        self._native.close()

    async def aclose(self) -> None:
        """`close()`, and the connections the saver opened for other event loops; then, for a
        saver from `from_conn_string`, its own connection too: later calls, sync or async,
        fail with `StoreUnavailableError`. A connection given to the constructor stays
        open."""
        self._native.close(final=self._owns_connection)
        await self._sync.aclose_connections(home=self._owns_connection)

    def _close_owned(self) -> None:
        """The sync `with` block's exit: `aclose()`, from synchronous code."""
        self._native.close(final=self._owns_connection)
        self._sync.close_connections(home=self._owns_connection)

    async def __aenter__(self) -> SqlCheckpointSaver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """`aclose()` on leaving `async with saver:`."""
        await self.aclose()


class _Done:
    """What `setup()` answers: already done, and awaitable (`await saver.setup()`)."""

    def __await__(self) -> Generator[None, None, None]:
        return
        yield


class OwnedSaver:
    """What `SqlCheckpointSaver.from_conn_string` answers: the saver, opened by `async with`
    or `with`, and closed with every connection it opened when the block exits."""

    def __init__(self, saver: SqlCheckpointSaver) -> None:
        self.saver = saver

    def __enter__(self) -> SqlCheckpointSaver:
        return self.saver

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.saver._close_owned()

    async def __aenter__(self) -> SqlCheckpointSaver:
        return self.saver

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.saver.aclose()
