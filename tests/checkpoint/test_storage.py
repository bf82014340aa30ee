"""What `SqlCheckpointSaver` stores and how it reads it back, on the database under test."""

from __future__ import annotations

import copy as copy_module
import enum
import json
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
from support.capabilities import embedded, executed_plan_rows
from support.sql import explain_prefix

from agboss_sql.contracts.errors import InvalidIdentifierError, InvalidPayloadError
from agboss_sql.contracts.limits import MAX_CHECKPOINT_WRITE_BYTES
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql.checkpoint import (
    LIST_PAGE,
    MAX_ROWS,
    SqlCheckpointSaver,
    _core,
    _reads,
    _writes,
)
from agboss_sql.sql.checkpoint._layout import (
    BLOB_KEY,
    BODY_HOLDS_LISTS,
    CHECKPOINT_KEY,
    MAX_BODY_TYPE,
    keyed_params,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints


def _config(thread: str, ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


class Thread:
    """Puts checkpoints on one thread namespace the way a graph does: each with its parent,
    the full channel versions, and new versions for the channels it changed."""

    def __init__(self, saver: SqlCheckpointSaver, thread: str, ns: str = "") -> None:
        self.saver, self.thread, self.ns = saver, thread, ns
        self.values: dict[str, Any] = {}
        self.versions: dict[str, Any] = {}
        self.last: str | None = None

    async def put(
        self, changes: Mapping[str, Any], *, metadata: Mapping[str, Any] | None = None
    ) -> str:
        new_versions = {
            name: self.saver.get_next_version(self.versions.get(name), None) for name in changes
        }
        self.values.update(changes)
        self.versions.update(new_versions)
        checkpoint: Checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = dict(self.values)
        checkpoint["channel_versions"] = dict(self.versions)
        checkpoint["versions_seen"] = {"node": dict(self.versions)}
        stored = await self.saver.aput(
            _config(self.thread, self.ns, self.last),
            checkpoint,
            dict(metadata or {"source": "loop", "step": 0}),  # type: ignore[arg-type]
            new_versions,
        )
        self.last = stored["configurable"]["checkpoint_id"]
        return self.last


async def _count(sql: SqlConnection, table: sa.Table, **where: Any) -> int:
    statement = sa.select(sa.func.count()).select_from(table)
    for column, value in where.items():
        statement = statement.where(table.c[column] == value)
    found = (await sql.execute(statement)).scalar()
    return int(found or 0)


def _statements(sql: SqlConnection) -> tuple[list[str], Callable[[], None]]:
    sent: list[str] = []
    remove = sql.add_statement_listener(lambda text, _params: sent.append(text))
    return sent, remove


def _thread() -> str:
    return f"thread-{uuid.uuid4()}"


async def test_a_channel_value_is_stored_once_per_version_and_each_checkpoint_reads_its_own(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    messages = [HumanMessage(content="hi", id="1"), AIMessage(content="hello", id="2")]
    # Sets, not scalars or short lists of them, which are kept in the body, not in value rows.
    first = await thread.put({"messages": messages, "topic": {"billing"}, "counter": {1}})
    second = await thread.put({"counter": {2}})
    third = await thread.put({"counter": {3}, "topic": {"refunds"}})

    # 3 channels at the first put, then only the changed ones: 3 + 1 + 2 rows.
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(thread.thread)) == 6
    for checkpoint_id, counter, topic in [
        (first, 1, "billing"),
        (second, 2, "billing"),
        (third, 3, "refunds"),
    ]:
        found = await saver.aget_tuple(_config(thread.thread, checkpoint_id=checkpoint_id))
        assert found is not None
        assert found.checkpoint["channel_values"] == {
            "messages": messages,
            "topic": {topic},
            "counter": {counter},
        }
    latest = await saver.aget_tuple(_config(thread.thread))
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == third
    assert latest.parent_config == {
        "configurable": {"thread_id": thread.thread, "checkpoint_ns": "", "checkpoint_id": second}
    }


class Colour(enum.StrEnum):
    RED = "red"


async def _body_types(sql: SqlConnection, thread: str) -> dict[str, str]:
    """The stored serde type of each checkpoint body of `thread`, by checkpoint id."""
    rows = (
        await sql.execute(
            sa.select(checkpoints.c.checkpoint_id, checkpoints.c.checkpoint_type).where(
                checkpoints.c.thread_hash == identity_hash(thread)
            )
        )
    ).rows
    return {str(row[0]): str(row[1]) for row in rows}


async def test_small_scalars_and_short_lists_are_kept_in_the_body_and_read_by_every_path(
    sql: SqlConnection,
) -> None:
    """None, bools, floats, 64-bit ints, texts of at most `INLINE_TEXT` characters and lists
    of at most `INLINE_ITEMS` such scalars (texts of at most `INLINE_ITEM_TEXT`) are kept in
    the body of every checkpoint that reads them (no value row, no look-up), and a body that
    keeps a list has its type marked; anything else (a subclass of those types too: an enum
    keeps its type) is a value row once per version."""
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    long_text = "x" * (_writes.INLINE_TEXT + 1)
    inline = {
        "n": 1,
        "s": "short",
        "f": 1.5,
        "yes": True,
        "none": None,
        "text": "é" * 1024,
        "log": ["a", 2, 2.5, None, False, "é" * _writes.INLINE_ITEM_TEXT],
        "full": list(range(_writes.INLINE_ITEMS)),
        "empty": [],
    }
    rows = {
        "long": long_text,
        "dict": {"k": 1},
        "set": {1},
        "colour": Colour.RED,
        "longer": list(range(_writes.INLINE_ITEMS + 1)),
        "long item": ["x" * (_writes.INLINE_ITEM_TEXT + 1)],
        "nested": [[1]],
        "enum item": [Colour.RED],
        "big int item": [2**63],
    }
    first = await thread.put({**inline, **rows})
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(thread.thread)) == 9
    sent, stop = _statements(sql)
    try:
        second = await thread.put({"n": 2, "log": ["b"]})  # kept inline: the checkpoint alone
    finally:
        stop()
    assert len(sent) == 1, sent
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(thread.thread)) == 9
    assert set((await _body_types(sql, thread.thread)).values()) == {
        _writes.BODY_HOLDS_LISTS + "msgpack"
    }

    later = {**inline, **rows, "n": 2, "log": ["b"]}
    for reader in (saver, SqlCheckpointSaver(sql)):
        found = await reader.aget_tuple(_config(thread.thread))
        assert found is not None and found.checkpoint["channel_values"] == later
        assert type(found.checkpoint["channel_values"]["colour"]) is Colour
        assert type(found.checkpoint["channel_values"]["enum item"][0]) is Colour
        by_id = await reader.aget_tuple(_config(thread.thread, checkpoint_id=first))
        assert by_id is not None and by_id.checkpoint["channel_values"] == {**inline, **rows}
        listed = [t async for t in reader.alist(_config(thread.thread))]
        assert [t.checkpoint["channel_values"] for t in listed] == [later, {**inline, **rows}]
    assert [t.config["configurable"]["checkpoint_id"] for t in listed] == [second, first]

    await saver.aprune([thread.thread])
    kept = await saver.aget_tuple(_config(thread.thread))
    assert kept is not None and kept.checkpoint["channel_values"] == later
    copy = _thread()
    await saver.acopy_thread(thread.thread, copy)
    copied = await SqlCheckpointSaver(sql).aget_tuple(_config(copy))
    assert copied is not None and copied.checkpoint["channel_values"] == later


