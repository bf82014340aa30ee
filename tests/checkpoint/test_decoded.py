"""A growing list is decoded from the list the saver decoded before for its channel
(`agboss_sql.sql.checkpoint._decoded`): every value read is what the serde would decode,
type for type, and never shares an object with another read."""

from __future__ import annotations

import datetime
import gc
import pickle
import random
import threading
import uuid
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel
from test_storage import Thread, _config

from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.checkpoint._decoded import DecodedLists, exact
from agboss_sql.sql.connection import SqlConnection

CHANNEL = ("thread", "ns", "messages")


class Counted(JsonPlusSerializer):
    """Not the serde the lists are kept for (a subclass): decodes everything itself."""


class Note(BaseModel):
    text: str
    tags: list[str] = []


class Stamped(BaseModel):
    """A model with its own pickling: never copied through pickle."""

    text: str

    def __getstate__(self) -> dict[Any, Any]:
        return super().__getstate__()


def _serde() -> tuple[JsonPlusSerializer, list[int]]:
    """The default serde, counting the elements it decodes (patched on the instance: its
    type stays `JsonPlusSerializer`)."""
    serde = JsonPlusSerializer()
    decoded: list[int] = []
    loads = serde.loads_typed

    def counting(data: tuple[str, bytes]) -> Any:
        value = loads(data)
        decoded.append(len(value) if isinstance(value, list) else 1)
        return value

    serde.loads_typed = counting  # type: ignore[method-assign]
    return serde, decoded


def _turn(turn: int) -> list[BaseMessage]:
    return [
        HumanMessage(content=f"Turn {turn}: what I tried and what went wrong. " * 3, id=f"h{turn}"),
        AIMessage(
            content=f"Turn {turn}: let us go step by step. " * 3,
            id=f"a{turn}",
            tool_calls=[{"name": "lookup", "args": {"order": turn}, "id": f"c{turn}"}],
            response_metadata={"model": "m", "tokens": [turn, 2 * turn]},
        ),
        ToolMessage(content=f"order {turn}: shipped", tool_call_id=f"c{turn}", id=f"t{turn}"),
    ]


