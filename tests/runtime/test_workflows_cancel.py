"""Cancelling a workflow run from another instance, on the database under test: every
finished step and effect with an undo (a child's steps too) is undone once, last finished
first, however many cancels come and even when the instance unwinding it dies mid-undo; a
cancel after the run decided to close is refused and the run succeeds; a long step that
watches the abort signal stops early."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from workflow_support import (
    LEASE_MS,
    Calls,
    Cluster,
    committed_rows,
    frozen_clock,
    insert_row,
    open_cluster,
    stored_results,
    until,
)

from agboss_sql.contracts.errors import ExecutionCancelledError
from agboss_sql.runtime import Child, Engine, WorkflowContext, Workflows, WorkflowState
from agboss_sql.runtime._run import Run
from agboss_sql.sql.connection import SqlConnection


@pytest.fixture
async def cluster(sql: SqlConnection, sql_url: str) -> AsyncIterator[Cluster]:
    async for made in open_cluster(sql_url, sql):
        yield made


def trips(undone: Calls, frozen_in: dict[str, asyncio.Event]) -> Workflows:
    """`trip`: reserve (a step), charge (an effect), a `pack` child with a step, then a
    pause; each with an undo that notes which instance ran it. An instance named in
    `frozen_in` stops for good at the start of the `release` undo (it dies mid-undo)."""
    app = Workflows("trips")

    @app.workflow
    async def trip(ctx: WorkflowContext, name: str) -> dict[str, Any]:
        async def reserve(n: str) -> str:
            return f"seat for {n}"

        async def release(seat: str) -> None:
            frozen = frozen_in.get(ctx.instance_id)
            if frozen is not None:
                frozen.set()
                await asyncio.Event().wait()
            undone("release", ctx.instance_id)

        async def charge(tx: Any, n: str) -> int:
            await insert_row(tx, f"{n}|charge")
            return 100

        async def refund(tx: Any, cents: int) -> None:
            await insert_row(tx, f"{name}|refund {cents}")
            undone("refund", ctx.instance_id)

        seat = await ctx.step("reserve", reserve, name, undo=release)
        cents = await ctx.effect("charge", charge, name, undo=refund)
        [box] = await ctx.children("pack", [Child("pack", name)])
        decision = await ctx.pause("approval", {"cents": cents})
        return {"seat": seat, "box": box, "decision": decision}

    @app.workflow
    async def pack(ctx: WorkflowContext, name: str) -> str:
        async def box(n: str) -> str:
            return f"box for {n}"

        async def unpack(packed: str) -> None:
            undone("unpack", ctx.instance_id)

        return await ctx.step("box", box, name, undo=unpack)

    return app


async def run_to_the_pause(cluster: Cluster, a: Engine, workflow_id: str) -> None:
    """Run a trip on `a` (its child too) until it waits at its pause, holding no lease."""
    await a.start("trip", "ann", id=workflow_id, tenant_id=cluster.tenant)
    await cluster.wait_state(a, workflow_id, WorkflowState.PAUSED)
    await cluster.wait_lease(a, workflow_id, ("released", "a", 2))


async def test_a_cancel_from_another_instance_undoes_each_finished_step_once_last_first(
    cluster: Cluster, sql: SqlConnection
) -> None:
    undone = Calls()
    app = trips(undone, {})
    a = await cluster.engine("a", app)
    b = await cluster.engine("b", app, background=False)
    client = await cluster.engine("client", app, work=False)
    await run_to_the_pause(cluster, a, "t-1")
    # Two cancels at once, from two other instances: both accepted.
    answers = await asyncio.gather(
        b.cancel("t-1", tenant_id=cluster.tenant),
        client.cancel("t-1", tenant_id=cluster.tenant),
    )
    assert list(answers) == [True, True]
    # Two workers' sweeps at once: one of them unwinds the run.
    c = await cluster.engine("c", app, background=False)
    swept = await asyncio.gather(b.sweep_once(), c.sweep_once())
    [by] = [engine.instance_id for engine, leases in zip((b, c), swept, strict=True) if leases]
    assert [lease.execution_id for leases in swept for lease in leases] == ["t-1"]
    await cluster.wait_state(b, "t-1", WorkflowState.CANCELLED)
    # The child's step finished last, the reserve first: undone in that order, once each.
    assert undone.made == [("unpack", by), ("refund", by), ("release", by)]
    assert await committed_rows(sql) == ["ann|charge", "ann|refund 100"]
    assert [e["undone"] for e in cluster.of("unwound", tree="t-1")] == [3]
    # Another cancel of the cancelled run: accepted, and nothing runs again.
    assert await client.cancel("t-1", tenant_id=cluster.tenant) is True
    assert list(await asyncio.gather(b.sweep_once(), c.sweep_once())) == [[], []]
    assert await cluster.state(b, "t-1") is WorkflowState.CANCELLED
    assert len(undone.made) == 3


async def test_an_unwind_whose_instance_dies_mid_undo_is_finished_elsewhere_once_each(
    cluster: Cluster, sql: SqlConnection
) -> None:
    undone = Calls()
    x_frozen = asyncio.Event()
    app = trips(undone, {"x": x_frozen})
    a = await cluster.engine("a", app)
    await run_to_the_pause(cluster, a, "t-1")
    assert await a.cancel("t-1", tenant_id=cluster.tenant) is True
    # "a" leaves (its sweep would race the takeover below when the clock moves).
    await a.close()
    # "x" takes the cancelled run, undoes the child's step and the charge, and dies before
    # the reserve's undo: its lease is left to run out.
    x = await cluster.engine("x", app, background=False, clock=frozen_clock())
    assert [lease.execution_id for lease in await x.sweep_once()] == ["t-1"]
    await asyncio.wait_for(x_frozen.wait(), 30)
    assert undone.made == [("unpack", "x"), ("refund", "x")]
    b = await cluster.engine("b", app, background=False)
    await cluster.take_over(b, "t-1")
    await cluster.wait_state(b, "t-1", WorkflowState.CANCELLED)
    # "b" ran only what "x" had not finished.
    assert undone.made == [("unpack", "x"), ("refund", "x"), ("release", "b")]
    assert await committed_rows(sql) == ["ann|charge", "ann|refund 100"]


async def test_a_cancel_after_the_run_decided_to_close_is_refused_and_the_run_succeeds(
    cluster: Cluster, sql: SqlConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    undone = Calls()
    app = Workflows("shop")

    async def reserve() -> str:
        return "seat"

    async def release(seat: str) -> None:
        undone("release", seat)

    @app.workflow
    async def order(ctx: WorkflowContext) -> Any:
        return await ctx.step("reserve", reserve, undo=release)

    a = await cluster.engine("a", app)
    b = await cluster.engine("b", app, background=False)
    answers: list[bool] = []
    decide_close = a.executor.decide_close

    async def decide_then_cancel(run: Run) -> bool:
        # The cancel lands between the run's close decision and its end.
        decided = await decide_close(run)
        answers.append(await b.cancel("o-1", tenant_id=cluster.tenant))
        return decided

    monkeypatch.setattr(a.executor, "decide_close", decide_then_cancel)
    await a.start("order", id="o-1", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "o-1", WorkflowState.SUCCEEDED)
    assert answers == [False]
    assert (await a.status("o-1", tenant_id=cluster.tenant)).result == "seat"
    assert len(cluster.of("cancel-too-late", tree="o-1", engine="b")) == 1
    assert undone.made == []


async def test_a_long_step_watching_the_abort_signal_stops_when_another_instance_cancels(
    cluster: Cluster, sql: SqlConnection
) -> None:
    rounds: list[int] = []
    stopped: list[BaseException] = []
    app = Workflows("reports")

    @app.workflow
    async def report(ctx: WorkflowContext) -> Any:
        async def crunch() -> int:
            # A long step in parts, looking at the signal between them.
            while not ctx.signal.aborted:
                rounds.append(1)
                await asyncio.sleep(0.005)
            try:
                ctx.check()
            except BaseException as error:
                stopped.append(error)
                raise
            return len(rounds)

        return await ctx.step("crunch", crunch)

    a = await cluster.engine("a", app, background=False)
    b = await cluster.engine("b", app, background=False)
    await a.start("report", id="r-1", tenant_id=cluster.tenant)

    async def crunching() -> bool:
        return bool(rounds)

    await until(crunching, "r-1 in its long step")
    assert await b.cancel("r-1", tenant_id=cluster.tenant) is True
    # "a" reads the cancel request with its next renewal, a third of a lease on.
    await cluster.clock.advance(LEASE_MS // 3)
    await cluster.wait_state(a, "r-1", WorkflowState.CANCELLED)
    assert [type(error) for error in stopped] == [ExecutionCancelledError]
    assert await stored_results(sql, "r-1", "crunch#1") == 0
