"""The undo of a cancelled run, on the database under test, in the two orders a run and a
cancel can meet: a cancel that lands after the run made calls (its undo list is found by
a replay whose keys count from one, not from where the run stood), and a cancel racing a
run that is about to pause (whichever comes second sees the other: the run never parks
in a pause nobody will answer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from workflow_support import Calls, Cluster, Gate, open_cluster, until

from agboss_sql.runtime import Child, WorkflowContext, Workflows, WorkflowState
from agboss_sql.sql.connection import SqlConnection


@pytest.fixture
async def cluster(sql: SqlConnection, sql_url: str) -> AsyncIterator[Cluster]:
    async for made in open_cluster(sql_url, sql):
        yield made


def orders(undone: Calls, gate: Gate) -> Workflows:
    """`order`: reserve (an effect), two `item` children each charging (an effect), then a
    `close` step that waits at `gate`; every effect with an undo."""
    app = Workflows("orders")

    async def noted(tx: Any, what: str) -> str:
        return what

    @app.workflow
    async def item(ctx: WorkflowContext, n: int) -> int:
        async def refund(tx: Any, charged: str) -> None:
            undone(f"refund {n}", ctx.instance_id)

        await ctx.effect("charge", noted, f"charge {n}", undo=refund)
        return n

    @app.workflow
    async def order(ctx: WorkflowContext, _: Any) -> str:
        async def release(tx: Any, reserved: str) -> None:
            undone("release", ctx.instance_id)

        async def close() -> str:
            await gate()
            return "closed"

        await ctx.effect("reserve", noted, "reserve", undo=release)
        await ctx.children("items", [Child("item", n) for n in range(2)])
        return await ctx.step("close", close)

    return app


async def test_a_cancel_after_the_run_made_calls_undoes_every_finished_effect(
    cluster: Cluster,
) -> None:
    undone, gate = Calls(), Gate()
    engine = await cluster.engine("a", orders(undone, gate))
    await engine.start("order", None, id="o-1", tenant_id=cluster.tenant)
    # The run, resumed after its children, stands at `close`: its calls have counted
    # `reserve#1` and `items#1` already when the cancel comes.
    await gate.wait_reached()
    assert await engine.cancel("o-1", tenant_id=cluster.tenant)
    gate.open()
    await cluster.wait_state(engine, "o-1", WorkflowState.CANCELLED, move=True)
    assert sorted(w for w, _ in undone.made) == ["refund 0", "refund 1", "release"]
    assert undone.made[-1][0] == "release"  # the first effect is undone last


def pauses(gate: Gate) -> Workflows:
    app = Workflows("pauses")

    @app.workflow
    async def approve(ctx: WorkflowContext, _: Any) -> Any:
        await ctx.step("prepare", gate)  # the cancel lands while the run stands here
        return await ctx.pause("approval", {"ok?": True})

    return app


async def test_a_cancel_racing_a_run_about_to_pause_ends_it_cancelled(cluster: Cluster) -> None:
    gate = Gate()

    async def prepared() -> None:
        await gate()

    engine = await cluster.engine("a", pauses(gate))
    await engine.start("approve", None, id="p-1", tenant_id=cluster.tenant)
    await gate.wait_reached()
    # The cancel reads the record while it is still `running`: it cancels no pause. The
    # run then reaches its pause and must see the cancel instead of waiting forever.
    assert await engine.cancel("p-1", tenant_id=cluster.tenant)
    gate.open()

    async def ended() -> bool:
        return (await cluster.state(engine, "p-1")).ended

    await until(ended, lambda: f"p-1 ended; events: {cluster.events}", clock=cluster.clock)
    assert await cluster.state(engine, "p-1") is WorkflowState.CANCELLED
