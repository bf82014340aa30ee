"""Graphs whose channels are `DeltaChannel`s, on the database under test: the saver's own
`get_delta_channel_history` answers exactly what `BaseCheckpointSaver`'s walk over its
`get_tuple` answers, for every checkpoint of a forked thread, sync and async, whatever the
page of its walk; in a couple of statements rather than one per ancestor; and a chat so
stored resumes on a new saver as it does in memory."""

from __future__ import annotations

import operator
import threading
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer

from agboss_sql.sql.checkpoint import SqlCheckpointSaver, _delta
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import checkpoints


def _notes(state: list[str], writes: Sequence[Any]) -> list[str]:
    out = list(state)
    for write in writes:
        out.extend(write if isinstance(write, list) else [write])
    return out


class Chat(TypedDict, total=False):
    messages: Annotated[list[Any], DeltaChannel(_messages_delta_reducer, snapshot_frequency=3)]
    notes: Annotated[list[str], DeltaChannel(_notes, snapshot_frequency=5)]
    log: Annotated[list[str], operator.add]
    turns: int


def reply(state: Chat) -> dict[str, Any]:
    turn = state.get("turns", 0) + 1
    return {
        "messages": [AIMessage(f"reply {turn}", id=f"reply-{turn}")],
        "log": [f"reply {turn}"],
        "turns": turn,
    }


def annotate(state: Chat) -> dict[str, Any]:
    # Two tasks write `messages` in one step; `notes` changes every other turn only, so
    # some ancestors read a version of it an older one wrote.
    out: dict[str, Any] = {"messages": [AIMessage("noted", id=f"note-{len(state['messages'])}")]}
    if len(state["messages"]) % 4 == 1:
        out["notes"] = [f"note at {len(state['messages'])}"]
    return out


def _chat(saver: BaseCheckpointSaver[Any]) -> Any:
    graph = StateGraph(Chat)
    graph.add_node("reply", reply)
    graph.add_node("annotate", annotate)
    graph.add_edge(START, "reply")
    graph.add_edge(START, "annotate")
    graph.add_edge("reply", END)
    graph.add_edge("annotate", END)
    return graph.compile(checkpointer=saver)


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def _say(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text, id=f"human {text}")]}


def _forked_thread(saver: SqlCheckpointSaver) -> str:
    """A chat of 9 turns, then a fork from the 12th newest checkpoint (`update_state`) that
    goes on for 3 turns."""
    thread_id = f"delta-{uuid.uuid4()}"
    graph = _chat(saver)
    for turn in range(9):
        graph.invoke(_say(f"turn {turn}"), _config(thread_id))
    history = list(graph.get_state_history(_config(thread_id)))
    fork = graph.update_state(history[11].config, _say("a fork"), as_node="reply")
    for turn in range(3):
        graph.invoke(_say(f"fork turn {turn}"), fork)
        fork = graph.get_state(_config(thread_id)).config
    return thread_id


CHANNELS = ["messages", "notes", "log", "turns", "absent"]


@pytest.mark.parametrize("page", [_delta.DELTA_PAGE, 2])
async def test_the_history_is_what_the_base_walk_answers_for_every_checkpoint(
    sql: SqlConnection, page: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_delta, "DELTA_PAGE", page)
    saver = SqlCheckpointSaver(sql)
    thread_id = _forked_thread(saver)
    listed = list(saver.list(_config(thread_id)))
    assert len(listed) > 20
    seeded = 0
    for checkpoint in listed:
        config = checkpoint.config
        ours = saver.get_delta_channel_history(config=config, channels=CHANNELS)
        walked = BaseCheckpointSaver.get_delta_channel_history(
            saver, config=config, channels=CHANNELS
        )
        assert ours == walked, config
        assert await saver.aget_delta_channel_history(config=config, channels=CHANNELS) == (
            await BaseCheckpointSaver.aget_delta_channel_history(
                saver, config=config, channels=CHANNELS
            )
        )
        seeded += "seed" in ours["messages"]
    # The walks stop at snapshots, at older values of other channels, and at the root.
    assert 0 < seeded < len(listed)
    # No checkpoint id: the namespace's latest.
    assert saver.get_delta_channel_history(
        config=_config(thread_id), channels=CHANNELS
    ) == saver.get_delta_channel_history(config=listed[0].config, channels=CHANNELS)


