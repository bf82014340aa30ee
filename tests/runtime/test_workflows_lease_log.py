"""The lease log of a run cancelled while it was paused, on the database under test: its
root's last lease move is `finished`, and no `lost` is logged, even when the engine closes
the moment the run's result is in (the run's close, and its lease's finish, race the
shutdown that releases every lease still held). And a keeper's finish that its caller
cancels after the store applied it still ends `finished`: a release meanwhile sends
nothing, so the store never refuses it into a false `lost`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionLease,
    LeaseEventKind,
    StoreClock,
    VirtualClock,
)
from agboss_sql.runtime import Child, Engine, LeaseKeeper, WorkflowContext, Workflows
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository

WAIT_S = 30.0
"""A run of a few steps on one engine: milliseconds, seconds on a loaded machine."""

app = Workflows("lease-log")


async def double(n: int) -> int:
    return 2 * n


async def forget(_doubled: int) -> None:
    return None


@app.workflow
async def leaf(ctx: WorkflowContext, n: int) -> int:
    return await ctx.step("double", double, n)


@app.workflow
async def tree(ctx: WorkflowContext, n: int) -> dict[str, object]:
    doubled = await ctx.step("double", double, n, undo=forget)
    leaves = await ctx.children("leaves", [Child("leaf", i) for i in range(n)])
    decision = await ctx.pause("approval", {"doubled": doubled})
    return {"doubled": doubled, "leaves": leaves, "decision": decision}


async def test_a_tree_cancelled_while_paused_logs_its_lease_finished_not_lost(
    sql: SqlConnection, sql_url: str
) -> None:
    paused = asyncio.Event()

    def on_event(event: dict[str, Any]) -> None:
        if event.get("kind") == "paused" and event.get("tree") == "t-cancelled":
            paused.set()

    async with Engine(app, url=sql_url, lease_ms=3_000, on_event=on_event) as engine:
        cancelled = await engine.start("tree", 2, id="t-cancelled")
        await asyncio.wait_for(paused.wait(), WAIT_S)
        assert await engine.cancel("t-cancelled")
        with pytest.raises(Exception, match="cancel"):
            await cancelled.result(timeout_s=WAIT_S)
        # Closed at once: the shutdown's release of the leases still held must not find
        # the run's lease half-finished.

    async with Engine(app, url=sql_url, work=False) as reader:
        moves = await reader.events.list("default", "t-cancelled")
    kinds = [move.kind for move in moves]
    assert LeaseEventKind.LOST not in kinds, [(m.kind.value, m.reason) for m in moves]
    assert kinds[-1] is LeaseEventKind.FINISHED, kinds


class SlowAnswers(SqlExecutionLeaseRepository):
    """Leases whose finish is applied by the store, then answered only once `answer` is set
    (a reply still on its way when the caller is cancelled)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.applied = asyncio.Event()
        self.answer = asyncio.Event()

    async def finish(self, lease: ExecutionLease) -> bool:
        done = await super().finish(lease)
        self.applied.set()
        await self.answer.wait()
        return done


async def test_a_finish_cancelled_after_the_store_applied_it_is_logged_finished(
    sql: SqlConnection,
) -> None:
    app = ApplicationContext(instance_id="instance-1")
    clock = VirtualClock(1_000_000)
    leases = SlowAnswers(sql, StoreClock(), app)
    events = SqlExecutionLeaseEventRepository(sql, clock, app)
    keeper = LeaseKeeper(leases, events, clock, lease_ms=30_000)
    assert await keeper.take("tenant-1", "tree-1") is not None
    keeper.start()
    finishing = asyncio.get_running_loop().create_task(keeper.finish())
    await asyncio.wait_for(leases.applied.wait(), WAIT_S)
    finishing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await finishing
    # As an engine's shutdown does with every lease that still looks held.
    assert not await keeper.release()
    leases.answer.set()
    await asyncio.wait_for(keeper.flush(), WAIT_S)
    assert not keeper.held and not keeper.lost
    kinds = [event.kind for event in await events.list("tenant-1", "tree-1")]
    assert kinds == [LeaseEventKind.ACQUIRED, LeaseEventKind.FINISHED]
