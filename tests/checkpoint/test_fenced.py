"""A fenced saver writes only while its writer's lease is held: a frozen instance that
wakes after a takeover cannot overwrite the new holder's checkpoint."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from checkpoint_graphs import approval_graph, request
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.types import Command

from agboss_sql.contracts.clocks import StoreClock, VirtualClock
from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.keys import scope_key_of
from agboss_sql.contracts.types import ApplicationContext, ExecutionLease
from agboss_sql.sql.checkpoint import LEASE_KEY, SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, execution_leases

TENANT = "tenant-1"
LEASE_MS = 30_000
START = 1_700_000_000_000


def _checkpoint(values: dict[str, Any]) -> Checkpoint:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = dict(values)
    # Versions of the form `get_next_version` makes (a counter and a random fraction).
    checkpoint["channel_versions"] = {name: f"{1:032}.{random.random():016}" for name in values}
    return checkpoint


def _config(thread_id: str, lease: Any, parent: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": "", LEASE_KEY: lease}
    if parent is not None:
        configurable["checkpoint_id"] = parent
    return {"configurable": configurable}


async def _put(saver: SqlCheckpointSaver, config: dict[str, Any], values: dict[str, Any]) -> str:
    checkpoint = _checkpoint(values)
    stored = await saver.aput(
        config, checkpoint, {"source": "loop", "step": 1}, checkpoint["channel_versions"]
    )
    checkpoint_id: str = stored["configurable"]["checkpoint_id"]
    return checkpoint_id


class Instance:
    """One application instance: its own connection, lease store and fenced saver."""

    def __init__(self, connection: SqlConnection, clock: VirtualClock, name: str) -> None:
        store_clock = StoreClock(clock)
        self.leases = SqlExecutionLeaseRepository(connection, store_clock, ApplicationContext(name))
        self.saver = SqlCheckpointSaver(connection, fenced=True, store_clock=store_clock)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


async def test_a_late_writer_is_refused_after_a_takeover_and_the_new_checkpoint_stays(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection], clock: VirtualClock
) -> None:
    execution = f"run-{uuid.uuid4()}"
    thread = f"thread-{uuid.uuid4()}"
    a = Instance(sql, clock, "instance-a")
    b = Instance(new_connection(), clock, "instance-b")

    lease_a = await a.leases.acquire(TENANT, execution, LEASE_MS)
    assert lease_a is not None and lease_a.lease_epoch == 1
    first = await _put(a.saver, _config(thread, lease_a), {"answer": ["from a, step 1"]})

    # A freezes; its lease runs out; B takes over and writes the next checkpoint.
    await clock.advance(LEASE_MS + 1)
    lease_b = await b.leases.acquire(TENANT, execution, LEASE_MS)
    assert lease_b is not None and lease_b.lease_epoch == 2
    assert lease_b.taken_over_from is not None
    as_dict = {
        "tenant_id": TENANT,
        "execution_id": execution,
        "lease_epoch": lease_b.lease_epoch,
        "holder_instance_id": "instance-b",
    }
    second = await _put(b.saver, _config(thread, as_dict, first), {"answer": ["from b, step 2"]})

    # A wakes and writes as if it still held the lease: a new checkpoint ...
    with pytest.raises(ExecutionFencedError) as refused:
        await _put(a.saver, _config(thread, lease_a, first), {"answer": ["from a, late"]})
    assert refused.value.reason == "superseded"
    assert refused.value.token == 1
    assert refused.value.scope_key == scope_key_of(TENANT, execution)
    # ... an overwrite of B's checkpoint (same id) ...
    stale = _checkpoint({"answer": ["from a, overwrite"]})
    stale["id"] = second
    with pytest.raises(ExecutionFencedError):
        await a.saver.aput(
            _config(thread, lease_a, first),
            stale,
            {"source": "loop", "step": 2},
            stale["channel_versions"],
        )
    # ... and pending writes on B's checkpoint.
    with pytest.raises(ExecutionFencedError):
        await a.saver.aput_writes(_config(thread, lease_a, second), [("answer", "late")], "task-1")

    latest = await b.saver.aget_tuple({"configurable": {"thread_id": thread}})
    assert latest is not None
    assert latest.config["configurable"]["checkpoint_id"] == second
    assert latest.checkpoint["channel_values"] == {"answer": ["from b, step 2"]}
    assert latest.metadata["step"] == 1
    assert latest.pending_writes == []
    history = [t async for t in a.saver.alist({"configurable": {"thread_id": thread}})]
    assert [t.config["configurable"]["checkpoint_id"] for t in history] == [second, first]
    # Nothing of A's refused writes reached the database.
    blobs = await sql.execute(sa.select(sa.func.count()).select_from(checkpoint_blobs))
    writes = await sql.execute(sa.select(sa.func.count()).select_from(checkpoint_writes))
    assert blobs.scalar() == 2
    assert writes.scalar() == 0
    # Nor are they kept: A keeps the one value it wrote while it held the lease.
    assert len(a.saver._values) == 1

    # B keeps writing: A's refusals did not touch B's lease. A retried task adds nothing.
    for _ in range(2):
        await b.saver.aput_writes(
            _config(thread, lease_b, second), [("answer", "b's write")], "task-2"
        )
    with pytest.raises(ExecutionFencedError):
        await a.saver.aput_writes(
            _config(thread, lease_a, second), [("answer", "b's write")], "task-2"
        )
    found = await b.saver.aget_tuple(_config(thread, lease_b, second))
    assert found is not None and found.pending_writes == [("task-2", "answer", "b's write")]
    third = await _put(b.saver, _config(thread, lease_b, second), {"answer": "from b, step 3"})
    latest = await a.saver.aget_tuple({"configurable": {"thread_id": thread}})
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == third
    assert latest.checkpoint["channel_values"] == {"answer": "from b, step 3"}


async def test_the_fence_decides_by_the_store_time_at_the_expiry_boundary(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    execution = f"run-{uuid.uuid4()}"
    thread = f"thread-{uuid.uuid4()}"
    a = Instance(sql, clock, "instance-a")
    lease = await a.leases.acquire(TENANT, execution, LEASE_MS)
    assert lease is not None

    await clock.advance(LEASE_MS - 1)  # 1 ms before expiry: still held
    first = await _put(a.saver, _config(thread, lease), {"n": 1})
    await clock.advance(1)  # exactly at expiry: over, though nobody took it
    with pytest.raises(ExecutionFencedError) as refused:
        await _put(a.saver, _config(thread, lease, first), {"n": 2})
    assert refused.value.reason == "expired"
    with pytest.raises(ExecutionFencedError):
        await a.saver.aput_writes(_config(thread, lease, first), [("n", 3)], "task-1")

    renewed = await a.leases.acquire(TENANT, execution, LEASE_MS)
    assert renewed is not None and renewed.lease_epoch == 2
    await _put(a.saver, _config(thread, renewed, first), {"n": 2})
    # The old epoch stays refused, though its instance holds the new one.
    with pytest.raises(ExecutionFencedError):
        await _put(a.saver, _config(thread, lease, first), {"n": 4})


async def test_released_yielded_and_absent_leases_are_refused(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    a = Instance(sql, clock, "instance-a")
    thread = f"thread-{uuid.uuid4()}"

    released = await a.leases.acquire(TENANT, "released", LEASE_MS)
    assert released is not None and await a.leases.release(released)
    yielded = await a.leases.acquire(TENANT, "yielded", LEASE_MS)
    assert yielded is not None and await a.leases.yield_lease(yielded)
    finished = await a.leases.acquire(TENANT, "finished", LEASE_MS)
    assert finished is not None and await a.leases.finish(finished)
    absent = ExecutionLease(TENANT, "never-taken", "instance-a", 1, LEASE_MS)

    for lease, reason in [
        (released, "released"),
        (yielded, "yielded"),
        (finished, "finished"),
        (absent, "lease-absent"),
    ]:
        with pytest.raises(ExecutionFencedError) as refused:
            await _put(a.saver, _config(thread, lease), {"n": 1})
        assert refused.value.reason == reason
    assert [t async for t in a.saver.alist({"configurable": {"thread_id": thread}})] == []


async def test_a_fenced_saver_needs_a_lease_and_raises_the_scope_mark(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    a = Instance(sql, clock, "instance-a")
    thread = f"thread-{uuid.uuid4()}"
    with pytest.raises(ValueError, match="agboss_lease"):
        await _put(a.saver, {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, {"n": 1})
    with pytest.raises(ValueError, match="lease_epoch"):
        await _put(a.saver, _config(thread, {"tenant_id": TENANT, "execution_id": "x"}), {"n": 1})
    assert [t async for t in a.saver.alist({"configurable": {"thread_id": thread}})] == []

    # A fenced write raises the scope's high-water mark to its token, as a fenced effect does.
    lease = await a.leases.acquire(TENANT, "marked", LEASE_MS)
    assert lease is not None
    await clock.advance(LEASE_MS)
    lease = await a.leases.acquire(TENANT, "marked", LEASE_MS)
    assert lease is not None and lease.lease_epoch == 2
    mark = sa.select(execution_leases.c.fence_token).where(
        execution_leases.c.execution_id == "marked"
    )
    assert (await sql.execute(mark)).scalar() == 0
    await _put(a.saver, _config(thread, lease), {"n": 1})
    assert (await sql.execute(mark)).scalar() == 2


class SaverTrustingTheEpoch(SqlCheckpointSaver):
    """A broken twin: the fence checks the epoch alone (each write goes under the name of
    whoever holds the lease now), as the saver did before writes named their holder."""

    async def _as_holder(self, config: Any) -> Any:
        lease = config["configurable"][LEASE_KEY]
        row = await self.connection.execute(
            sa.select(execution_leases.c.holder_instance_id).where(
                execution_leases.c.tenant_id == lease.tenant_id,
                execution_leases.c.execution_id == lease.execution_id,
            )
        )
        holder = row.scalar()
        if holder is None:
            return config
        configurable = {
            **config["configurable"],
            LEASE_KEY: dataclasses.replace(lease, holder_instance_id=holder),
        }
        return {**config, "configurable": configurable}

    async def aput(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        return await super().aput(await self._as_holder(config), *args, **kwargs)

    async def aput_writes(self, config: Any, *args: Any, **kwargs: Any) -> None:
        await super().aput_writes(await self._as_holder(config), *args, **kwargs)


async def _another_holders_epoch_is_refused(
    saver: SqlCheckpointSaver, a: Instance, clock: VirtualClock
) -> str | None:
    """What a fenced saver did wrong with a lease built by hand under another instance's
    name at the holder's current epoch (`None`: it refused every write, wrote nothing)."""
    thread = f"thread-{uuid.uuid4()}"
    lease = await a.leases.acquire(TENANT, f"run-{uuid.uuid4()}", LEASE_MS)
    assert lease is not None
    first = await _put(a.saver, _config(thread, lease), {"n": 1})
    forged = dataclasses.replace(lease, holder_instance_id="instance-b")
    as_dict = {
        "tenant_id": lease.tenant_id,
        "execution_id": lease.execution_id,
        "lease_epoch": lease.lease_epoch,
        "holder_instance_id": "instance-b",
    }
    for hand_built in (forged, as_dict):
        try:
            await _put(saver, _config(thread, hand_built, first), {"n": "forged"})
            return f"a checkpoint under {hand_built!r} was written"
        except ExecutionFencedError as refused:
            if refused.reason != "superseded":
                return f"refused for {refused.reason!r}, not as superseded"
        try:
            await saver.aput_writes(_config(thread, hand_built, first), [("n", 2)], "task-1")
            return f"pending writes under {hand_built!r} were written"
        except ExecutionFencedError:
            pass
    latest = await a.saver.aget_tuple({"configurable": {"thread_id": thread}})
    assert latest is not None
    if latest.config["configurable"]["checkpoint_id"] != first or latest.pending_writes:
        return f"the thread moved: {latest.checkpoint['channel_values']}, {latest.pending_writes}"
    return None


