"""The fenced checkpoint saver's cases of what it stores: the write limit of a put (values and
metadata) and of a put_writes (values and channel names), appends never stored against a
deleted base, `delete_for_runs` leaving the checkpoints that name no run, a saver that
keeps no value storing a growing conversation whole, values that have no length read
back as written, a retried task's writes, a task's fifty writes read back, and the saver
used without a lease keeping as much."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from agboss_sql.contracts.errors import InvalidPayloadError
from agboss_sql.contracts.limits import MAX_CHECKPOINT_WRITE_BYTES
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing._saver_support import (
    CONTRACT,
    LEASE,
    LEASE_KEY,
    LEASE_MS,
    READER,
    TENANT,
    UNFENCED,
    SaverOptions,
    Thread,
    config,
    grow,
    ids_of,
    in_thread,
    latest_of,
    new_execution,
    new_thread,
    read_back,
    reader,
    rows_of,
    turn,
)

ESCAPED = b"\x00'\"\\"
"""Bytes a driver may escape (NUL, quotes, backslash): twice as many on the wire."""
LIMIT = "MAX_CHECKPOINT_WRITE_BYTES"


async def _over_limit(options: SaverOptions, saver: Any, call: Awaitable[Any], what: str) -> None:
    """`call` is refused with `InvalidPayloadError` naming the write limit, before any
    statement when the set shows its statements."""
    sent: list[str] = []
    try:
        if options.statements is None:
            await call
        else:
            with options.statements.record(saver) as seen:
                try:
                    await call
                finally:
                    sent = list(seen)
    except InvalidPayloadError as error:
        assert error.facts.get("limit") == LIMIT, f"[limit] {what}: {error.facts}"
        assert sent == [], f"[limit] {what} was refused after statements were sent: {sent}"
        return
    raise AssertionError(f"[limit] {what} over {LIMIT} was written, not refused")


def _need_unfenced(ctx: CaseContext) -> None:
    if not ctx.has(UNFENCED):
        import pytest

        pytest.skip("no `unfenced=` given: the saver used without a lease")


async def _held(ctx: CaseContext) -> Any:
    lease = await ctx.store(LEASE, 0).acquire(TENANT, new_execution(), LEASE_MS)
    assert lease is not None
    return lease


async def put_limit(ctx: CaseContext, options: SaverOptions) -> None:
    """A put's values, body and metadata count toward `MAX_CHECKPOINT_WRITE_BYTES`: values
    under it are kept and read back; values at it, or under it with metadata that takes the
    put over it, are refused before any statement and store nothing."""
    a, lease, thread_id = ctx.store(CONTRACT, 0), await _held(ctx), new_thread()
    thread = Thread(a, thread_id, lease)
    kept = ESCAPED * ((MAX_CHECKPOINT_WRITE_BYTES - 4096) // len(ESCAPED))
    first = await thread.put({"ch": kept})
    found = await reader(ctx).aget_tuple(config(thread_id, parent=first))
    assert found is not None and found.checkpoint["channel_values"]["ch"] == kept

    over = ESCAPED * (MAX_CHECKPOINT_WRITE_BYTES // len(ESCAPED))
    await _over_limit(options, a, thread.put({"ch": over}), "a put whose values are at the limit")
    thread.last = first
    under = b"v" * (MAX_CHECKPOINT_WRITE_BYTES - 64 * 1024)
    note = {"source": "loop", "step": 0, "note": "m" * (128 * 1024)}
    await _over_limit(
        options, a, thread.put({"ch": under}, metadata=note), "a put whose metadata is over"
    )
    assert await ids_of(reader(ctx), thread_id) == [first]


async def writes_limit(ctx: CaseContext, options: SaverOptions) -> None:
    """A put_writes's values and channel names count toward `MAX_CHECKPOINT_WRITE_BYTES`:
    writes under it are kept; a value of the limit's size with its channel's name, or
    writes each under it that together are over it, are refused before any statement and
    store nothing."""
    a, lease, thread_id = ctx.store(CONTRACT, 0), await _held(ctx), new_thread()
    first = await Thread(a, thread_id, lease).put({"ch": ["v"]})
    cfg = config(thread_id, lease, first)
    kept = ESCAPED * ((MAX_CHECKPOINT_WRITE_BYTES - 4096) // len(ESCAPED))
    await a.aput_writes(cfg, [("ch", kept)], "task-1")
    over = ESCAPED * (MAX_CHECKPOINT_WRITE_BYTES // len(ESCAPED))
    await _over_limit(
        options, a, a.aput_writes(cfg, [("ch", over)], "task-2"), "a put_writes at the limit"
    )
    half = ESCAPED * ((MAX_CHECKPOINT_WRITE_BYTES // 2 + 4096) // len(ESCAPED))
    await _over_limit(
        options,
        a,
        a.aput_writes(cfg, [("ch", half), ("other", half)], "task-3"),
        "a put_writes whose writes are together over the limit",
    )
    found = await reader(ctx).aget_tuple(config(thread_id, parent=first))
    assert found is not None
    assert [(t, c, len(v)) for t, c, v in found.pending_writes] == [("task-1", "ch", len(kept))]
    assert found.pending_writes[0][2] == kept


async def _deleted_base(
    ctx: CaseContext, options: SaverOptions, *, copy: bool, unfenced: bool = False
) -> None:
    if unfenced:
        _need_unfenced(ctx)
        a, lease, thread_id = ctx.store(UNFENCED, 0), None, new_thread()
    else:
        a, lease, thread_id = ctx.store(CONTRACT, 0), await _held(ctx), new_thread()
    _, before = await grow(Thread(a, thread_id, lease), [], range(12))
    if copy:
        try:
            await a.acopy_thread(thread_id, new_thread())
        except NotImplementedError:
            import pytest

            pytest.skip("the saver does not copy threads (acopy_thread)")
    await ctx.store(CONTRACT, 1).adelete_thread(thread_id)
    assert await ids_of(reader(ctx), thread_id) == []
    assert await rows_of(options, thread_id) in (None, 0), "[delete] rows of the thread left"

    # Begun again where it was: its first value extends the base the saver remembers.
    thread = Thread(a, thread_id, lease)
    ids, states = [await thread.put({"messages": before[-1]})], [before[-1]]
    more_ids, more_states = await grow(thread, before[-1], range(12, 15))
    await read_back(reader(ctx), thread_id, ids + more_ids, states + more_states)


async def deleted_base(ctx: CaseContext, options: SaverOptions) -> None:
    """The base a saver remembers was deleted by another instance (the thread deleted and
    begun again with the same conversation): the put that would append to it finds it gone
    in its own transaction, stores the value whole, and every checkpoint reads back."""
    await _deleted_base(ctx, options, copy=False)


async def deleted_base_of_a_copy(ctx: CaseContext, options: SaverOptions) -> None:
    """As above, the thread copied before the delete: the copy holds the base's very
    channel and version in another thread, which is no base of this one."""
    await _deleted_base(ctx, options, copy=True)


async def deleted_base_unfenced(ctx: CaseContext, options: SaverOptions) -> None:
    """As `deleted_base`, written by the saver used without a lease (the set's `unfenced`),
    whose puts may take another path than a fenced one's."""
    await _deleted_base(ctx, options, copy=False, unfenced=True)


async def runs_leave_unnamed(ctx: CaseContext, options: SaverOptions) -> None:
    """`delete_for_runs` deletes the checkpoints of the runs named, and leaves a checkpoint
    whose metadata names no run (deleting the run "None", the text a missing run id would
    read as, leaves it)."""
    a, lease, thread_id = ctx.store(CONTRACT, 0), await _held(ctx), new_thread()
    thread = Thread(a, thread_id, lease)
    unnamed = await thread.put({"a": ["a1"]}, metadata={"source": "loop", "step": 0})
    await thread.put({"a": ["a2"]}, metadata={"run_id": "None", "step": 1})
    named = await thread.put({"a": ["a3"]}, metadata={"run_id": "run-1", "step": 2})
    await a.adelete_for_runs(["None"])
    assert await ids_of(reader(ctx), thread_id) == [named, unnamed]
    await a.adelete_for_runs(["run-1"])
    assert await ids_of(reader(ctx), thread_id) == [unnamed]
    latest = await latest_of(reader(ctx), thread_id)
    assert latest is not None and latest.checkpoint["channel_values"] == {"a": ["a1"]}


async def keeps_nothing(ctx: CaseContext, options: SaverOptions) -> None:
    """A saver that keeps no value (the set's `reader`) still writes a growing conversation
    under its lease, each value whole or against a base it stored, and reads it back."""
    if not ctx.has(READER):
        import pytest

        pytest.skip("no `reader=` given: a saver that keeps no value")
    writer, lease, thread_id = ctx.store(READER, 0), await _held(ctx), new_thread()
    ids, states = await grow(Thread(writer, thread_id, lease), [], range(8))
    await read_back(ctx.store(READER, 1), thread_id, ids, states)
    await read_back(ctx.store(CONTRACT, 1), thread_id, ids, states)


async def retried_append_no_base(ctx: CaseContext, options: SaverOptions) -> None:
    """The new holder, after a takeover, puts again the last checkpoint the old one stored
    (a retry on another instance): its value row stays as first stored, possibly an
    append, though this saver serialised it whole; its next put must not take it for a
    base (an append to an append would not read back)."""
    leases_a, leases_b = ctx.store(LEASE, 0), ctx.store(LEASE, 1)
    execution, thread_id = new_execution(), new_thread()
    lease_a = await leases_a.acquire(TENANT, execution, LEASE_MS)
    assert lease_a is not None
    ids, states = await grow(Thread(ctx.store(CONTRACT, 0), thread_id, lease_a), [], range(12))
    await ctx.clock.advance(LEASE_MS + 1)
    lease_b = await leases_b.acquire(TENANT, execution, LEASE_MS)
    assert lease_b is not None
    b = ctx.store(CONTRACT, 1)
    latest = await latest_of(b, thread_id)
    assert latest is not None and latest.parent_config is not None
    parent = {**latest.parent_config}
    parent["configurable"] = {**parent["configurable"], LEASE_KEY: lease_b}
    version = latest.checkpoint["channel_versions"]["messages"]
    again = await b.aput(parent, latest.checkpoint, latest.metadata, {"messages": version})
    assert again["configurable"]["checkpoint_id"] == ids[-1], again
    thread = Thread(b, thread_id, lease_b)
    thread.values = dict(latest.checkpoint["channel_values"])
    thread.versions, thread.last = dict(latest.checkpoint["channel_versions"]), ids[-1]
    more_ids, more_states = await grow(thread, states[-1], range(12, 14), tag="b ")
    await read_back(reader(ctx), thread_id, ids + more_ids, states + more_states)


async def values_without_length(ctx: CaseContext, options: SaverOptions) -> None:
    """Channel values that have no length (a datetime, a UUID), beside a short text and a
    number, are read back as written, by the writer and by a reader."""
    import datetime
    import uuid

    a, lease, thread_id = ctx.store(CONTRACT, 0), await _held(ctx), new_thread()
    values = {
        "when": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "text": "short",
        "n": 7,
    }
    first = await Thread(a, thread_id, lease).put(values)
    for saver in (a, reader(ctx)):
        found = await saver.aget_tuple(config(thread_id, parent=first))
        assert found is not None, "[values] the checkpoint was not stored"
        assert found.checkpoint["channel_values"] == values, "[values] read back otherwise"


async def retried_writes(ctx: CaseContext, options: SaverOptions) -> None:
    """A task's writes put again (a retried task) keep their first values and add no
    write; its writes to the special channels (an error, an interrupt) take the latest."""
    from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

    a, lease, thread_id = ctx.store(CONTRACT, 0), await _held(ctx), new_thread()
    first = await Thread(a, thread_id, lease).put({"ch": "v"})
    cfg = config(thread_id, lease, first)
    await a.aput_writes(cfg, [("a", "b-0"), ("c", "b-1")], "task-b", "path-b")
    await a.aput_writes(cfg, [("a", "b-0 again"), ("c", "b-1 again")], "task-b", "path-b")
    await a.aput_writes(cfg, [(ERROR, "boom")], "task-c", "path-c")
    await a.aput_writes(cfg, [(ERROR, "boom again"), (INTERRUPT, "ask")], "task-c", "path-c")
    found = await reader(ctx).aget_tuple(config(thread_id, parent=first))
    assert found is not None
    assert sorted(found.pending_writes) == [
        ("task-b", "a", "b-0"),
        ("task-b", "c", "b-1"),
        ("task-c", ERROR, "boom again"),
        ("task-c", INTERRUPT, "ask"),
    ], f"[writes] a retried task's writes: {found.pending_writes}"


async def many_writes(ctx: CaseContext, options: SaverOptions) -> None:
    """One put_writes of fifty writes (more rows than a statement of one saver may
    hold) is kept whole and read back in its order."""
    a, lease, thread_id = ctx.store(CONTRACT, 0), await _held(ctx), new_thread()
    first = await Thread(a, thread_id, lease).put({"ch": "v"})
    writes = [(f"ch-{i}", f"value {i}") for i in range(50)]
    await a.aput_writes(config(thread_id, lease, first), writes, "task-1", "path-1")
    found = await reader(ctx).aget_tuple(config(thread_id, parent=first))
    assert found is not None
    assert found.pending_writes == [("task-1", c, v) for c, v in writes], "[writes] 50 writes"


async def unfenced_writes(ctx: CaseContext, options: SaverOptions) -> None:
    """The saver used as LangGraph uses a checkpointer, with no lease in its configs (the
    set's `unfenced`): a put of fifty values and a task's fifty writes (async), another
    task's forty (sync), are kept and read back, each task's writes in their order, by it
    and by a reader."""
    _need_unfenced(ctx)
    saver, thread_id = ctx.store(UNFENCED, 0), new_thread()
    values = {f"ch-{i}": [f"value {i}"] for i in range(50)}
    first = await Thread(saver, thread_id, None).put(values)
    cfg = config(thread_id, parent=first)
    writes = {
        "task-1": [(f"ch-{i}", f"write {i}") for i in range(50)],
        "task-2": [(f"ch-{i}", f"sync write {i}") for i in range(40)],
    }
    await saver.aput_writes(cfg, writes["task-1"], "task-1", "path-1")
    await in_thread(saver.put_writes, cfg, writes["task-2"], "task-2", "path-2")
    for by in (saver, reader(ctx)):
        found = await by.aget_tuple(config(thread_id, parent=first))
        assert found is not None, "[unfenced] the checkpoint was not stored"
        assert found.checkpoint["channel_values"] == values, "[unfenced] fifty values"
        for task, written in writes.items():
            got = [(c, v) for t, c, v in found.pending_writes if t == task]
            assert got == written, f"[unfenced] {task}'s {len(written)} writes: {got}"


async def unfenced_appends_beside_values(ctx: CaseContext, options: SaverOptions) -> None:
    """The saver used without a lease (the set's `unfenced`) grows a conversation while
    another channel changes in the same puts: every put that may append carries more than
    one new value, and each checkpoint reads back both, by it and by a reader."""
    _need_unfenced(ctx)
    saver, thread_id = ctx.store(UNFENCED, 0), new_thread()
    thread, conversation = Thread(saver, thread_id, None), list[str]()
    ids: list[str] = []
    states: list[list[str]] = []
    for n in range(12):
        conversation = [*conversation, turn(n)]
        ids.append(await thread.put({"messages": conversation, "step": [n, "step"]}))
        states.append(conversation)
    await read_back(reader(ctx), thread_id, ids, states)
    for by in (saver, reader(ctx)):
        for n, checkpoint_id in enumerate(ids):
            found = await by.aget_tuple(config(thread_id, parent=checkpoint_id))
            assert found is not None, f"[unfenced] checkpoint {n} is gone"
            values = found.checkpoint["channel_values"]
            assert values.get("step") == [n, "step"], f"[unfenced] put {n} lost a value: {values}"
            assert values.get("messages") == states[n], f"[unfenced] put {n}'s conversation"
