"""A channel whose list only grows (a chat's `messages`) is stored as appends to an earlier
value stored whole (`agboss_sql.sql.checkpoint._appends`): what is stored, that every read
path gives back the very value, and that no delete leaves an append without its base."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from test_storage import Thread, _config

from agboss_sql.sql._base import identity_hash
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.checkpoint._appends import (
    APPEND_SHARE,
    MIN_BASE,
    appended,
    array_header,
    header,
    joined,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import checkpoint_blobs

SERDE = JsonPlusSerializer()


def _turn(turn: int, tag: str = "") -> list[BaseMessage]:
    return [
        HumanMessage(
            content=f"{tag}Turn {turn}: what I tried and what went wrong. " * 4, id=f"{tag}h{turn}"
        ),
        AIMessage(
            content=f"{tag}Turn {turn}: let us go through it step by step. " * 4, id=f"{tag}a{turn}"
        ),
    ]


def _dumped(value: Any) -> bytes:
    kind, data = SERDE.dumps_typed(value)
    assert kind == "msgpack"
    return data


# --- the byte format, without a database ----------------------------------------------------


def test_an_append_joined_to_its_base_gives_back_the_serdes_bytes() -> None:
    conversation = [m for turn in range(12) for m in _turn(turn)]
    base = _dumped(conversation[:16])
    for grown in range(16, 21):
        data = _dumped(conversation[:grown])
        append = appended(base, data)
        assert append is not None, grown
        assert array_header(append) == (grown - 16, 1)
        assert joined(base, append) == data
        assert SERDE.loads_typed(("msgpack", joined(base, append))) == conversation[:grown]


def test_headers_of_every_width_round_trip() -> None:
    for count in (0, 1, 15, 16, 65535, 65536):
        assert array_header(header(count) + b"\xc0") == (count, len(header(count)))
    # Lists as msgpack writes them, across the 16-element header change.
    items = [f"item {i}: " + "x" * 200 for i in range(40)]
    base = _dumped(items[:14])
    for grown in (15, 17):
        append = appended(base, _dumped(items[:grown]))
        assert append is not None
        assert joined(base, append) == _dumped(items[:grown])


def test_a_value_that_does_not_extend_its_base_or_would_not_pay_is_stored_whole() -> None:
    conversation = [m for turn in range(30) for m in _turn(turn)]
    base = _dumped(conversation[:10])
    assert len(base) > MIN_BASE
    # An element changed, removed, or put first: not an extension.
    edited = [*conversation[:10], *conversation[10:12]]
    edited[3] = HumanMessage(content="edited", id=edited[3].id)
    assert appended(base, _dumped(edited)) is None
    assert appended(base, _dumped(conversation[1:12])) is None
    assert appended(base, _dumped([conversation[11], *conversation[:11]])) is None
    # More than 1/APPEND_SHARE of the base's bytes added.
    assert appended(base, _dumped(conversation[: 10 + 10 // APPEND_SHARE + 2])) is None
    # A base too small to pay; not a list; not msgpack at all.
    assert appended(_dumped(conversation[:1]), _dumped(conversation[:2])) is None
    assert appended(_dumped({"a": 1}), _dumped(conversation[:2])) is None
    assert appended(b"", b"") is None


def test_random_growth_always_joins_back_exactly() -> None:
    rng = random.Random(7)
    for _ in range(200):
        items: list[Any] = [
            rng.choice([rng.randrange(-(2**40), 2**40), "s" * rng.randrange(300), [1, "x"], None])
            for _ in range(rng.randrange(1, 60))
        ]
        cut = rng.randrange(len(items) + 1)
        base, data = _dumped(items[:cut]), _dumped(items)
        append = appended(base, data)
        if append is not None:
            assert joined(base, append) == data


# --- on the database under test ----------------------------------------------------------------


def _thread() -> str:
    return f"thread-{uuid.uuid4()}"


async def _rows(sql: SqlConnection, thread: str) -> list[tuple[str, str | None, int]]:
    """(version, base version, stored bytes) of a thread's value rows."""
    b = checkpoint_blobs
    statement = sa.select(b.c.version, b.c.base_version, sa.func.length(b.c.value)).where(
        b.c.thread_hash == identity_hash(thread)
    )
    return [
        (str(v), None if base is None else str(base), int(n or 0))
        for v, base, n in (await sql.execute(statement)).rows
    ]


async def _grow(
    thread: Thread,
    conversation: list[BaseMessage],
    turns: range,
    *,
    tag: str = "",
    run_of: Any = None,
) -> tuple[list[str], list[list[BaseMessage]]]:
    """Put a checkpoint per turn, each with `conversation` grown by that turn's messages
    (`run_of(turn)`: the run id its metadata names)."""
    ids, states = [], []
    for turn in turns:
        conversation = [*conversation, *_turn(turn, tag)]
        metadata = None if run_of is None else {"run_id": run_of(turn), "step": turn}
        ids.append(await thread.put({"messages": conversation}, metadata=metadata))
        states.append(conversation)
    return ids, states


async def _chat(
    saver: SqlCheckpointSaver, thread_id: str, turns: int
) -> tuple[Thread, list[str], list[list[BaseMessage]]]:
    thread = Thread(saver, thread_id)
    ids, states = await _grow(thread, [], range(turns))
    return thread, ids, states


