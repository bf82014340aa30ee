"""How a saver is opened and closed: `from_conn_string` (LangGraph's convention) owns its
connection and closes it on exit; `async with` on a saver built on the caller's connection
stops what the saver started and leaves that connection open."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from checkpoint_graphs import approval_graph, request
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.types import Command

from agboss_sql.contracts.clocks import StoreClock, VirtualClock
from agboss_sql.contracts.errors import StoreUnavailableError
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.timeouts import Timeouts


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


async def _put(saver: SqlCheckpointSaver, thread_id: str) -> str:
    checkpoint: Checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"answer": 42}
    checkpoint["channel_versions"] = {"answer": saver.get_next_version(None, None)}
    stored = await saver.aput(
        _config(thread_id),
        checkpoint,
        {"source": "input", "step": -1},
        checkpoint["channel_versions"],
    )
    checkpoint_id: str = stored["configurable"]["checkpoint_id"]
    return checkpoint_id


def _sync_connections(saver: SqlCheckpointSaver) -> int:
    """How many synchronous driver connections the saver's sync methods hold open."""
    return saver._native._open


def _no_thread_of_ours() -> bool:
    """No thread of the saver runs (the sync methods run in their callers' threads)."""
    return not any(t.name.startswith("agboss-checkpoint-saver") for t in threading.enumerate())


async def test_from_conn_string_owns_its_connection_and_closes_it_on_exit(
    sql: SqlConnection, sql_url: str
) -> None:
    thread_id = f"thread-{uuid.uuid4()}"
    async with SqlCheckpointSaver.from_conn_string(sql_url) as saver:
        assert isinstance(saver, SqlCheckpointSaver)
        assert saver.connection is not sql
        checkpoint_id = await _put(saver, thread_id)
        found = await saver.aget_tuple(_config(thread_id))
        assert found is not None and found.checkpoint["channel_values"] == {"answer": 42}
        # The sync methods, from a thread as a synchronous graph calls them ...
        in_thread = await asyncio.to_thread(saver.get_tuple, _config(thread_id))
        assert in_thread is not None
        assert in_thread.config["configurable"]["checkpoint_id"] == checkpoint_id
        # ... and from this loop's own thread: on a synchronous driver connection, in the
        # caller's thread, with no loop or thread of the saver's.
        on_loop = saver.get_tuple(_config(thread_id))
        assert on_loop is not None
        assert _sync_connections(saver) >= 1
        assert _no_thread_of_ours()

    # Both its connections are closed: every later call is refused, sync or async ...
    with pytest.raises(StoreUnavailableError):
        await saver.aget_tuple(_config(thread_id))
    with pytest.raises(StoreUnavailableError):
        await asyncio.to_thread(saver.get_tuple, _config(thread_id))
    assert _sync_connections(saver) == 0
    # ... and what it wrote stays, for any other connection to read.
    stored = await SqlCheckpointSaver(sql).aget_tuple(_config(thread_id))
    assert stored is not None and stored.config["configurable"]["checkpoint_id"] == checkpoint_id


async def test_from_conn_string_closes_when_the_block_raises(
    sql: SqlConnection, sql_url: str
) -> None:
    thread_id = f"thread-{uuid.uuid4()}"
    with pytest.raises(RuntimeError, match="the graph failed"):
        async with SqlCheckpointSaver.from_conn_string(sql_url) as saver:
            await _put(saver, thread_id)
            saver.get_tuple(_config(thread_id))
            assert _sync_connections(saver) >= 1
            raise RuntimeError("the graph failed")
    with pytest.raises(StoreUnavailableError):
        await saver.aget_tuple(_config(thread_id))
    with pytest.raises(StoreUnavailableError):
        saver.get_tuple(_config(thread_id))
    assert _sync_connections(saver) == 0
    assert await SqlCheckpointSaver(sql).aget_tuple(_config(thread_id)) is not None


async def test_from_conn_string_passes_the_saver_and_connection_options(
    sql: SqlConnection, sql_url: str
) -> None:
    timeouts = Timeouts(statement_ms=7_000)
    async with SqlCheckpointSaver.from_conn_string(
        sql_url,
        fenced=True,
        store_clock=StoreClock(VirtualClock(1_700_000_000_000)),
        pool_size=2,
        timeouts=timeouts,
    ) as saver:
        assert saver.fenced
        assert not saver.store_clock.is_database_time
        assert saver.connection.timeouts is timeouts
        assert saver.connection.url.get_backend_name() == sql.url.get_backend_name()
        # Fenced: a write without the writer's lease is refused before any statement.
        with pytest.raises(ValueError, match="agboss_lease"):
            await _put(saver, f"thread-{uuid.uuid4()}")


async def test_a_bad_option_is_refused_before_the_block_runs(sql_url: str) -> None:
    with pytest.raises(TypeError, match="StoreClock"):
        async with SqlCheckpointSaver.from_conn_string(sql_url, store_clock=VirtualClock()):  # type: ignore[arg-type]
            pytest.fail("the block must not run")


async def test_a_graph_keeps_its_thread_across_two_savers_from_conn_string(
    sql: SqlConnection, sql_url: str
) -> None:
    config = {"configurable": {"thread_id": f"support-{uuid.uuid4()}"}}
    async with SqlCheckpointSaver.from_conn_string(sql_url) as saver:
        paused = (
            await approval_graph()
            .compile(checkpointer=saver)
            .ainvoke(request("refund order 42"), config)
        )
        assert paused["steps"] == ["draft"]
    async with SqlCheckpointSaver.from_conn_string(sql_url) as saver:
        done = (
            await approval_graph()
            .compile(checkpointer=saver)
            .ainvoke(Command(resume="yes"), config)
        )
    assert done["steps"] == ["draft", "approve", "send"]


async def test_async_with_on_a_saver_closes_its_sync_connections_and_leaves_the_given_one_open(
    sql: SqlConnection,
) -> None:
    thread_id = f"thread-{uuid.uuid4()}"
    async with SqlCheckpointSaver(sql) as saver:
        checkpoint_id = await _put(saver, thread_id)
        assert saver.get_tuple(_config(thread_id)) is not None
        assert _sync_connections(saver) >= 1
    assert _sync_connections(saver) == 0
    # The connection is the caller's: still open, for this saver and any other.
    found = await saver.aget_tuple(_config(thread_id))
    assert found is not None and found.config["configurable"]["checkpoint_id"] == checkpoint_id
    await sql.ping()
    # The sync methods open connections again.
    assert saver.get_tuple(_config(thread_id)) is not None
    assert _sync_connections(saver) >= 1
    await saver.aclose()


@pytest.mark.parametrize("server", ["postgresql", "mysql"])
async def test_opening_and_closing_sends_nothing(server: str, tmp_path: Path) -> None:
    # No server answers on port 1, and the SQLite file must not appear: entering and leaving
    # the block connects to neither.
    for url in (f"{server}://nobody@127.0.0.1:1/none", f"sqlite:///{tmp_path / 'none.db'}"):
        async with SqlCheckpointSaver.from_conn_string(url) as saver:
            assert isinstance(saver, SqlCheckpointSaver)
    assert not (tmp_path / "none.db").exists()


def test_from_conn_string_takes_a_bare_sqlite_path_as_langgraphs_sqlite_savers_do(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoints.sqlite"
    with SqlCheckpointSaver.from_conn_string(str(path)) as saver:
        saver.setup()
        config = _config(f"thread-{uuid.uuid4()}")
        checkpoint = empty_checkpoint()
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {})
        found = saver.get_tuple(config)
        assert found is not None and found.checkpoint["id"] == checkpoint["id"]
    assert path.is_file()