async def test_a_body_that_keeps_no_list_keeps_the_serde_type_unmarked(
    sql: SqlConnection,
) -> None:
    """Only a body that keeps a versioned list inline is marked: one of scalars alone, or
    whose lists are value rows, is stored with the serde's own type, as releases before
    lists were kept inline wrote and read it."""
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    scalars = await thread.put({"n": 1, "s": "x"})
    rows = await thread.put({"long": list(range(_writes.INLINE_ITEMS + 1))})
    listed = await thread.put({"log": ["a"]})
    emptied = await thread.put({"log": {"a"}})
    assert await _body_types(sql, thread.thread) == {
        scalars: "msgpack",
        rows: "msgpack",
        listed: _writes.BODY_HOLDS_LISTS + "msgpack",
        emptied: "msgpack",
    }


async def test_a_saver_that_does_not_know_lists_kept_inline_refuses_their_bodies(
    sql: SqlConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release before short lists were kept inline decoded a body with the serde's
    `loads_typed` on the stored type: the marked type makes it raise, rather than answer the
    checkpoint without its lists (and then write a later one naming a value row that nobody
    wrote). Checkpoints of the thread without a kept list still read."""
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    plain = await thread.put({"n": 1})
    await thread.put({"log": ["a"]})

    def older_loads(self: Any, kind: Any, data: Any) -> Any:
        return self.serde.loads_typed((_core._text(kind), data))

    monkeypatch.setattr(_core.SaverCore, "_loads", older_loads)
    older = SqlCheckpointSaver(sql)
    with pytest.raises(NotImplementedError, match="agboss-lists:msgpack"):
        await older.aget_tuple(_config(thread.thread))
    with pytest.raises(NotImplementedError, match="agboss-lists:msgpack"):
        [t async for t in older.alist(_config(thread.thread))]
    found = await older.aget_tuple(_config(thread.thread, checkpoint_id=plain))
    assert found is not None and found.checkpoint["channel_values"] == {"n": 1}


async def test_rows_of_either_format_are_read_by_either_saver(
    sql: SqlConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints written before small values were inlined (every versioned value a row) are
    read as before, mixed with newer ones in one thread; and a saver that reads the older way
    (a look-up for every version, over the body's values) reads the newer rows."""
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    with monkeypatch.context() as older:
        older.setattr(_writes, "_inlined", lambda value: False)
        old = await thread.put({"n": 1, "s": "kept", "list": [1], "set": {1}})
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(thread.thread)) == 4
    new = await thread.put({"n": 2, "set": {2}})  # "s", "list" unchanged: inlined now
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(thread.thread)) == 5

    expected = {
        old: {"n": 1, "s": "kept", "list": [1], "set": {1}},
        new: {"n": 2, "s": "kept", "list": [1], "set": {2}},
    }
    for reader in (saver, SqlCheckpointSaver(sql)):
        for checkpoint_id, values in expected.items():
            found = await reader.aget_tuple(_config(thread.thread, checkpoint_id=checkpoint_id))
            assert found is not None and found.checkpoint["channel_values"] == values
        listed = [t async for t in reader.alist(_config(thread.thread))]
        assert [t.checkpoint["channel_values"] for t in listed] == [expected[new], expected[old]]
    with monkeypatch.context() as older:
        older.setattr(
            _reads,
            "_value_keys",
            lambda body: [
                (ch, _core._channel_hash(str(ch)), str(v))
                for ch, v in body["channel_versions"].items()
            ],
        )
        reader = SqlCheckpointSaver(sql)
        found = await reader.aget_tuple(_config(thread.thread))
        assert found is not None and found.checkpoint["channel_values"] == expected[new]
        listed = [t async for t in reader.alist(_config(thread.thread))]
        assert [t.checkpoint["channel_values"] for t in listed] == [expected[new], expected[old]]