def same(a: Any, b: Any) -> None:
    """`a` and `b` are equal and of the same types all the way down."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, BaseModel):
        same(a.__dict__, b.__dict__)
        assert a.__pydantic_fields_set__ == b.__pydantic_fields_set__
        assert a.__pydantic_extra__ == b.__pydantic_extra__
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            same(a[key], b[key])
    else:
        assert a == b


def mutable_ids(value: Any, out: set[int] | None = None) -> set[int]:
    """The ids of every list, dict and model in `value`."""
    out = set() if out is None else out
    if isinstance(value, BaseModel):
        out.add(id(value))
        mutable_ids(value.__dict__, out)
    elif isinstance(value, (list, dict)):
        out.add(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            mutable_ids(item, out)
    return out


def test_a_growing_conversation_decodes_as_the_serde_decodes_it_and_only_what_it_added() -> None:
    serde, decoded = _serde()
    lists = DecodedLists(8 * 1024 * 1024)
    reference = JsonPlusSerializer()
    conversation: list[BaseMessage] = []
    for turn in range(60):
        conversation = [*conversation, *_turn(turn)]
        data = serde.dumps_typed(conversation)
        decoded.clear()
        value = lists.decode(serde, CHANNEL, *data)
        same(value, reference.loads_typed(data))
        if turn >= 12:
            # Past a few turns the list is kept: the serde decodes what the turn added, or
            # what turns added since the list was kept, never the whole conversation.
            assert sum(decoded) <= len(conversation) // 4 + 3, (turn, decoded)
    assert len(lists) == 1


def test_a_conversation_read_newest_first_decodes_as_the_serde_and_mostly_from_the_pickle() -> None:
    # A history read newest first meets each list before the states it grew from: those
    # decode to the first objects of the kept list (new objects each read), not through
    # the serde.
    serde, decoded = _serde()
    lists = DecodedLists(8 * 1024 * 1024)
    reference = JsonPlusSerializer()
    states = []
    conversation: list[BaseMessage] = []
    for turn in range(40):
        conversation = [*conversation, *_turn(turn)]
        states.append(serde.dumps_typed(conversation))
    read: list[Any] = []
    decoded.clear()
    for data in reversed(states):
        value = lists.decode(serde, CHANNEL, *data)
        same(value, reference.loads_typed(data))
        read.append(value)
    # The newest two through the serde (the second is seen to shrink and kept), the rest
    # from the kept pickle but the first turns' lists, too small to keep (`MIN_BASE`).
    assert decoded == [120, 117, 6, 3], decoded
    assert not mutable_ids(read[2]) & mutable_ids(read[3])
    read[2][0].content = "changed in place"
    same(lists.decode(serde, CHANNEL, *states[0]), reference.loads_typed(states[0]))


def test_no_two_reads_share_an_object_and_a_callers_change_reaches_no_later_read() -> None:
    serde, _ = _serde()
    lists = DecodedLists(8 * 1024 * 1024)
    conversation = [m for turn in range(30) for m in _turn(turn)]
    data = serde.dumps_typed(conversation)
    lists.decode(serde, CHANNEL, *data)
    first = lists.decode(serde, CHANNEL, *data)
    second = lists.decode(serde, CHANNEL, *data)
    assert not mutable_ids(first) & mutable_ids(second)
    first[0].content = "changed in place"
    first[1].tool_calls[0]["args"]["order"] = -1
    first.append(HumanMessage(content="appended in place"))
    same(lists.decode(serde, CHANNEL, *data), JsonPlusSerializer().loads_typed(data))


def test_values_that_do_not_grow_the_kept_list_decode_whole_and_right() -> None:
    """An edited earlier message, a shortened list, a list begun again: each decodes as the
    serde decodes it."""
    serde, _ = _serde()
    lists = DecodedLists(8 * 1024 * 1024)
    base = [m for turn in range(30) for m in _turn(turn)]
    edited = [*base[:5], HumanMessage(content="edited", id=base[5].id), *base[6:]]
    for value in (base, [*base, *_turn(30)], edited, base[:40], _turn(99) * 20, base):
        data = serde.dumps_typed(value)
        same(lists.decode(serde, CHANNEL, *data), JsonPlusSerializer().loads_typed(data))


@pytest.mark.parametrize(
    "odd",
    [
        datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC),
        {1, 2, 3},
        Stamped(text="own pickling"),
        uuid.UUID(int=7),
    ],
    ids=["datetime", "set", "own-pickling", "uuid"],
)
def test_a_list_holding_what_pickle_may_not_copy_exactly_is_always_decoded_by_the_serde(
    odd: Any,
) -> None:
    serde, decoded = _serde()
    lists = DecodedLists(8 * 1024 * 1024)
    conversation: list[Any] = [odd]
    for turn in range(30):
        conversation = [*conversation, *_turn(turn)]
        data = serde.dumps_typed(conversation)
        decoded.clear()
        value = lists.decode(serde, CHANNEL, *data)
        same(value, JsonPlusSerializer().loads_typed(data))
        assert sum(decoded) == len(conversation)


def test_exact_takes_only_what_pickle_copies_exactly() -> None:
    assert exact([1, 2.5, "s", b"b", None, True, (1, "x"), {"k": [1, {"n": None}]}])
    assert exact(Note(text="t", tags=["a"]))
    assert exact(_turn(1))
    assert not exact({1, 2})
    assert not exact(Stamped(text="t"))
    assert not exact([Note(text="t"), datetime.date(2026, 1, 1)])
    assert not exact({("tuple", "key"): 1})
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    assert not exact(deep)


def test_another_serde_or_no_room_decodes_everything_through_the_serde() -> None:
    conversation = [m for turn in range(30) for m in _turn(turn)]
    counted = Counted()
    data = counted.dumps_typed(conversation)
    for serde, limit in ((counted, 8 * 1024 * 1024), (JsonPlusSerializer(), 0)):
        lists = DecodedLists(limit)
        for _ in range(3):
            same(lists.decode(serde, CHANNEL, *data), JsonPlusSerializer().loads_typed(data))
        assert len(lists) == 0


def test_kept_lists_stay_within_their_bound() -> None:
    serde, _ = _serde()
    lists = DecodedLists(200_000)
    for thread in range(20):
        conversation: list[BaseMessage] = []
        for turn in range(20):
            conversation = [*conversation, *_turn(turn)]
            lists.decode(serde, (f"t{thread}", "", "messages"), *serde.dumps_typed(conversation))
            assert lists.size <= 200_000
    assert 0 < len(lists) < 20
    lists.forget_thread("t19")
    assert all(key[0] != "t19" for key in lists._entries)


def test_random_lists_always_decode_as_the_serde_decodes_them() -> None:
    rng = random.Random(11)
    serde, _ = _serde()
    lists = DecodedLists(4 * 1024 * 1024)
    reference = JsonPlusSerializer()

    def item() -> Any:
        return rng.choice(
            [
                rng.randrange(-(2**40), 2**40),
                "s" * rng.randrange(400),
                [1, "x", {"k": rng.random()}],
                None,
                Note(text="n" * rng.randrange(200), tags=["t"] * rng.randrange(3)),
                rng.choice(_turn(rng.randrange(100))),
                (1, 2),
            ]
        )

    values: list[Any] = []
    for _ in range(400):
        roll = rng.random()
        if roll < 0.7:
            values = [*values, *(item() for _ in range(rng.randrange(1, 5)))]
        elif roll < 0.8:
            values = values[: rng.randrange(len(values) + 1)]
        elif roll < 0.9 and values:
            values = [*values]
            values[rng.randrange(len(values))] = item()
        else:
            values = [item() for _ in range(rng.randrange(60))]
        data = serde.dumps_typed(values)
        same(
            lists.decode(serde, ("t", "", str(rng.randrange(2))), *data),
            reference.loads_typed(data),
        )


# --- on the database under test ----------------------------------------------------------------


@pytest.mark.database
async def test_a_conversation_read_each_turn_is_the_callers_own_and_the_stored_one(
    sql: SqlConnection,
) -> None:
    """Each turn reads the latest checkpoint back (from the kept list, past a few turns) and
    changes what it got in place: no later read sees the change, from this saver or from one
    that keeps nothing."""
    saver = SqlCheckpointSaver(sql)
    fresh = SqlCheckpointSaver(sql, value_cache_bytes=0)
    thread_id = f"thread-{uuid.uuid4()}"
    thread = Thread(saver, thread_id)
    serde = JsonPlusSerializer()
    conversation: list[BaseMessage] = []
    for turn in range(40):
        conversation = [*conversation, *_turn(turn)]
        await thread.put({"messages": conversation})
        # What the serde alone gives back (the fields a model was built with, say).
        expected = serde.loads_typed(serde.dumps_typed(conversation))
        found = await saver.aget_tuple(_config(thread_id))
        assert found is not None
        messages = found.checkpoint["channel_values"]["messages"]
        same(messages, expected)
        messages[0].content = f"changed at turn {turn}"
        messages.append(HumanMessage(content="appended in place"))
    latest = await fresh.aget_tuple(_config(thread_id))
    again = await saver.aget_tuple(_config(thread_id))
    assert latest is not None and again is not None
    same(latest.checkpoint["channel_values"]["messages"], expected)
    same(again.checkpoint["channel_values"]["messages"], expected)
    await saver.adelete_thread(thread_id)


def _kept_conversation() -> tuple[DecodedLists, JsonPlusSerializer, tuple[str, bytes]]:
    """Lists with a conversation kept as a pickle: its next read loads the pickle."""
    serde = JsonPlusSerializer()
    lists = DecodedLists(8 * 1024 * 1024)
    data = serde.dumps_typed([m for turn in range(30) for m in _turn(turn)])
    lists.decode(serde, CHANNEL, *data)
    lists.decode(serde, CHANNEL, *data)
    return lists, serde, data


def test_a_pickle_loads_with_the_collector_paused_and_running_again_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load makes a few thousand young objects at once, none of them garbage: the cyclic
    collector is paused while it runs (so it is not stopped every 700 objects to move the
    half-made list a generation older), and runs again once it ends, or fails."""
    lists, serde, data = _kept_conversation()
    seen: list[bool] = []
    loads = pickle.loads

    def watched(pickled: bytes) -> Any:
        seen.append(gc.isenabled())
        return loads(pickled)

    monkeypatch.setattr(pickle, "loads", watched)
    assert gc.isenabled()
    same(lists.decode(serde, CHANNEL, *data), JsonPlusSerializer().loads_typed(data))
    assert seen == [False] and gc.isenabled()

    def failing(pickled: bytes) -> Any:
        raise pickle.UnpicklingError("truncated")

    monkeypatch.setattr(pickle, "loads", failing)
    with pytest.raises(pickle.UnpicklingError):
        lists.decode(serde, CHANNEL, *data)
    assert gc.isenabled()


def test_a_collector_the_application_paused_stays_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    lists, serde, data = _kept_conversation()
    gc.disable()
    try:
        lists.decode(serde, CHANNEL, *data)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_loads_in_two_threads_resume_the_collector_only_when_both_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lists, serde, data = _kept_conversation()
    loads = pickle.loads
    both_in = threading.Barrier(2, timeout=60)
    first_out = threading.Event()
    still_paused: list[bool] = []

    def overlapping(pickled: bytes) -> Any:
        both_in.wait()
        if threading.current_thread().name == "second":
            # Bounded: a load that never comes back fails the test, not the run.
            assert first_out.wait(60)
            still_paused.append(not gc.isenabled())
        return loads(pickled)

    monkeypatch.setattr(pickle, "loads", overlapping)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            lists.decode(serde, CHANNEL, *data)
            if threading.current_thread().name == "first":
                first_out.set()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            first_out.set()

    threads = [threading.Thread(target=read, name=name) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive()
    assert not errors, errors
    assert still_paused == [True] and gc.isenabled()