async def test_a_lease_under_another_holders_name_is_refused_and_writes_nothing(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    a = Instance(sql, clock, "instance-a")
    assert await _another_holders_epoch_is_refused(a.saver, a, clock) is None
    # A lease that names no holder is refused before any statement.
    thread = f"thread-{uuid.uuid4()}"
    lease = await a.leases.acquire(TENANT, f"run-{uuid.uuid4()}", LEASE_MS)
    assert lease is not None
    no_holder = {"tenant_id": TENANT, "execution_id": lease.execution_id, "lease_epoch": 1}
    with pytest.raises(ValueError, match="holder_instance_id"):
        await _put(a.saver, _config(thread, no_holder), {"n": 1})
    with pytest.raises(ValueError, match="holder"):
        await _put(a.saver, _config(thread, dataclasses.replace(lease, holder_instance_id="")), {})
    assert [t async for t in a.saver.alist({"configurable": {"thread_id": thread}})] == []


async def test_the_holder_case_bites_a_saver_that_trusts_the_epoch(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    a = Instance(sql, clock, "instance-a")
    twin = SaverTrustingTheEpoch(sql, fenced=True, store_clock=StoreClock(clock))
    found = await _another_holders_epoch_is_refused(twin, a, clock)
    assert found is not None and "was written" in found, found


async def test_an_unfenced_saver_ignores_leases(sql: SqlConnection, clock: VirtualClock) -> None:
    saver = SqlCheckpointSaver(sql)
    stale = ExecutionLease(TENANT, "never-taken", "instance-a", 7, LEASE_MS)
    thread = f"thread-{uuid.uuid4()}"
    first = await _put(saver, _config(thread, stale), {"n": 1})
    found = await saver.aget_tuple({"configurable": {"thread_id": thread}})
    assert found is not None and found.config["configurable"]["checkpoint_id"] == first


async def test_a_graph_on_a_fenced_saver_runs_while_held_and_stops_after_a_takeover(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection], clock: VirtualClock
) -> None:
    execution = f"run-{uuid.uuid4()}"
    thread = f"thread-{uuid.uuid4()}"
    a = Instance(sql, clock, "instance-a")
    b = Instance(new_connection(), clock, "instance-b")
    lease_a = await a.leases.acquire(TENANT, execution, LEASE_MS)
    assert lease_a is not None

    graph_a = approval_graph().compile(checkpointer=a.saver)
    paused = await graph_a.ainvoke(request("refund"), _config(thread, lease_a))
    assert paused["steps"] == ["draft"]

    await clock.advance(LEASE_MS)
    lease_b = await b.leases.acquire(TENANT, execution, LEASE_MS)
    assert lease_b is not None

    # The zombie's resume is refused at its first checkpoint write ...
    with pytest.raises(ExecutionFencedError):
        await graph_a.ainvoke(Command(resume="no"), _config(thread, lease_a))
    # ... and the new holder resumes from the paused state.
    graph_b = approval_graph().compile(checkpointer=b.saver)
    done = await graph_b.ainvoke(Command(resume="yes"), _config(thread, lease_b))
    assert done["steps"] == ["draft", "approve", "send"]
    assert done["decision"] == "yes"


async def test_what_a_fenced_write_and_its_refusal_send(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    """The fence is the first statement of the write's transaction (or folded into the write's
    one statement); a refusal reads its reason inside a transaction that takes the fence
    first, and rolls it back."""
    a = Instance(sql, clock, "instance-a")
    thread = f"thread-{uuid.uuid4()}"
    lease = await a.leases.acquire(TENANT, f"run-{uuid.uuid4()}", LEASE_MS)
    assert lease is not None
    fence_sql = sql.compiled(a.saver._sql.fences.fence).sql
    diagnose_sql = sql.compiled(a.saver._sql.fences.diagnose).sql
    sent: list[str] = []
    stop = sql.add_statement_listener(lambda text, _params: sent.append(text))
    try:
        first = await _put(a.saver, _config(thread, lease), {"n": [1]})
        put = list(sent)
        sent.clear()
        await a.saver.aput_writes(_config(thread, lease, first), [("n", 2)], "task-1")
        put_writes = list(sent)
        sent.clear()
        # The same writes again (a retried task): they add nothing, and are not refused.
        await a.saver.aput_writes(_config(thread, lease, first), [("n", 2)], "task-1")
        put_writes_again = list(sent)
        sent.clear()
        await clock.advance(LEASE_MS)
        with pytest.raises(ExecutionFencedError) as refused:
            await _put(a.saver, _config(thread, lease, first), {"n": 3})
        refusal = list(sent)
    finally:
        stop()
    assert refused.value.reason == "expired"

    def in_transaction(statements: list[str], end: str) -> None:
        assert statements[0].startswith("BEGIN") and statements[-1] == end, statements
        assert statements[1] == fence_sql, statements

    if sql.capabilities.dml_in_with:
        assert len(put) == 1 and "agboss_fence" in put[0], put
        assert len(put_writes) == 1 and "agboss_fence" in put_writes[0], put_writes
        assert put_writes_again[0] == put_writes[0], put_writes_again
        in_transaction(put_writes_again[1:], "COMMIT")
        assert len(put_writes_again) == 5, put_writes_again
        assert "agboss_fence" in refusal[0], refusal
        refusal = refusal[1:]
    else:
        in_transaction(put, "COMMIT")
        assert len(put) == 5, put  # BEGIN, fence, values, checkpoint, COMMIT
        in_transaction(put_writes, "COMMIT")
        assert len(put_writes) == 4, put_writes  # BEGIN, fence, writes, COMMIT
        assert put_writes_again == put_writes
    in_transaction(refusal, "ROLLBACK")
    assert refusal[2:] == [diagnose_sql, "ROLLBACK"], refusal


async def test_a_growing_list_is_stored_as_appends_only_while_the_lease_is_held(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection], clock: VirtualClock
) -> None:
    """Appends ride the fenced put: held, they are written under the fence; after a
    takeover, the put that would append is refused like any other, and writes nothing."""
    execution = f"run-{uuid.uuid4()}"
    thread = f"thread-{uuid.uuid4()}"
    a = Instance(sql, clock, "instance-a")
    b = Instance(new_connection(), clock, "instance-b")
    lease_a = await a.leases.acquire(TENANT, execution, LEASE_MS)
    assert lease_a is not None

    conversation: list[str] = []
    parent: str | None = None
    for turn in range(12):
        conversation = [*conversation, f"turn {turn}: " + "words " * 60]
        parent = await _put(a.saver, _config(thread, lease_a, parent), {"messages": conversation})
    rows = (await sql.execute(sa.select(checkpoint_blobs.c.base_version))).rows
    assert any(base is not None for (base,) in rows), rows
    stored = len(rows)

    await clock.advance(LEASE_MS + 1)
    lease_b = await b.leases.acquire(TENANT, execution, LEASE_MS)
    assert lease_b is not None
    late = [*conversation, "turn 12: from a, late"]
    with pytest.raises(ExecutionFencedError) as refused:
        await _put(a.saver, _config(thread, lease_a, parent), {"messages": late})
    assert refused.value.reason == "superseded"
    assert len((await sql.execute(sa.select(checkpoint_blobs.c.version))).rows) == stored

    grown = [*conversation, "turn 12: from b"]
    await _put(b.saver, _config(thread, lease_b, parent), {"messages": grown})
    fresh = SqlCheckpointSaver(sql, value_cache_bytes=0)
    latest = await fresh.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
    assert latest is not None and latest.checkpoint["channel_values"]["messages"] == grown