async def test_values_bodies_and_writes_use_the_saver_serde(sql: SqlConnection) -> None:
    class TaggedSerde(JsonPlusSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            kind, data = super().dumps_typed(obj)
            return f"tagged-{kind}", data

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            kind, payload = data
            assert kind.startswith("tagged-")
            return super().loads_typed((kind.removeprefix("tagged-"), payload))

    saver = SqlCheckpointSaver(sql, serde=TaggedSerde())
    thread = Thread(saver, _thread())
    checkpoint_id = await thread.put({"raw": b"\x00\xff binary \x80", "text": "ünïcode ✓"})
    await saver.aput_writes(
        _config(thread.thread, checkpoint_id=checkpoint_id), [("raw", b"\x01\x02")], "task"
    )

    found = await saver.aget_tuple(_config(thread.thread))
    assert found is not None
    assert found.checkpoint["channel_values"] == {
        "raw": b"\x00\xff binary \x80",
        "text": "ünïcode ✓",
    }
    assert found.pending_writes == [("task", "raw", b"\x01\x02")]
    kinds = set()
    for table, column in [
        (checkpoints, "checkpoint_type"),
        (checkpoint_blobs, "value_type"),
        (checkpoint_writes, "value_type"),
    ]:
        kinds |= {row[0] for row in (await sql.execute(sa.select(table.c[column]))).rows}
    assert kinds and all(kind.startswith("tagged-") for kind in kinds)


async def test_a_serde_type_too_long_to_mark_refuses_a_body_that_keeps_a_list(
    sql: SqlConnection,
) -> None:
    """A body that keeps a list is stored with its serde type marked: a serde whose type
    leaves no room for the mark gets a `ValueError` before any statement, and nothing is
    written; a body that keeps no list is stored with that type as it is."""
    room = MAX_BODY_TYPE - len(BODY_HOLDS_LISTS)

    class LongTypeSerde(JsonPlusSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            kind, data = super().dumps_typed(obj)
            return kind + "-" * (room + 1 - len(kind)), data

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            return super().loads_typed((data[0].rstrip("-"), data[1]))

    saver = SqlCheckpointSaver(sql, serde=LongTypeSerde())
    thread = Thread(saver, _thread())
    plain = await thread.put({"n": 1})
    sent, stop = _statements(sql)
    try:
        with pytest.raises(ValueError, match="too long"):
            await thread.put({"log": ["a"]})
    finally:
        stop()
    assert sent == []
    found = await saver.aget_tuple(_config(thread.thread))
    assert found is not None and found.config["configurable"]["checkpoint_id"] == plain
    assert found.checkpoint["channel_values"] == {"n": 1}


async def test_pending_writes_are_not_duplicated_by_a_retry_and_come_back_in_task_order(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    checkpoint_id = await thread.put({"a": 1})
    config = _config(thread.thread, checkpoint_id=checkpoint_id)

    await saver.aput_writes(config, [("a", "b-0"), ("c", "b-1")], "task-b", "path-2")
    await saver.aput_writes(config, [("a", "a-0")], "task-a", "path-1")
    await saver.aput_writes(
        config, [("a", "b-0 retried"), ("c", "b-1 retried")], "task-b", "path-2"
    )
    await saver.aput_writes(config, [(ERROR, "boom")], "task-c", "path-3")
    await saver.aput_writes(
        config, [(ERROR, "boom again"), (INTERRUPT, {"ask": "?"})], "task-c", "path-3"
    )

    found = await saver.aget_tuple(config)
    assert found is not None
    assert found.pending_writes == [
        ("task-a", "a", "a-0"),
        ("task-b", "a", "b-0"),  # the retry did not replace or add
        ("task-b", "c", "b-1"),
        ("task-c", INTERRUPT, {"ask": "?"}),  # special channels: the latest value
        ("task-c", ERROR, "boom again"),
    ]
    assert await _count(sql, checkpoint_writes, thread_hash=identity_hash(thread.thread)) == 5


async def test_more_channels_and_writes_than_one_statement_holds(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    many = {f"channel-{i}": {"i": i, "payload": "x" * i} for i in range(MAX_ROWS * 2 + 3)}
    checkpoint_id = await thread.put(many)
    writes = [(f"channel-{i}", i) for i in range(MAX_ROWS + 5)]
    await saver.aput_writes(_config(thread.thread, checkpoint_id=checkpoint_id), writes, "task")

    found = await saver.aget_tuple(_config(thread.thread))
    assert found is not None
    assert found.checkpoint["channel_values"] == many
    assert found.pending_writes == [("task", channel, value) for channel, value in writes]
    listed = [t async for t in saver.alist(_config(thread.thread))]
    assert len(listed) == 1 and listed[0].checkpoint["channel_values"] == many
    assert listed[0].pending_writes == found.pending_writes


async def test_statements_per_operation(sql: SqlConnection) -> None:
    """One statement where the dialect folds writes into `WITH` (PostgreSQL), else one
    transaction; one statement to read the latest checkpoint with its writes and values
    when the saver knows which values it reads (it wrote or read it last), else two; one
    statement for a page of `list` with its values and writes."""
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    await thread.put({"a": 1})
    sent, stop = _statements(sql)
    try:
        checkpoint_id = await thread.put({"a": {2}, "b": {"x"}})
        put_with_values = list(sent)
        sent.clear()
        await thread.put({})
        put_without_values = list(sent)
        sent.clear()
        await saver.aput_writes(
            _config(thread.thread, checkpoint_id=checkpoint_id), [("a", 3), ("b", 4)], "t"
        )
        put_writes = list(sent)
        sent.clear()
        assert await saver.aget_tuple(_config(thread.thread)) is not None
        get_latest = list(sent)
        sent.clear()
        assert await SqlCheckpointSaver(sql).aget_tuple(_config(thread.thread)) is not None
        get_latest_unknown = list(sent)
        sent.clear()
        assert len([t async for t in saver.alist(_config(thread.thread), limit=10)]) == 3
        list_page = list(sent)
        sent.clear()
        await saver.adelete_thread(thread.thread)
        delete_thread = list(sent)
    finally:
        stop()
    folds, scripts = sql.capabilities.dml_in_with, sql.capabilities.scripts
    assert len(put_with_values) == (1 if folds or scripts else 4), put_with_values
    if scripts:
        # One text: BEGIN, the values, the checkpoint, COMMIT.
        text = put_with_values[0]
        assert text.startswith("BEGIN;") and text.endswith(";\nCOMMIT"), text
        assert text.count(";\n") == 3, text
    elif not folds:
        assert put_with_values[0].startswith("BEGIN") and put_with_values[-1] == "COMMIT"
    assert len(put_without_values) == 1
    assert len(put_writes) == 1
    assert len(get_latest) == 1, get_latest
    assert len(get_latest_unknown) == 2, get_latest_unknown
    assert len(list_page) == 2, list_page
    assert len(delete_thread) == (1 if folds else 5)


async def test_a_stale_guess_of_the_values_read_never_answers_wrong_values(
    sql: SqlConnection,
) -> None:
    """The values a saver expects the latest checkpoint to read are a guess (another saver,
    another instance, may have written since): what the checkpoint names is read, whatever
    was guessed."""
    ours, other = SqlCheckpointSaver(sql), SqlCheckpointSaver(sql)
    thread = Thread(ours, _thread())
    await thread.put({"a": {"first"}, "b": {"kept"}, "c": {"gone later"}})
    assert (await ours.aget_tuple(_config(thread.thread))) is not None
    # Another saver forks from the first checkpoint: a new "a", no "c", a new "d".
    fork = Thread(other, thread.thread)
    fork.last, fork.versions = thread.last, {"b": thread.versions["b"]}
    fork.values = {"b": {"kept"}}
    await fork.put({"a": {"second"}, "d": {"new"}})
    sent, stop = _statements(sql)
    try:
        found = await ours.aget_tuple(_config(thread.thread))
    finally:
        stop()
    assert found is not None and found.config["configurable"]["checkpoint_id"] == fork.last
    assert found.checkpoint["channel_values"] == {"a": {"second"}, "b": {"kept"}, "d": {"new"}}
    assert len(sent) == 2, sent  # the guess missed "a" and "d": read after
    # By id, an older checkpoint, with the latest's values guessed.
    first = await ours.aget_tuple(_config(thread.thread, checkpoint_id=thread.last))
    assert first is not None
    assert first.checkpoint["channel_values"] == {
        "a": {"first"},
        "b": {"kept"},
        "c": {"gone later"},
    }
    # A guessed value whose row is gone (the thread deleted and written again) is not used.
    await other.adelete_thread(thread.thread)
    again = Thread(other, thread.thread)
    await again.put({"z": 1})
    found = await ours.aget_tuple(_config(thread.thread))
    assert found is not None and found.checkpoint["channel_values"] == {"z": 1}


async def test_the_remembered_values_are_bounded(
    sql: SqlConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A saver remembers the values of at most `EXPECTED_NAMESPACES` thread namespaces (the
    most recently used): memory does not grow with the threads it serves."""
    monkeypatch.setattr(_core, "EXPECTED_NAMESPACES", 3)
    # Without kept values, which would answer the forgotten namespaces' values themselves.
    saver = SqlCheckpointSaver(sql, value_cache_bytes=0)
    threads = [Thread(saver, _thread()) for _ in range(5)]
    for thread in threads:
        await thread.put({"a": {thread.thread}})
    assert len(saver._expected) == 3
    # The oldest were forgotten: their reads take the second statement, and still answer.
    sent, stop = _statements(sql)
    try:
        found = await saver.aget_tuple(_config(threads[0].thread))
    finally:
        stop()
    assert found is not None and found.checkpoint["channel_values"] == {"a": {threads[0].thread}}
    assert len(sent) == 2, sent


async def test_a_read_takes_the_values_its_saver_wrote_or_read_without_fetching_them(
    sql: SqlConnection,
) -> None:
    """The values a saver wrote or read are kept (bytes, by key): reading its latest
    checkpoint again fetches the checkpoint and its writes alone, and answers the same
    values as a saver that keeps none. A saver that read a checkpoint keeps its values."""
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    conversation = [HumanMessage(content="hi " * 400, id="1"), AIMessage(content="yo", id="2")]
    await thread.put({"messages": conversation, "topic": {"billing"}})
    sent, stop = _statements(sql)
    try:
        found = await saver.aget_tuple(_config(thread.thread))
        ours = list(sent)
        sent.clear()
        cold_saver = SqlCheckpointSaver(sql, value_cache_bytes=0)
        cold = await cold_saver.aget_tuple(_config(thread.thread))
        cold_sent = list(sent)
        sent.clear()
        reader = SqlCheckpointSaver(sql)
        assert await reader.aget_tuple(_config(thread.thread)) is not None
        sent.clear()
        again = await reader.aget_tuple(_config(thread.thread))
        reader_again = list(sent)
    finally:
        stop()
    expected = {"messages": conversation, "topic": {"billing"}}
    for answer in (found, cold, again):
        assert answer is not None and answer.checkpoint["channel_values"] == expected
    blobs = checkpoint_blobs.name
    assert len(ours) == 1 and blobs not in ours[0], ours
    assert len(cold_sent) == 2 and blobs in cold_sent[1], cold_sent
    assert len(reader_again) == 1 and blobs not in reader_again[0], reader_again
    assert len(saver._values) == 2 and len(cold_saver._values) == 0


async def test_kept_values_are_only_those_no_other_value_can_take_the_key_of(
    sql: SqlConnection,
) -> None:
    """A kept value answers for its key only while no other value can be stored under that
    key: versions `get_next_version` makes carry a random fraction, so a thread deleted by
    another instance and begun again has new keys; a version a caller made up ("1") may name
    another value then, so its value is never kept."""
    ours, other = SqlCheckpointSaver(sql), SqlCheckpointSaver(sql)
    for made_up in (True, False):
        thread = _thread()

        async def put(
            saver: SqlCheckpointSaver,
            value: set[str],
            made_up: bool = made_up,
            thread: str = thread,
        ) -> None:
            checkpoint = empty_checkpoint()
            version = "1" if made_up else saver.get_next_version(None, None)
            checkpoint["channel_values"] = {"a": value}
            checkpoint["channel_versions"] = {"a": version}
            await saver.aput(_config(thread), checkpoint, {"source": "loop"}, {"a": version})

        await put(ours, {"old"})
        first = await ours.aget_tuple(_config(thread))
        assert first is not None and first.checkpoint["channel_values"] == {"a": {"old"}}
        await other.adelete_thread(thread)
        await put(other, {"new"})
        found = await ours.aget_tuple(_config(thread))
        assert found is not None and found.checkpoint["channel_values"] == {"a": {"new"}}
        # Made up: nothing kept. Else: what it wrote (now unreachable) and what it read.
        assert len(ours._values) == (0 if made_up else 2)


async def test_the_kept_values_are_bounded_in_bytes(sql: SqlConnection) -> None:
    """`value_cache_bytes` bounds what a saver keeps (least recently used out first); a value
    larger than the bound is not kept; reads answer the same either way."""
    saver = SqlCheckpointSaver(sql, value_cache_bytes=4_000)
    threads = [Thread(saver, _thread()) for _ in range(6)]
    for thread in threads:
        await thread.put({"a": [thread.thread * 20]})
    assert saver._values.size <= 4_000
    assert 0 < len(saver._values) < len(threads)
    big = Thread(saver, _thread())
    await big.put({"a": ["x" * 5_000]})
    assert all(key[0] != identity_hash(big.thread) for key in saver._values._entries)
    for thread in [*threads, big]:
        found = await saver.aget_tuple(_config(thread.thread))
        assert found is not None and found.checkpoint["channel_values"] == thread.values
    with pytest.raises(ValueError, match="value_cache_bytes"):
        SqlCheckpointSaver(sql, value_cache_bytes=-1)


async def _reads_few_rows(sql: SqlConnection, saver: SqlCheckpointSaver, thread: str) -> None:
    """PostgreSQL: every node of the latest-checkpoint reads (without and with the expected
    values) returns at most a few rows, as executed (`EXPLAIN ANALYZE`)."""
    params: dict[str, Any] = {"thread_hash": identity_hash(thread), "ns_hash": identity_hash("")}
    expected = saver._expected_of(params["thread_hash"], params["ns_hash"])
    assert expected
    for i, (channel_hash, version) in enumerate(expected):
        params.update({f"k{i}_channel_hash": channel_hash, f"k{i}_version": version})
    for statement in (saver._sql.read_latest, saver._sql.read(by_id=False, blobs=len(expected))):
        compiled = sql.compiled(statement)
        result = await sql.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) " + compiled.sql, {**compiled.defaults, **params}
        )
        plan = "\n".join(str(row[0]) for row in result.rows)
        counts = [int(n) for n in re.findall(r"actual time=[^)]* rows=(\d+)", plan)]
        assert counts and max(counts) <= 10, plan


async def _plan(
    sql: SqlConnection, statement: Any, params: dict[str, Any]
) -> list[tuple[str, ...]]:
    compiled = sql.compiled(statement)
    result = await sql.execute(explain_prefix(sql) + compiled.sql, {**compiled.defaults, **params})
    return [tuple(str(cell) for cell in row) for row in result.rows]


async def test_reading_the_latest_checkpoint_probes_keys_whatever_the_history(
    sql: SqlConnection,
) -> None:
    """The latest checkpoint, its writes and its values are primary-key probes: nothing
    scans the thread's history (which grows with every step)."""
    saver = SqlCheckpointSaver(sql)
    busy = Thread(saver, _thread())
    for step in range(300):
        checkpoint_id = await busy.put(
            # Lists: value rows (a small scalar would be kept in the body).
            {"step": {step}, "text": {f"t{step}"}}
            if step % 3
            else {"step": {step}, "note": {f"n{step}"}}
        )
        config = _config(busy.thread, checkpoint_id=checkpoint_id)
        await saver.aput_writes(config, [("step", step), ("note", "w")], f"task-{step}")
    for _ in range(20):
        await Thread(saver, _thread()).put({"step": {0}})
    if executed_plan_rows(sql):
        # Before statistics catch up with the thread's growth too: no step of the read
        # touches more than a few rows (a `max()` of the ids aggregated all 300).
        await _reads_few_rows(sql, saver, busy.thread)
    # The checkpoint and its writes are planned with fresh statistics; the values with
    # whatever the database has (a plan must not depend on them).
    for table in ("agboss_checkpoints", "agboss_checkpoint_writes"):
        await sql.execute(sql.ops.analyze_sql(table))
    ns_hash = identity_hash("")
    thread_hash = identity_hash(busy.thread)
    read = await _plan(
        sql, saver._sql.read_latest, {"thread_hash": thread_hash, "ns_hash": ns_hash}
    )
    latest = await saver.aget_tuple(_config(busy.thread))
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == busy.last
    keys = [
        (thread_hash, ns_hash, identity_hash(ch), str(v))
        for ch, v in latest.checkpoint["channel_versions"].items()
    ]
    assert len(keys) == 3
    columns = (*BLOB_KEY, "value_type", "value")
    values = await _plan(
        sql,
        saver._sql.keyed(checkpoint_blobs, columns, BLOB_KEY, len(keys)),
        keyed_params(keys, BLOB_KEY),
    )
    # The one-statement read (the values named with the checkpoint) and a page's values and
    # writes probe keys too.
    guessed = {"thread_hash": thread_hash, "ns_hash": ns_hash}
    for i, (_, _, channel_hash, version) in enumerate(keys):
        guessed.update({f"k{i}_channel_hash": channel_hash, f"k{i}_version": version})
    read += await _plan(sql, saver._sql.read(by_id=False, blobs=len(keys)), guessed)
    page_keys = [(thread_hash, ns_hash, busy.last)]
    page = await _plan(
        sql,
        saver._sql.values_and_writes(len(keys), len(page_keys)),
        {
            **keyed_params(keys, BLOB_KEY, prefix="b"),
            **keyed_params(page_keys, CHECKPOINT_KEY, prefix="w"),
        },
    )
    read += page
    read_text = "\n".join(" | ".join(row) for row in read)
    values_text = "\n".join(" | ".join(row) for row in values)
    if sql.dialect_name == "sqlite":
        searches = [row[-1] for row in read + values if "agboss_checkpoint" in row[-1]]
        assert searches and all(row.startswith("SEARCH") for row in searches), read_text
        probes = [row[-1] for row in values if "agboss_checkpoint_blobs" in row[-1]]
        assert len(probes) == 3 and all("version=?" in row for row in probes), values_text
    elif sql.dialect_name == "postgresql":
        assert "Seq Scan" not in read_text and "Index" in read_text, read_text
        assert "Filter" not in values_text, values_text
        assert values_text.count("version") == 3, values_text
    else:
        for row in read:
            assert not (row[2].startswith("agboss_checkpoint") and row[3] == "ALL"), read_text
        probes = [row for row in values if row[2] == "agboss_checkpoint_blobs"]
        assert len(probes) == 3 and all(row[3] == "const" for row in probes), values_text
    if saver._sql.keys_as_json:
        # A listing page's values, every key in one JSON text: a probe of the primary key
        # each, whatever the statistics of the value rows say (PostgreSQL hashed a scan of
        # the namespace's rows for a join with the keys).
        await sql.execute(sql.ops.analyze_sql("agboss_checkpoint_blobs"))
        versions = await sql.execute(
            sa.select(checkpoint_blobs.c.channel_hash, checkpoint_blobs.c.version).where(
                checkpoint_blobs.c.thread_hash == thread_hash
            )
        )
        page_params = {
            "keys": json.dumps([channel_hash + version for channel_hash, version in versions.rows]),
            "w_thread_hash": thread_hash,
            "w_ns_hash": ns_hash,
            "w_lo": busy.last,
            "w_hi": busy.last,
        }
        assert len(json.loads(page_params["keys"])) > 100
        page_plan = await sql.execute(
            explain_prefix(sql) + saver._sql.page_values_json, page_params
        )
        page_text = "\n".join(" | ".join(str(cell) for cell in row) for row in page_plan.rows)
        if sql.dialect_name == "sqlite":
            assert "SCAN b " not in page_text and "SEARCH b USING INDEX" in page_text, page_text
        else:
            assert "Seq Scan" not in page_text and "Hash" not in page_text, page_text
            assert "Index Scan using pk_agboss_checkpoint_blobs" in page_text, page_text


async def test_list_filters_metadata_in_sql_by_exact_json_value(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    rows = [
        {
            "source": "input",
            "step": 1,
            "flag": True,
            "tags": ["a", "b"],
            "who": {"id": 1},
            "note": None,
        },
        {
            "source": "loop",
            "step": 1,
            "flag": 1,
            "tags": ["a"],
            "who": {"id": 1, "x": 2},
            "note": "n",
        },
        {"source": "loop", "step": 2, "flag": False, "tags": ["a", "b", "c"], "who": {"id": 2}},
        {"source": "1", "step": "1", "flag": "true", "tags": [], "who": {}},
    ]
    ids = [await thread.put({"n": i}, metadata=md) for i, md in enumerate(rows)]

    async def matching(**filter: Any) -> list[str]:
        return [
            t.config["configurable"]["checkpoint_id"]
            async for t in saver.alist(_config(thread.thread), filter=filter)
        ]

    assert await matching(source="loop") == [ids[2], ids[1]]
    assert await matching(step=1) == [ids[1], ids[0]]  # not the text "1"
    assert await matching(step="1") == [ids[3]]
    assert await matching(flag=True) == [ids[0]]  # not the number 1 nor the text "true"
    assert await matching(flag=1) == [ids[1]]
    assert await matching(note=None) == [ids[0]]  # present and null, not absent
    assert await matching(tags=["a", "b"]) == [ids[0]]  # exact, not containment
    assert await matching(who={"id": 1}) == [ids[0]]
    assert await matching(source="loop", step=2) == [ids[2]]
    assert await matching(source="nothing") == []
    limited = [
        t async for t in saver.alist(_config(thread.thread), filter={"tags": ["a"]}, limit=1)
    ]
    assert [t.config["configurable"]["checkpoint_id"] for t in limited] == [ids[1]]


async def test_list_filters_non_ascii_metadata_alike_on_every_database(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    first = await thread.put({"n": 1}, metadata={"user": "José", "tags": ["ü", "日本"], "clé": "é"})
    second = await thread.put({"n": 2}, metadata={"user": "Jose", "who": {"name": "Zoë"}})

    async def matching(**filter: Any) -> list[str]:
        return [
            t.config["configurable"]["checkpoint_id"]
            async for t in saver.alist(_config(thread.thread), filter=filter)
        ]

    assert await matching(user="José") == [first]
    assert await matching(user="Jose") == [second]
    assert await matching(tags=["ü", "日本"]) == [first]
    assert await matching(who={"name": "Zoë"}) == [second]
    assert await matching(**{"clé": "é"}) == [first]
    assert await matching(**{"clé": "e"}) == []


async def test_a_new_saver_lists_every_value_and_pending_write_of_a_long_history(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    # Pages of more values than one look-up statement takes (two new list values per
    # checkpoint), each checkpoint with its own pending writes, read by savers that wrote
    # nothing (async, then sync): every checkpoint's values and writes, none of another's.
    writer = SqlCheckpointSaver(sql)
    thread = Thread(writer, _thread())
    total = LIST_PAGE * 2 + 7
    for i in range(total):
        stored = await thread.put({"a": [i, "a"], "b": [i, "b"], "n": i})
        await writer.aput_writes(
            _config(thread.thread, checkpoint_id=stored), [("a", [i, "w"]), ("n", -i)], f"t{i}"
        )
    expected = [
        ({"a": [i, "a"], "b": [i, "b"], "n": i}, [(f"t{i}", "a", [i, "w"]), (f"t{i}", "n", -i)])
        for i in reversed(range(total))
    ]
    async_listed, sync_listed = await _listed_by_new_savers(new_connection, _config(thread.thread))
    assert async_listed == expected
    assert sync_listed == expected


async def test_a_new_saver_reads_versions_of_any_text_and_pending_writes_in_task_order(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    # A page's values are named by their versions, whatever text those hold (quotes, a
    # backslash, non-ASCII; a NUL where the database stores one), and its pending writes
    # come back in LangGraph's order (task path, task id, index), not the key's.
    writer = SqlCheckpointSaver(sql)
    thread = _thread()
    odd = ['v"1', "v\\2", "vü3", "v\u20284", "v 5 "]
    if embedded(sql):
        # SQLite keeps any text whole, a NUL too (PostgreSQL refuses one in a text).
        odd.append("v\x006")
    parent: str | None = None
    expected = []
    for i, version in enumerate(odd):
        checkpoint: Checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"a": [i, version]}
        checkpoint["channel_versions"] = {"a": version}
        stored = await writer.aput(
            _config(thread, checkpoint_id=parent),
            checkpoint,
            {"source": "loop", "step": i},  # type: ignore[typeddict-item]
            {"a": version},
        )
        parent = stored["configurable"]["checkpoint_id"]
        config = _config(thread, checkpoint_id=parent)
        tasks = [(f"task-{i}-{t}", f"~path, {t}") for t in "zyxw"]
        for task_id, path in tasks:
            await writer.aput_writes(config, [("n", task_id), ("m", i)], task_id, path)
        order = sorted((path, task_id, idx) for task_id, path in tasks for idx in range(2))
        writes = [
            (task, "n" if idx == 0 else "m", task if idx == 0 else i) for _, task, idx in order
        ]
        expected.append(({"a": [i, version]}, writes))
    expected.reverse()
    async_listed, sync_listed = await _listed_by_new_savers(new_connection, _config(thread))
    assert async_listed == expected
    assert sync_listed == expected


async def test_list_pages_through_a_long_history_newest_first(
    sql: SqlConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Later pages of 50: the first page, then three more (the last short).
    monkeypatch.setattr(_reads, "LIST_PAGE_MORE", 50)
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    total = LIST_PAGE * 2 + 7
    ids = [
        await thread.put({"n": i}, metadata={"source": "loop", "step": i, "even": i % 2 == 0})
        for i in range(total)
    ]
    newest_first = list(reversed(ids))

    listed = [
        t.config["configurable"]["checkpoint_id"] async for t in saver.alist(_config(thread.thread))
    ]
    assert listed == newest_first
    limited = [t async for t in saver.alist(_config(thread.thread), limit=LIST_PAGE + 3)]
    assert [t.config["configurable"]["checkpoint_id"] for t in limited] == newest_first[
        : LIST_PAGE + 3
    ]
    assert [t.checkpoint["channel_values"]["n"] for t in limited[:2]] == [total - 1, total - 2]
    before = _config(thread.thread, checkpoint_id=ids[150])
    older = [
        t.config["configurable"]["checkpoint_id"]
        async for t in saver.alist(_config(thread.thread), before=before, limit=120)
    ]
    assert older == list(reversed(ids[30:150]))
    evens = [
        t.metadata["step"]
        async for t in saver.alist(
            _config(thread.thread), filter={"even": True}, limit=LIST_PAGE + 1
        )
    ]
    assert evens == [i for i in reversed(range(total)) if i % 2 == 0][: LIST_PAGE + 1]


async def test_list_across_namespaces_and_threads(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    thread_id = _thread()
    root = Thread(saver, thread_id)
    child = Thread(saver, thread_id, "tool:" + "9" * 300)  # a namespace longer than a key column
    other = Thread(saver, _thread())
    a = await root.put({"n": 1})
    b = await child.put({"n": 2})
    c = await other.put({"n": 3})

    whole_thread = [t async for t in saver.alist({"configurable": {"thread_id": thread_id}})]
    assert [t.config["configurable"]["checkpoint_id"] for t in whole_thread] == [b, a]
    assert whole_thread[0].config["configurable"]["checkpoint_ns"] == child.ns
    assert whole_thread[0].checkpoint["channel_values"] == {"n": 2}
    only_child = [t async for t in saver.alist(_config(thread_id, child.ns))]
    assert [t.config["configurable"]["checkpoint_id"] for t in only_child] == [b]
    everything = [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(None)]
    assert everything == [c, b, a]
    found = await saver.aget_tuple(_config(thread_id, child.ns))
    assert found is not None and found.config["configurable"]["checkpoint_ns"] == child.ns


async def test_a_whole_thread_listed_across_namespaces_reads_each_checkpoints_own_values_and_writes(
    sql: SqlConnection,
) -> None:
    # Namespaces interleaved in the listing's order, values in value rows (lists), pending
    # writes on each: a whole thread's listing reads each namespace's values and writes
    # apart, and must answer each checkpoint exactly what a read of it alone answers.
    saver = SqlCheckpointSaver(sql)
    thread_id = _thread()
    spaces = [Thread(saver, thread_id, ns) for ns in ("", "tool:a", "tool:b")]
    stored: list[tuple[Thread, str]] = []
    for turn in range(4):
        for index, space in enumerate(spaces):
            checkpoint_id = await space.put({"log": [f"{space.ns} {turn}"] * (turn + 1)})
            writes = [("log", [f"pending {index} {turn}"]), ("other", [turn])]
            await saver.aput_writes(
                _config(thread_id, space.ns, checkpoint_id), writes, f"task-{index}-{turn}"
            )
            stored.append((space, checkpoint_id))

    listed = [t async for t in saver.alist({"configurable": {"thread_id": thread_id}})]
    assert [t.config["configurable"]["checkpoint_id"] for t in listed] == sorted(
        (checkpoint_id for _, checkpoint_id in stored), reverse=True
    )
    for space, checkpoint_id in stored:
        alone = await saver.aget_tuple(_config(thread_id, space.ns, checkpoint_id))
        assert alone is not None
        one = next(t for t in listed if t.config["configurable"]["checkpoint_id"] == checkpoint_id)
        assert one.config["configurable"]["checkpoint_ns"] == space.ns
        assert one.checkpoint["channel_values"] == alone.checkpoint["channel_values"]
        assert one.pending_writes == alone.pending_writes
        assert len(one.pending_writes or []) == 2
    assert [
        t.config["configurable"]["checkpoint_id"]
        for t in saver.list({"configurable": {"thread_id": thread_id}})
    ] == [t.config["configurable"]["checkpoint_id"] for t in listed]


async def test_a_put_writes_counted_exactly_at_the_write_limit_is_stored_one_byte_more_is_not(
    sql: SqlConnection,
) -> None:
    # The saver counts a put_writes as its values' serialized bytes and its channels' names;
    # bytes are serialized as they are, so the count here is known to the byte.
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    checkpoint_id = await thread.put({"n": 1})
    config = _config(thread.thread, "", checkpoint_id)
    at_limit = b"x" * (MAX_CHECKPOINT_WRITE_BYTES - len("c"))
    await saver.aput_writes(config, [("c", at_limit)], "task-at")
    with pytest.raises(InvalidPayloadError):
        await saver.aput_writes(config, [("c", at_limit + b"x")], "task-over")
    found = await saver.aget_tuple(config)
    assert found is not None
    assert [(task, channel, len(value)) for task, channel, value in found.pending_writes or []] == [
        ("task-at", "c", len(at_limit))
    ]


# What LangGraph and its own savers accept as thread ids, namespaces, task ids and channel
# names: each must be a key of its own here, on every database.
ODD_KEYS = [
    "",
    "x" * 300,
    "x" * 300 + "y",  # shares its first 300 characters with the one before
    "t ",
    "t  ",
    "t",
    "T",
    "José",
    "\u65e5\u672c \U0001f600",
]


async def test_any_text_langgraph_accepts_is_a_key_of_its_own(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    suffix = _thread()
    threads = {key: Thread(saver, key + suffix if key else key) for key in ODD_KEYS}
    stored = {key: await thread.put({key or "empty": key}) for key, thread in threads.items()}
    for key, thread in threads.items():
        found = await saver.aget_tuple(_config(thread.thread))
        assert found is not None, repr(key)
        assert found.config["configurable"]["thread_id"] == thread.thread
        assert found.config["configurable"]["checkpoint_id"] == stored[key]
        assert found.checkpoint["channel_values"] == {key or "empty": key}
        listed = [t async for t in saver.alist(_config(thread.thread))]
        assert [t.config["configurable"]["checkpoint_id"] for t in listed] == [stored[key]]
        assert listed[0].checkpoint["channel_values"] == {key or "empty": key}

    # Namespaces, channels and task ids alike, in one thread.
    thread_id = "ns " + suffix + " "
    namespaces = {key: Thread(saver, thread_id, key) for key in ODD_KEYS}
    for key, thread in namespaces.items():
        checkpoint_id = await thread.put({key: "value of " + key, "other": key})
        config = _config(thread_id, key, checkpoint_id)
        for task in ODD_KEYS:
            await saver.aput_writes(config, [(key, task), ("x" * 300, task)], task_id=task)
    for key in namespaces:
        found = await saver.aget_tuple(_config(thread_id, key))
        assert found is not None, repr(key)
        assert found.config["configurable"]["checkpoint_ns"] == key
        assert found.checkpoint["channel_values"] == {key: "value of " + key, "other": key}
        writes = sorted((w for w in found.pending_writes), key=lambda w: (w[0], w[1]))
        expected = sorted(
            ((task, channel, task) for task in ODD_KEYS for channel in (key, "x" * 300)),
            key=lambda w: (w[0], w[1]),
        )
        assert writes == expected, repr(key)
    assert len([t async for t in saver.alist({"configurable": {"thread_id": thread_id}})]) == len(
        ODD_KEYS
    )

    # A thread id that differs only by a trailing space is another thread, to copy and delete.
    await saver.acopy_thread("t " + suffix, "t  " + suffix + " ")
    copied = await saver.aget_tuple(_config("t  " + suffix + " "))
    assert copied is not None and copied.checkpoint["channel_values"] == {"t ": "t "}
    await saver.adelete_thread("t " + suffix)
    assert await saver.aget_tuple(_config("t " + suffix)) is None
    assert await saver.aget_tuple(_config("t  " + suffix)) is not None
    assert await saver.aget_tuple(_config("t" + suffix)) is not None
    await saver.aprune(["", "x" * 300 + suffix], strategy="delete")
    assert await saver.aget_tuple(_config("")) is None
    assert await saver.aget_tuple(_config("x" * 300 + "y" + suffix)) is not None


async def test_keys_no_database_can_store_are_refused_before_any_statement(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    sent, remove = _statements(sql)
    try:
        with pytest.raises(InvalidIdentifierError):
            await Thread(saver, "nul\x00").put({"n": 1})
        with pytest.raises(InvalidIdentifierError):
            await saver.aget_tuple(_config("lone \ud800"))
        with pytest.raises(InvalidIdentifierError):
            await Thread(saver, _thread(), "ns\x00").put({"n": 1})
        with pytest.raises(ValueError, match="thread_id"):
            await saver.aget_tuple({"configurable": {}})
    finally:
        remove()
    assert sent == []


async def test_delete_for_runs_removes_their_checkpoints_writes_and_unread_values(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    kept_first = await thread.put(
        {"a": {"a1"}, "b": {"b1"}}, metadata={"run_id": "run-1", "step": 0}
    )
    gone = await thread.put({"a": {"a2"}}, metadata={"run_id": "run-2", "step": 1})
    await saver.aput_writes(_config(thread.thread, checkpoint_id=gone), [("a", "w")], "task")
    kept_last = await thread.put({"b": {"b3"}}, metadata={"run_id": "run-3", "step": 2})
    other = Thread(saver, _thread())
    await other.put({"a": {"x"}}, metadata={"run_id": "run-2", "step": 0})

    await saver.adelete_for_runs(["run-2", "run-unknown"])

    remaining = [
        t.config["configurable"]["checkpoint_id"] async for t in saver.alist(_config(thread.thread))
    ]
    assert remaining == [kept_last, kept_first]
    assert [t async for t in saver.alist(_config(other.thread))] == []
    assert await _count(sql, checkpoint_writes) == 0
    # a2 was read by run-2's checkpoint and by run-3's (it did not change a): kept.
    last = await saver.aget_tuple(_config(thread.thread))
    assert last is not None and last.checkpoint["channel_values"] == {"a": {"a2"}, "b": {"b3"}}
    first = await saver.aget_tuple(_config(thread.thread, checkpoint_id=kept_first))
    assert first is not None and first.checkpoint["channel_values"] == {"a": {"a1"}, "b": {"b1"}}
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(thread.thread)) == 4
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(other.thread)) == 0

    # A value only the deleted run read is deleted with it.
    lone = Thread(saver, _thread())
    await lone.put({"a": {"a1"}}, metadata={"run_id": "run-4"})
    await lone.put({"a": {"a2"}}, metadata={"run_id": "run-5"})
    await saver.adelete_for_runs({"run-5"})
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(lone.thread)) == 1


async def test_prune_keeps_each_namespace_latest_with_its_values_and_writes(
    sql: SqlConnection,
) -> None:
    saver = SqlCheckpointSaver(sql)
    thread_id = _thread()
    root = Thread(saver, thread_id)
    child = Thread(saver, thread_id, "child:1")
    for i in range(4):
        await root.put({"n": {i}} if i else {"n": [i], "fixed": {"kept since step 0"}})
        await child.put({"m": {i}})
    await saver.aput_writes(_config(thread_id, checkpoint_id=root.last), [("n", "pending")], "task")
    untouched = Thread(saver, _thread())
    await untouched.put({"n": 1})
    await untouched.put({"n": 2})

    await saver.aprune([thread_id], strategy="keep_latest")

    listed = [t async for t in saver.alist({"configurable": {"thread_id": thread_id}})]
    assert sorted(t.config["configurable"]["checkpoint_id"] for t in listed) == sorted(
        [root.last, child.last]
    )
    latest = await saver.aget_tuple(_config(thread_id))
    assert latest is not None
    assert latest.checkpoint["channel_values"] == {"n": {3}, "fixed": {"kept since step 0"}}
    assert latest.pending_writes == [("task", "n", "pending")]
    assert latest.parent_config is None
    # Only the values the kept checkpoints read remain: n, fixed (root) and m (child).
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(thread_id)) == 3
    assert len([t async for t in saver.alist(_config(untouched.thread))]) == 2

    await saver.aprune([thread_id, untouched.thread], strategy="delete")
    assert [t async for t in saver.alist(None)] == []
    assert await _count(sql, checkpoint_blobs) == 0


async def test_prune_refuses_a_thread_that_uses_a_delta_channel(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    thread = Thread(saver, _thread())
    await thread.put({"n": 1})
    await thread.put({"n": 2}, metadata={"counters_since_delta_snapshot": {"n": [1, 1]}})
    with pytest.raises(NotImplementedError, match="DeltaChannel"):
        await saver.aprune([thread.thread])
    assert len([t async for t in saver.alist(_config(thread.thread))]) == 2
    with pytest.raises(TypeError):
        await saver.aprune(thread.thread)
    with pytest.raises(ValueError, match="strategy"):
        await saver.aprune([thread.thread], strategy="keep_oldest")


async def test_copy_thread_copies_history_values_and_writes(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    source = Thread(saver, _thread())
    await source.put({"a": {1}, "b": {1, 2}})
    last = await source.put({"a": {2}})
    await saver.aput_writes(_config(source.thread, checkpoint_id=last), [("a", 3)], "task")
    target = _thread()

    await saver.acopy_thread(source.thread, target)
    await saver.acopy_thread(source.thread, target)  # again: nothing doubles

    copied = [t async for t in saver.alist(_config(target))]
    original = [t async for t in saver.alist(_config(source.thread))]
    assert [t.config["configurable"]["checkpoint_id"] for t in copied] == [
        t.config["configurable"]["checkpoint_id"] for t in original
    ]
    assert [t.checkpoint["channel_values"] for t in copied] == [
        {"a": {2}, "b": {1, 2}},
        {"a": {1}, "b": {1, 2}},
    ]
    assert copied[0].pending_writes == [("task", "a", 3)]
    assert copied[0].parent_config is not None
    assert copied[0].parent_config["configurable"]["thread_id"] == target
    assert await _count(sql, checkpoint_blobs, thread_hash=identity_hash(target)) == 3
    # The copy is independent: deleting the source leaves it.
    await saver.adelete_thread(source.thread)
    assert len([t async for t in saver.alist(_config(target))]) == 2


def test_the_sync_methods_store_bytes_that_are_no_text(sql_url: str) -> None:
    # Values whose serialised bytes are not valid UTF-8 (every byte value), written by the
    # sync methods' driver whole, as an append (a list that grew: on MySQL/MariaDB a script
    # whose rows are a derived table) and as pending writes, then read back by a saver that
    # keeps nothing: the same bytes.
    blob = bytes(range(256)) * 20
    with SqlCheckpointSaver.from_conn_string(sql_url) as saver:
        thread = _thread()
        config = _config(thread)
        for step, items in enumerate(([blob, blob], [blob, blob, blob[:300]])):
            checkpoint: Checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"raw": blob, "items": items}
            versions = {channel: saver.get_next_version(None, None) for channel in ("raw", "items")}
            checkpoint["channel_versions"] = versions
            config = saver.put(config, checkpoint, {"step": step}, versions)
        saver.put_writes(config, [("raw", blob)], "task")
    with SqlCheckpointSaver.from_conn_string(sql_url) as reader:
        found = reader.get_tuple(_config(thread))
        assert found is not None
        assert found.checkpoint["channel_values"] == {
            "raw": blob,
            "items": [blob, blob, blob[:300]],
        }
        assert found.pending_writes == [("task", "raw", blob)]
        listed = list(reader.list(_config(thread)))
        assert [len(t.checkpoint["channel_values"]["items"]) for t in listed] == [3, 2]


async def test_the_sync_methods_work_while_a_loop_runs(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    saver = SqlCheckpointSaver(new_connection())
    thread = _thread()
    checkpoint: Checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"a": [1]}
    checkpoint["channel_versions"] = {"a": saver.get_next_version(None, None)}
    stored = saver.put(
        _config(thread),
        checkpoint,
        {"source": "input", "step": -1, "run_id": "r"},
        checkpoint["channel_versions"],
    )
    saver.put_writes(stored, [("a", "w")], "task")
    found = saver.get_tuple(_config(thread))
    assert found is not None
    assert found.checkpoint["channel_values"] == {"a": [1]}
    assert found.pending_writes == [("task", "a", "w")]
    assert [t.config for t in saver.list(_config(thread))] == [found.config]
    saver.copy_thread(thread, thread + "-copy")
    assert saver.get_tuple(_config(thread + "-copy")) is not None
    saver.prune([thread + "-copy"], strategy="delete")
    assert saver.get_tuple(_config(thread + "-copy")) is None
    saver.delete_for_runs(["r"])
    assert saver.get_tuple(_config(thread)) is None
    saver.put(_config(thread), checkpoint, {}, checkpoint["channel_versions"])
    saver.delete_thread(thread)
    assert list(saver.list(_config(thread))) == []
    # What the sync methods wrote, the async ones (on this loop's connection) read.
    same_db = SqlCheckpointSaver(sql)
    saver.put(_config(thread), checkpoint, {}, checkpoint["channel_versions"])
    assert await same_db.aget_tuple(_config(thread)) is not None
    await saver.aclose()
    saver.close()  # twice: nothing left to close


async def test_the_sync_methods_need_no_event_loop_and_run_on_the_calling_one(
    sql: SqlConnection,
) -> None:
    # On this loop's own thread (a sync graph in a notebook cell): the call runs here, on a
    # synchronous driver connection, and starts no loop or thread.
    saver = SqlCheckpointSaver(sql)
    before = set(threading.enumerate())
    assert saver.get_tuple(_config(_thread())) is None
    assert set(threading.enumerate()) <= before | {
        t for t in threading.enumerate() if t.name == "agboss-checkpoint-deadlines"
    }
    assert saver._sync._home is None  # no async call came: no loop was claimed
    await saver.aclose()


async def test_copies_langgraph_makes_share_the_sync_connections(sql: SqlConnection) -> None:
    saver = SqlCheckpointSaver(sql)
    copy = copy_module.copy(saver)  # what `with_allowlist` makes
    assert copy is not saver
    assert copy.get_tuple(_config(_thread())) is None
    assert saver._native._open == 1
    saver.close()
    assert copy._native._open == 0


async def _listed_by_new_savers(
    new_connection: Callable[[], SqlConnection], config: dict[str, Any]
) -> tuple[list[Any], list[Any]]:
    """A thread's (channel values, pending writes) of each checkpoint, listed by a new saver
    on a new connection through `alist`, then by another through the sync `list`."""
    async_reader = SqlCheckpointSaver(new_connection())
    try:
        async_listed = [
            (t.checkpoint["channel_values"], t.pending_writes)
            async for t in async_reader.alist(config)
        ]
    finally:
        await async_reader.aclose()
    sync_reader = SqlCheckpointSaver(new_connection())
    try:
        sync_listed = [
            (t.checkpoint["channel_values"], t.pending_writes) for t in sync_reader.list(config)
        ]
    finally:
        sync_reader.close()
        await sync_reader.aclose()
    return async_listed, sync_listed