async def test_a_new_saver_reads_the_history_in_two_statements(sql: SqlConnection) -> None:
    """Where `BaseCheckpointSaver`'s walk sends one `get_tuple` per ancestor (about 40
    here), one statement walks the parents and one reads the seeds and the writes."""
    saver = SqlCheckpointSaver(sql)
    thread_id = f"delta-{uuid.uuid4()}"
    graph = _chat(saver)
    for turn in range(14):
        graph.invoke(_say(f"turn {turn}"), _config(thread_id))
    latest = saver.get_tuple(_config(thread_id))
    assert latest is not None
    sent: list[str] = []
    remove = sql.add_statement_listener(lambda text, _params: sent.append(text))
    try:
        history = await SqlCheckpointSaver(sql).aget_delta_channel_history(
            config=latest.config, channels=["messages", "notes"]
        )
    finally:
        remove()
    assert len(sent) == 2, sent
    assert history == BaseCheckpointSaver.get_delta_channel_history(
        saver, config=latest.config, channels=["messages", "notes"]
    )
    assert len(history["notes"]["writes"]) > 0


async def test_a_delta_chat_resumes_on_a_new_saver_as_it_does_in_memory(
    sql: SqlConnection, new_connection: Any
) -> None:
    memory = InMemorySaver()
    thread_id = f"delta-{uuid.uuid4()}"
    here, there = _chat(SqlCheckpointSaver(sql)), _chat(memory)
    for turn in range(5):
        inputs = _say(f"turn {turn}")
        here.invoke(inputs, _config(thread_id))
        there.invoke(inputs, _config(thread_id))
    # Another instance takes the thread over, async.
    elsewhere = _chat(SqlCheckpointSaver(new_connection()))
    for turn in range(5, 9):
        inputs = _say(f"turn {turn}")
        ours = await elsewhere.ainvoke(inputs, _config(thread_id))
        theirs = await there.ainvoke(inputs, _config(thread_id))
        assert ours == theirs
    assert len(ours["messages"]) == 27 and ours["turns"] == 9
    assert [s.values async for s in elsewhere.aget_state_history(_config(thread_id))] == [
        s.values for s in there.get_state_history(_config(thread_id))
    ]


async def test_a_chain_that_loops_back_is_walked_once(sql: SqlConnection) -> None:
    """A parent link that loops back (no put makes one: a put again keeps the parent it was
    first stored with; a tool writing rows directly could) is walked once: the walk stops
    at the first checkpoint it has seen, where the base walk would go round for ever."""
    saver = SqlCheckpointSaver(sql)
    thread_id = f"loop-{uuid.uuid4()}"
    checkpoint = empty_checkpoint()
    checkpoint["channel_versions"] = {"x": saver.get_next_version(None, None)}
    first = await saver.aput(_config(thread_id), checkpoint, {}, {})
    await saver.aput_writes(first, [("x", "written at the first")], "task")
    second_checkpoint = empty_checkpoint()
    second_checkpoint["channel_versions"] = checkpoint["channel_versions"]
    second = await saver.aput(first, second_checkpoint, {}, {})
    await sql.execute(
        sa.update(checkpoints)
        .where(checkpoints.c.checkpoint_id == first["configurable"]["checkpoint_id"])
        .values(parent_checkpoint_id=second["configurable"]["checkpoint_id"])
    )
    answered: list[Any] = []
    # In a thread, so a walk that goes round for ever fails the test instead of hanging it
    # (the bound is no claim on speed: the walk takes milliseconds).
    walker = threading.Thread(
        target=lambda: answered.append(
            saver.get_delta_channel_history(config=second, channels=["x"])
        ),
        daemon=True,
    )
    walker.start()
    walker.join(timeout=120)
    assert answered == [{"x": {"writes": [("task", "x", "written at the first")]}}]


