"""A graph interrupted on one instance is resumed from another, on the database under test."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from typing import Any

from checkpoint_graphs import approval_graph, request
from langgraph.types import Command

from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


async def test_interrupted_on_one_instance_resumed_on_another(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    thread_id = f"support-{uuid.uuid4()}"
    first = approval_graph().compile(checkpointer=SqlCheckpointSaver(sql))

    paused = await first.ainvoke(request("refund order 42"), _config(thread_id))

    assert paused["steps"] == ["draft"]
    (pending,) = paused["__interrupt__"]
    assert pending.value == {
        "question": "send this reply?",
        "draft": "draft reply to 'refund order 42'",
    }

    # Another instance: its own connection pool (engine) on the same database.
    other = SqlCheckpointSaver(new_connection())
    second = approval_graph().compile(checkpointer=other)
    state = await second.aget_state(_config(thread_id))
    assert state.next == ("approve",)
    assert [m.content for m in state.values["messages"]] == [
        "refund order 42",
        "draft reply to 'refund order 42'",
    ]

    done = await second.ainvoke(Command(resume="yes"), _config(thread_id))

    assert done["steps"] == ["draft", "approve", "send"]
    assert done["decision"] == "yes"
    assert done["total"] == 101
    assert [m.content for m in done["messages"]] == [
        "refund order 42",
        "draft reply to 'refund order 42'",
        "sent",
    ]
    final = await first.aget_state(_config(thread_id))
    assert final.next == ()
    assert final.values["steps"] == ["draft", "approve", "send"]
    history = [snapshot async for snapshot in second.aget_state_history(_config(thread_id))]
    # input, draft, approve (interrupted), approve (resumed), send
    assert len(history) == 5
    assert history[0].values == final.values


async def test_a_sync_graph_runs_inside_a_running_loop_and_from_threads(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    """The sync methods run on the saver's own loop: a synchronous `invoke` works while this
    test's event loop is running (no `asyncio.run` inside a running loop), and from threads."""
    thread_id = f"sync-{uuid.uuid4()}"
    saver = SqlCheckpointSaver(sql)
    graph = approval_graph().compile(checkpointer=saver)
    assert asyncio.get_running_loop().is_running()

    paused = graph.invoke(request("close ticket 7"), _config(thread_id))
    assert paused["steps"] == ["draft"]

    other = SqlCheckpointSaver(new_connection())
    outcome: dict[str, Any] = {}

    def resume_from_a_thread() -> None:
        resumed = approval_graph().compile(checkpointer=other)
        outcome["done"] = resumed.invoke(Command(resume="yes"), _config(thread_id))

    worker = threading.Thread(target=resume_from_a_thread)
    worker.start()
    await asyncio.to_thread(worker.join)

    assert outcome["done"]["steps"] == ["draft", "approve", "send"]
    assert outcome["done"]["total"] == 101
    # The async API sees what the sync one wrote, and the other way round.
    latest = await saver.aget_tuple(_config(thread_id))
    assert latest is not None
    assert latest.checkpoint["channel_values"]["steps"] == ["draft", "approve", "send"]
    listed = list(other.list(_config(thread_id)))
    assert len(listed) == 5
    assert (
        listed[0].config["configurable"]["checkpoint_id"]
        == latest.config["configurable"]["checkpoint_id"]
    )
    await saver.aclose()
    await other.aclose()
