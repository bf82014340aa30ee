"""One saver used as LangGraph apps use it: from async graphs and sync graphs at once, under
one event loop after another, and closed while sync calls are still in flight. Every wait
here is bounded, so a hang fails the test instead of stalling the run."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
import time
import uuid
from typing import Any

import pytest
from checkpoint_graphs import approval_graph, request
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.types import Command
from sqlalchemy.engine import make_url
from support.capabilities import embedded_url

from agboss_sql.contracts.errors import CommitOutcomeUnknownError, StoreUnavailableError
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.timeouts import Timeouts

# A bound, not a measure: a graph run here takes well under a second; a minute means a call
# is stuck (the failure these tests look for), even on a loaded machine.
BOUND_S = 60.0


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def _threads(count: int) -> list[dict[str, Any]]:
    return [_config(f"thread-{uuid.uuid4()}") for _ in range(count)]


async def _mixed_runs(saver: SqlCheckpointSaver) -> None:
    """Five async and five sync graph runs at once, paused and then resumed the other way
    round; then `aget_tuple` on the loop beside `get_tuple` in a thread."""
    graph = approval_graph().compile(checkpointer=saver)
    configs = _threads(10)
    paused = await asyncio.wait_for(
        asyncio.gather(
            *(graph.ainvoke(request("refund"), c) for c in configs[:5]),
            *(asyncio.to_thread(graph.invoke, request("refund"), c) for c in configs[5:]),
        ),
        BOUND_S,
    )
    assert [state["steps"] for state in paused] == [["draft"]] * 10
    done = await asyncio.wait_for(
        asyncio.gather(
            *(asyncio.to_thread(graph.invoke, Command(resume="yes"), c) for c in configs[:5]),
            *(graph.ainvoke(Command(resume="yes"), c) for c in configs[5:]),
        ),
        BOUND_S,
    )
    assert [state["steps"] for state in done] == [["draft", "approve", "send"]] * 10
    for config in configs:
        on_loop, in_thread = await asyncio.wait_for(
            asyncio.gather(saver.aget_tuple(config), asyncio.to_thread(saver.get_tuple, config)),
            BOUND_S,
        )
        assert on_loop is not None and in_thread is not None
        assert on_loop.checkpoint["id"] == in_thread.checkpoint["id"]


async def test_async_and_sync_graphs_share_one_saver(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    try:
        await _mixed_runs(saver)
        # The sync calls ran in their callers' threads, on synchronous driver connections:
        # no event loop, nor a connection for another loop, was started for them.
        assert saver._sync._others == {}
        assert saver._native._open >= 1
    finally:
        await saver.aclose()


def _hold_sqlite_write_lock(sql_url: str, held: threading.Event) -> None:
    """Another SQLite connection writes for 200 ms (`BEGIN IMMEDIATE` … `COMMIT`): the
    saver's steps queue behind it, so they wait on the connection's gate together."""
    raw = sqlite3.connect(make_url(sql_url).database or "", isolation_level=None)
    try:
        raw.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(0.2)  # the other writer's transaction: what the saver must wait out
        raw.execute("COMMIT")
    finally:
        raw.close()


async def _runs_behind_another_writer(saver: SqlCheckpointSaver, sql_url: str) -> None:
    held = threading.Event()
    holder = None
    if embedded_url(sql_url):
        holder = threading.Thread(target=_hold_sqlite_write_lock, args=(sql_url, held))
        holder.start()
        assert await asyncio.to_thread(held.wait, BOUND_S)
    try:
        await _mixed_runs(saver)
    finally:
        if holder is not None:
            holder.join(BOUND_S)


def test_one_saver_serves_one_event_loop_after_another(sql_url: str) -> None:
    # A saver built once and used under three `asyncio.run`s in turn (a script, a test suite
    # with a loop per test), with sync graphs in threads beside the async ones each time and,
    # on SQLite, steps queued behind another writer (on the old saver: "Lock ... is bound to
    # a different event loop" under the second loop; on the servers, "Future attached to a
    # different loop").
    with SqlCheckpointSaver.from_conn_string(sql_url) as saver:
        for _ in range(3):
            asyncio.run(_runs_behind_another_writer(saver, sql_url))


def test_a_sync_only_saver_from_conn_string_opens_no_async_connection(sql_url: str) -> None:
    # Used only synchronously, a saver runs every call on its synchronous driver
    # connections: no event loop's connection (pool) is opened.
    with SqlCheckpointSaver.from_conn_string(sql_url) as saver:
        graph = approval_graph().compile(checkpointer=saver)
        config = _threads(1)[0]
        assert graph.invoke(request("refund"), config)["steps"] == ["draft"]
        assert graph.invoke(Command(resume="yes"), config)["steps"][-1] == "send"
        assert saver._sync._others == {} and saver._sync._home is None
    with pytest.raises(StoreUnavailableError):
        saver.get_tuple(config)


def _put(saver: SqlCheckpointSaver, config: dict[str, Any]) -> None:
    checkpoint: Checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"answer": 42}
    checkpoint["channel_versions"] = {"answer": saver.get_next_version(None, None)}
    saver.put(config, checkpoint, {"source": "input", "step": -1}, checkpoint["channel_versions"])


def _close_during_calls(saver: SqlCheckpointSaver, close: Any, sql_url: str) -> list[BaseException]:
    """Four threads call `put` and `get_tuple` without pause; once each has made a call,
    `close()` runs. Every thread must then end within the bound, each call having answered
    or raised a typed error. Answers the errors the threads met."""
    stop = threading.Event()
    started = threading.Barrier(5, timeout=BOUND_S)
    errors: list[BaseException] = []

    def work() -> None:
        config = _threads(1)[0]
        first = True
        try:
            while not stop.is_set():
                _put(saver, config)
                assert saver.get_tuple(config) is not None
                if first:
                    first = False
                    started.wait()
        except (StoreUnavailableError, CommitOutcomeUnknownError) as exc:
            errors.append(exc)
        except BaseException as exc:
            errors.append(exc)
            raise
        finally:
            if first:
                started.abort()

    workers = [threading.Thread(target=work, daemon=True) for _ in range(4)]
    for worker in workers:
        worker.start()
    started.wait()
    holder = None
    if embedded_url(sql_url):
        # On SQLite the calls then wait behind another writer as close() runs: in flight.
        held = threading.Event()
        holder = threading.Thread(target=_hold_sqlite_write_lock, args=(sql_url, held))
        holder.start()
        assert held.wait(BOUND_S)
    close()
    stop.set()
    if holder is not None:
        holder.join(BOUND_S)
    for worker in workers:
        worker.join(BOUND_S)
    assert not any(worker.is_alive() for worker in workers), "a sync call stayed blocked"
    return errors


def test_close_while_threads_are_inside_sync_calls(sql_url: str) -> None:
    connection = SqlConnection(sql_url)
    saver = SqlCheckpointSaver(connection)
    try:
        for _ in range(5):
            errors = _close_during_calls(saver, saver.close, sql_url)
            assert all(
                isinstance(e, (StoreUnavailableError, CommitOutcomeUnknownError)) for e in errors
            ), errors
        # Closed without `final`: the sync methods start again.
        config = _threads(1)[0]
        _put(saver, config)
        assert saver.get_tuple(config) is not None
    finally:
        saver.close()
        asyncio.run(connection.close())


def test_leaving_the_block_while_threads_are_inside_sync_calls(sql_url: str) -> None:
    for _ in range(3):
        opened = SqlCheckpointSaver.from_conn_string(sql_url)
        saver = opened.__enter__()
        errors = _close_during_calls(
            saver, functools.partial(opened.__exit__, None, None, None), sql_url
        )
        # Closed for good: the calls after the close were refused, typed.
        assert all(
            isinstance(e, (StoreUnavailableError, CommitOutcomeUnknownError)) for e in errors
        ), errors
        with pytest.raises(StoreUnavailableError):
            saver.get_tuple(_threads(1)[0])


def test_a_sync_call_while_the_home_loop_is_blocked_does_not_wait_for_it(sql_url: str) -> None:
    # A sync graph run on the event loop's own thread (a notebook cell, say) blocks that
    # loop while LangGraph's worker threads call the saver: they must not wait for it.
    connection = SqlConnection(sql_url)
    saver = SqlCheckpointSaver(connection)
    home = asyncio.new_event_loop()
    serving = threading.Thread(target=home.run_forever, daemon=True)
    serving.start()
    release = threading.Event()
    try:
        config = _threads(1)[0]
        asyncio.run_coroutine_threadsafe(saver.aget_tuple(config), home).result(BOUND_S)
        home.call_soon_threadsafe(release.wait, BOUND_S)  # blocks the home loop's thread
        answers: list[Any] = []
        caller = threading.Thread(
            target=lambda: answers.append(saver.get_tuple(config)), daemon=True
        )
        caller.start()
        caller.join(BOUND_S)
        assert not caller.is_alive(), "the sync call waited for a blocked loop"
        assert answers == [None]
        _put(saver, config)
        assert saver.get_tuple(config) is not None
    finally:
        release.set()
        saver.close()
        asyncio.run_coroutine_threadsafe(connection.close(), home).result(BOUND_S)
        home.call_soon_threadsafe(home.stop)
        serving.join(BOUND_S)
        home.close()


def test_sync_reads_do_not_wait_for_a_writer_of_this_process(sql_url: str) -> None:
    # Where the database takes one writer at a time (SQLite), this process's sync writers
    # take turns on one lock; reads (a checkpoint read with its writes, a listing page) are
    # no writes and run beside a writer holding it.
    if not embedded_url(sql_url):
        pytest.skip("only an embedded database's writers take turns on a lock of the process")
    thread = _config(f"thread-{uuid.uuid4()}")
    with SqlCheckpointSaver.from_conn_string(sql_url, timeouts=Timeouts(lock_ms=200)) as saver:
        graph = approval_graph().compile(checkpointer=saver)
        graph.invoke(request("refund"), thread)
        writer = saver._native._driver.writer
        assert writer is not None and writer.acquire(timeout=BOUND_S)
        try:
            found = saver.get_tuple(thread)
            listed = list(saver.list(thread))
        finally:
            writer.release()
    assert found is not None
    assert listed and listed[0].config == found.config