async def test_a_parent_no_longer_stored_ends_the_walk_as_it_ends_the_base_walk(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    thread_id = f"gap-{uuid.uuid4()}"
    graph = _chat(saver)
    for turn in range(4):
        graph.invoke(_say(f"turn {turn}"), _config(thread_id))
    listed = list(saver.list(_config(thread_id)))
    await sql.execute(
        sa.delete(checkpoints).where(
            checkpoints.c.checkpoint_id == listed[3].config["configurable"]["checkpoint_id"]
        )
    )
    for checkpoint in listed[:3]:
        ours = saver.get_delta_channel_history(config=checkpoint.config, channels=CHANNELS)
        assert ours == BaseCheckpointSaver.get_delta_channel_history(
            saver, config=checkpoint.config, channels=CHANNELS
        )
    assert "seed" not in ours["notes"] and ours["messages"]["writes"] == []


async def test_a_body_put_again_under_its_id_is_walked_as_it_is_now(sql: SqlConnection) -> None:
    """The saver keeps what it decoded of each body it walked, with the bytes it came from:
    a body put again under its id (LangGraph may save one id again) is read as it is now."""
    saver = SqlCheckpointSaver(sql)
    thread_id = f"again-{uuid.uuid4()}"
    stored = saver.get_next_version(None, None)
    first = empty_checkpoint()
    first["channel_values"] = {"x": ["the seed", "x" * 2000]}  # a value row, not inline
    first["channel_versions"] = {"x": stored}
    at_first = await saver.aput(_config(thread_id), first, {}, {"x": stored})
    await saver.aput_writes(at_first, [("x", "after the seed")], "task")
    second = empty_checkpoint()
    second["channel_versions"] = {"x": saver.get_next_version(stored, None)}
    at_second = await saver.aput(at_first, second, {}, {})
    walked = await saver.aget_delta_channel_history(config=at_second, channels=["x"])
    assert walked == {
        "x": {"writes": [("task", "x", "after the seed")], "seed": ["the seed", "x" * 2000]}
    }
    # The first checkpoint again, now naming a version of x that no row holds.
    first["channel_values"] = {}
    first["channel_versions"] = {"x": "00000000000000000000000000000001.5"}
    await saver.aput(_config(thread_id), first, {}, {})
    assert await saver.aget_delta_channel_history(config=at_second, channels=["x"]) == {
        "x": {"writes": [("task", "x", "after the seed")]}
    }


async def test_what_there_is_no_history_of(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    unknown = _config(f"unknown-{uuid.uuid4()}")
    assert await saver.aget_delta_channel_history(config=unknown, channels=["a", "b"]) == {
        "a": {"writes": []},
        "b": {"writes": []},
    }
    assert saver.get_delta_channel_history(config=unknown, channels=[]) == {}
    with pytest.raises(TypeError):
        await saver.aget_delta_channel_history(config=unknown, channels="messages")


@pytest.mark.parametrize("limit", [0, 6_000])
async def test_the_bodies_a_walk_keeps_stay_within_value_cache_bytes(
    sql: SqlConnection, limit: int
) -> None:
    """What the walks keep of the bodies they decoded is bounded as the saver's other kept
    things are, by `value_cache_bytes` (0 keeps none), least recently used out first, and
    the answers stay the base walk's; deleting the thread drops its bodies."""
    saver = SqlCheckpointSaver(sql, value_cache_bytes=limit)
    thread_id = _forked_thread(saver)
    listed = list(saver.list(_config(thread_id)))
    for checkpoint in listed:
        assert saver.get_delta_channel_history(
            config=checkpoint.config, channels=CHANNELS
        ) == BaseCheckpointSaver.get_delta_channel_history(
            saver, config=checkpoint.config, channels=CHANNELS
        )
        assert saver._delta_bodies.size <= limit
    kept = len(saver._delta_bodies)
    if limit:
        # Some bodies, not all of the thread's.
        assert 0 < kept < len(listed), (kept, len(listed))
    else:
        assert kept == 0
    # Unbounded but for the default, every body a walk read is kept.
    everything = SqlCheckpointSaver(sql)
    everything.get_delta_channel_history(config=listed[0].config, channels=CHANNELS)
    assert len(everything._delta_bodies) > kept
    await everything.adelete_thread(thread_id)
    assert len(everything._delta_bodies) == 0