async def _read_back(
    sql: SqlConnection, thread_id: str, ids: list[str], states: list[list[BaseMessage]]
) -> None:
    """Every checkpoint read by a saver that keeps no value (each read goes to the database),
    by id and through `alist`, holds its conversation."""
    fresh = SqlCheckpointSaver(sql, value_cache_bytes=0)
    for checkpoint_id, state in zip(ids, states, strict=True):
        found = await fresh.aget_tuple(_config(thread_id, checkpoint_id=checkpoint_id))
        assert found is not None and found.checkpoint["channel_values"]["messages"] == state
    listed = {
        t.config["configurable"]["checkpoint_id"]: t async for t in fresh.alist(_config(thread_id))
    }
    for checkpoint_id, state in zip(ids, states, strict=True):
        assert listed[checkpoint_id].checkpoint["channel_values"]["messages"] == state
    latest = await fresh.aget_tuple(_config(thread_id))
    assert latest is not None and latest.checkpoint["channel_values"]["messages"] == states[-1]


@pytest.mark.database
async def test_a_growing_conversation_is_stored_as_appends_and_read_back_whole(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    thread_id = _thread()
    _, ids, states = await _chat(saver, thread_id, 40)

    rows = await _rows(sql, thread_id)
    whole = {version: size for version, base, size in rows if base is None}
    appends = [(version, base, size) for version, base, size in rows if base is not None]
    assert len(rows) == 40
    assert len(appends) >= 25, rows
    # Every append names a value of the channel stored whole, and is smaller than it.
    for _, base, size in appends:
        assert base in whole and size * APPEND_SHARE <= whole[base] + 8
    # Stored whole, the 40 versions would hold every earlier message again at each one.
    stored_whole = sum(len(_dumped(state)) for state in states)
    assert sum(size for _, _, size in rows) * 3 < stored_whole
    await _read_back(sql, thread_id, ids, states)


@pytest.mark.database
async def test_pruning_and_deleting_runs_keep_the_base_of_every_append_still_read(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    thread_id = _thread()
    thread = Thread(saver, thread_id)
    ids, states = await _grow(
        thread, [], range(20), run_of=lambda turn: "run-1" if turn < 12 else "run-2"
    )
    latest_rows = await _rows(sql, thread_id)
    assert any(base is not None for _, base, _ in latest_rows)

    # The checkpoints of run-1 hold the bases run-2's appends name.
    await saver.adelete_for_runs(["run-1"])
    await _read_back(sql, thread_id, ids[12:], states[12:])

    await saver.aprune([thread_id])
    await _read_back(sql, thread_id, ids[-1:], states[-1:])
    rows = await _rows(sql, thread_id)
    assert 1 <= len(rows) <= 2, rows
    versions = {version for version, _, _ in rows}
    assert all(base in versions for _, base, _ in rows if base is not None), rows


@pytest.mark.database
async def test_copies_and_forks_of_a_conversation_read_back_whole(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    thread_id = _thread()
    thread, ids, states = await _chat(saver, thread_id, 16)

    # A fork off the 10th checkpoint (time travel): another continuation of that list.
    thread.last = ids[9]
    forked_ids, forked_states = await _grow(thread, states[9], range(4), tag="fork-")
    await _read_back(sql, thread_id, ids + forked_ids, states + forked_states)

    target = _thread()
    await saver.acopy_thread(thread_id, target)
    assert len(await _rows(sql, target)) == len(await _rows(sql, thread_id))
    await _read_back(sql, target, ids + forked_ids, states + forked_states)


@pytest.mark.database
async def test_two_growing_channels_of_one_put_are_appends_to_their_own_bases(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    thread_id = _thread()
    thread = Thread(saver, thread_id)
    conversation: list[BaseMessage] = []
    log: list[str] = []
    ids, states = [], []
    for turn in range(16):
        conversation = [*conversation, *_turn(turn)]
        log = [*log, f"step {turn}: " + "tool output " * 40]
        ids.append(await thread.put({"messages": conversation, "log": log}))
        states.append((conversation, log))
    b = checkpoint_blobs
    appends_by_channel = (
        await sql.execute(
            sa.select(b.c.channel_hash, sa.func.count())
            .where(b.c.thread_hash == identity_hash(thread_id), b.c.base_version.is_not(None))
            .group_by(b.c.channel_hash)
        )
    ).rows
    assert len(appends_by_channel) == 2, appends_by_channel
    assert all(count >= 5 for _, count in appends_by_channel), appends_by_channel
    fresh = SqlCheckpointSaver(sql, value_cache_bytes=0)
    for checkpoint_id, (messages, lines) in zip(ids, states, strict=True):
        found = await fresh.aget_tuple(_config(thread_id, checkpoint_id=checkpoint_id))
        assert found is not None
        assert found.checkpoint["channel_values"] == {"messages": messages, "log": lines}


@pytest.mark.database
async def test_a_version_another_saver_stored_as_an_append_is_never_a_base(
    sql: SqlConnection,
) -> None:
    """Saver B puts again a checkpoint saver A stored (a retry on another instance): its
    value row is kept as A wrote it, an append, though B serialised it whole. B's next put
    must not name it as a base (an append of an append would not read back)."""
    a = SqlCheckpointSaver(sql)
    thread_id = _thread()
    thread, ids, states = await _chat(a, thread_id, 12)
    rows = {version: base for version, base, _ in await _rows(sql, thread_id)}
    version = thread.versions["messages"]
    assert rows[version] is not None, "the last put was to be an append"

    b = SqlCheckpointSaver(sql)
    latest = await a.aget_tuple(_config(thread_id))
    assert latest is not None and latest.parent_config is not None
    again = await b.aput(
        latest.parent_config, latest.checkpoint, latest.metadata, {"messages": version}
    )
    assert again["configurable"]["checkpoint_id"] == ids[-1]

    thread_b = Thread(b, thread_id)
    thread_b.versions, thread_b.last = dict(thread.versions), ids[-1]
    grown = [*states[-1], *_turn(12)]
    ids.append(await thread_b.put({"messages": grown}))
    states.append(grown)
    await _read_back(sql, thread_id, ids, states)
