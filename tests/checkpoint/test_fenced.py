"""What the fenced `SqlCheckpointSaver` does beyond the reusable fenced-saver contract it
passes (`test_saver_contract.py`): the errors naming what a lease lacks, the scope's
high-water mark its writes raise, an unfenced saver ignoring leases, and the exact
statements of a fenced write and of its refusal on each database."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from agboss_sql.contracts.clocks import StoreClock, VirtualClock
from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.types import ApplicationContext, ExecutionLease
from agboss_sql.sql.checkpoint import LEASE_KEY, SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import execution_leases

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


async def test_a_fenced_saver_names_what_its_lease_lacks_and_raises_the_scope_mark(
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


async def test_an_unfenced_saver_ignores_leases(sql: SqlConnection, clock: VirtualClock) -> None:
    saver = SqlCheckpointSaver(sql)
    stale = ExecutionLease(TENANT, "never-taken", "instance-a", 7, LEASE_MS)
    thread = f"thread-{uuid.uuid4()}"
    first = await _put(saver, _config(thread, stale), {"n": 1})
    found = await saver.aget_tuple({"configurable": {"thread_id": thread}})
    assert found is not None and found.config["configurable"]["checkpoint_id"] == first


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
        first = await _put(a.saver, _config(thread, lease), {"n": {1}})  # a value row
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
