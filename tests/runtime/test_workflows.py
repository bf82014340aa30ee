"""The workflow engine's behaviours on the database under test, with one to three
instances (each an `Engine` with its own connection) on one virtual clock: effects write
their business rows in the fence's transaction; children run on any instance while their
parent waits holding nothing; a pause is answered once from any instance; a worker leaves
a workflow its app lacks to one that has it; steps at once stay within the engine's
bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from workflow_support import (
    Calls,
    Cluster,
    Gate,
    committed_rows,
    insert_row,
    open_cluster,
    stored_results,
    until,
)

from agboss_sql.contracts.errors import NotPausedError
from agboss_sql.runtime import (
    Child,
    ChildWorkflowFailedError,
    PauseInfo,
    WorkflowContext,
    Workflows,
    WorkflowState,
)
from agboss_sql.sql.connection import SqlConnection


@pytest.fixture
async def cluster(sql: SqlConnection, sql_url: str) -> AsyncIterator[Cluster]:
    async for made in open_cluster(sql_url, sql):
        yield made


# -- effects -------------------------------------------------------------------------------


def payments(calls: Calls) -> Workflows:
    app = Workflows("payments")

    @app.workflow
    async def pay(ctx: WorkflowContext, order: dict[str, Any]) -> Any:
        async def reserve(o: dict[str, Any]) -> str:
            return str(o["id"])

        async def charge(tx: Any, o: dict[str, Any]) -> dict[str, Any]:
            calls("charge", ctx.workflow_id)
            await insert_row(tx, f"{o['id']}|charge")
            if o.get("declined"):
                raise ValueError("card declined")
            return {"cents": o["cents"], "run": ctx.workflow_id}

        await ctx.step("reserve", reserve, order)
        return await ctx.effect("charge", charge, order, business_key=order["id"])

    return app


async def test_an_effect_that_raises_after_writing_leaves_no_row_and_no_result(
    cluster: Cluster, sql: SqlConnection
) -> None:
    calls = Calls()
    a = await cluster.engine("a", payments(calls))
    order = {"id": "o-1", "cents": 100, "declined": True}
    await a.start("pay", order, id="p-1", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "p-1", WorkflowState.FAILED)
    status = await a.status("p-1", tenant_id=cluster.tenant)
    assert isinstance(status.error, dict) and status.error["type"] == "ValueError"
    assert calls.of("charge") == ["p-1"]
    # The row written on the effect's transaction went with its failure; nothing stored.
    assert await committed_rows(sql) == []
    assert await stored_results(sql, "p-1", "charge#1") == 0
    assert await stored_results(sql, "p-1", "reserve#1") == 1


async def test_a_business_key_shared_by_two_runs_of_the_tenant_charges_once(
    cluster: Cluster, sql: SqlConnection
) -> None:
    calls = Calls()
    a = await cluster.engine("a", payments(calls))
    order = {"id": "o-1", "cents": 100}
    for run in ("p-1", "p-2"):
        handle = await a.start("pay", order, id=run, tenant_id=cluster.tenant)
        # The second run gets the first run's stored result: one charge, one row.
        assert await handle.result(timeout_s=30) == {"cents": 100, "run": "p-1"}
    assert calls.of("charge") == ["p-1"]
    assert await committed_rows(sql) == ["o-1|charge"]
    # Another tenant's order o-1 is another key.
    other = await a.start("pay", order, id="p-1", tenant_id=f"{cluster.tenant}-2")
    assert await other.result(timeout_s=30) == {"cents": 100, "run": "p-1"}
    assert calls.of("charge") == ["p-1", "p-1"]
    assert await committed_rows(sql) == ["o-1|charge", "o-1|charge"]


# -- children ------------------------------------------------------------------------------


def fulfilment(calls: Calls) -> Workflows:
    app = Workflows("fulfilment")

    @app.workflow
    async def order(ctx: WorkflowContext, items: list[str]) -> dict[str, Any]:
        async def plan() -> int:
            calls("plan", ctx.instance_id)
            return len(items)

        async def close(shipped: list[Any]) -> int:
            calls("close", ctx.instance_id)
            return len(shipped)

        planned = await ctx.step("plan", plan)
        try:
            shipped = await ctx.children("ship", [Child("ship", item) for item in items])
        except ChildWorkflowFailedError as error:
            return {"failed": [f["child"] for f in error.facts["failures"]]}
        closed = await ctx.step("close", close, shipped)
        return {"planned": planned, "shipped": shipped, "closed": closed}

    @app.workflow
    async def ship(ctx: WorkflowContext, item: str) -> dict[str, Any]:
        async def label() -> str:
            calls(f"ship {item}", ctx.instance_id)
            if item == "broken":
                raise ValueError("no such item")
            return f"label-{item}"

        return {"item": item, "label": await ctx.step("label", label), "on": ctx.instance_id}

    return app


async def test_children_run_on_another_instance_while_their_parent_waits_holding_nothing(
    cluster: Cluster,
) -> None:
    calls = Calls()
    app = fulfilment(calls)
    # "a" runs what is started on it and nothing else (no child pump): the children can
    # only run on "b".
    a = await cluster.engine("a", app, background=False)
    await a.start("order", ["x", "y", "z"], id="o-1", tenant_id=cluster.tenant)
    # Waiting for its children: queued, its lease yielded, no step slot held.
    waiting = [("acquired", "a", 1), ("yielded", "a", 1)]

    async def yielded() -> bool:
        return await cluster.lease_log(a, "o-1") == waiting

    await until(yielded, lambda: f"o-1 yielding its lease; events: {cluster.events}")
    assert await cluster.state(a, "o-1") is WorkflowState.QUEUED
    assert a.slots.busy == 0
    children = await a.queue.children(cluster.tenant, "o-1")
    assert [c.status for c in children] == ["queued"] * 3
    # "b" starts once they are queued (where the queue notifies, it claims them at once).
    b = await cluster.engine("b", app)
    await cluster.wait_state(b, "o-1", WorkflowState.SUCCEEDED, move=True)
    status = await b.status("o-1", tenant_id=cluster.tenant)
    assert status.result == {
        "planned": 3,
        "shipped": [{"item": i, "label": f"label-{i}", "on": "b"} for i in ("x", "y", "z")],
        "closed": 3,
    }
    # Woken once, by the finisher of the last child, and resumed from its stored steps.
    assert [e["engine"] for e in cluster.of("woke", tree="o-1")] == ["b"]
    assert calls.of("plan") == ["a"]
    assert calls.of("close") == ["b"]
    assert sorted(calls.of("ship x") + calls.of("ship y") + calls.of("ship z")) == ["b"] * 3


async def test_a_failed_child_is_a_child_workflow_failed_error_in_the_parent(
    cluster: Cluster,
) -> None:
    calls = Calls()
    a = await cluster.engine("a", fulfilment(calls))
    await a.start("order", ["x", "broken"], id="o-1", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "o-1", WorkflowState.SUCCEEDED, move=True)
    status = await a.status("o-1", tenant_id=cluster.tenant)
    assert status.result == {"failed": ["o-1/ship#1.1"]}
    assert calls.of("close") == []


# -- pauses --------------------------------------------------------------------------------


def approvals(calls: Calls) -> Workflows:
    app = Workflows("approvals")

    @app.workflow
    async def refund(ctx: WorkflowContext, cents: int) -> dict[str, Any]:
        async def pay_back(decision: Any) -> str:
            calls("pay back", ctx.instance_id)
            return f"paid by {ctx.instance_id}"

        decision = await ctx.pause("approval", {"cents": cents})
        paid = await ctx.step("pay back", pay_back, decision)
        return {"decision": decision, "paid": paid}

    return app


async def test_a_pause_answered_on_two_instances_at_once_resumes_once(
    cluster: Cluster,
) -> None:
    calls = Calls()
    app = approvals(calls)
    a = await cluster.engine("a", app, background=False)
    b = await cluster.engine("b", app, background=False)
    await a.start("refund", 500, id="r-1", tenant_id=cluster.tenant)
    # Paused: the record first, then its lease released.
    await cluster.wait_state(a, "r-1", WorkflowState.PAUSED)
    await cluster.wait_lease(a, "r-1", ("released", "a", 1))
    status = await b.status("r-1", tenant_id=cluster.tenant)
    assert status.pending_pause == PauseInfo("approval", {"cents": 500}, "pending", None)
    answers = await asyncio.gather(
        a.resume("r-1", {"by": "a"}, tenant_id=cluster.tenant),
        b.resume("r-1", {"by": "b"}, tenant_id=cluster.tenant),
        return_exceptions=True,
    )
    errors = [x for x in answers if x is not None]
    assert len(errors) == 1 and isinstance(errors[0], NotPausedError), answers
    winner = "a" if answers[0] is None else "b"
    await cluster.wait_state(a, "r-1", WorkflowState.SUCCEEDED)
    # Run on by one instance (the resolver, or the paused run that saw the answer as it
    # parked), its step after the pause once.
    [(_, ran_on)] = calls.made
    status = await a.status("r-1", tenant_id=cluster.tenant)
    assert status.result == {"decision": {"by": winner}, "paid": f"paid by {ran_on}"}
    assert status.pauses == (PauseInfo("approval", {"cents": 500}, "taken", {"by": winner}),)
    with pytest.raises(NotPausedError):
        await b.resume("r-1", {"by": "late"}, tenant_id=cluster.tenant)


async def test_a_pause_answered_by_a_client_is_picked_up_by_a_workers_sweep(
    cluster: Cluster,
) -> None:
    calls = Calls()
    app = approvals(calls)
    a = await cluster.engine("a", app, background=False)
    client = await cluster.engine("client", app, work=False)
    b = await cluster.engine("b", app, background=False)
    await a.start("refund", 500, id="r-1", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "r-1", WorkflowState.PAUSED)
    await cluster.wait_lease(a, "r-1", ("released", "a", 1))
    # "a" goes away: the run is paused, and no instance that ran it is left.
    await a.close()
    await client.resume("r-1", {"ok": True}, tenant_id=cluster.tenant)
    # Runnable again, and run by nobody yet: the client runs nothing.
    assert await cluster.state(client, "r-1") is WorkflowState.RUNNING
    assert calls.made == []
    taken = await b.sweep_once()
    assert [lease.execution_id for lease in taken] == ["r-1"]
    await cluster.wait_state(b, "r-1", WorkflowState.SUCCEEDED)
    assert (await b.status("r-1", tenant_id=cluster.tenant)).result == {
        "decision": {"ok": True},
        "paid": "paid by b",
    }
    assert calls.made == [("pay back", "b")]


# -- which instance runs what --------------------------------------------------------------


def split_apps(calls: Calls) -> tuple[Workflows, Workflows]:
    """`parent` on both apps; `work` (what `parent` runs as its child) on `full` only."""
    lean, full = Workflows("lean"), Workflows("full")

    async def parent(ctx: WorkflowContext, n: int) -> Any:
        return await ctx.child("work", "work", n)

    async def work(ctx: WorkflowContext, n: int) -> dict[str, Any]:
        calls("work", ctx.instance_id)
        return {"n": n, "on": ctx.instance_id}

    for app in (lean, full):
        app.register(parent)
    full.register(work)
    return lean, full


async def test_a_worker_leaves_a_workflow_its_app_lacks_to_one_that_has_it(
    cluster: Cluster,
) -> None:
    calls = Calls()
    lean, full = split_apps(calls)
    a = await cluster.engine("a", lean, background=False)
    b = await cluster.engine("b", full, background=False)
    client = await cluster.engine("client", Workflows("none"), work=False)
    await a.start("work", 1, id="w-1", tenant_id=cluster.tenant)
    await client.start("work", 2, id="w-2", tenant_id=cluster.tenant)
    # Started and left running: "a" neither ran it nor takes it.
    assert await a.sweep_once() == []
    assert calls.made == []
    assert sorted(lease.execution_id for lease in await b.sweep_once()) == ["w-1", "w-2"]
    for run, n in (("w-1", 1), ("w-2", 2)):
        await cluster.wait_state(b, run, WorkflowState.SUCCEEDED)
        assert (await b.status(run, tenant_id=cluster.tenant)).result == {"n": n, "on": "b"}
    assert calls.made == [("work", "b"), ("work", "b")]
    await cluster.wait_lease(b, "w-1", ("finished", "b", 1))
    assert await cluster.lease_log(b, "w-1") == [("acquired", "b", 1), ("finished", "b", 1)]


async def test_a_child_whose_workflow_an_instance_lacks_runs_on_one_that_has_it(
    cluster: Cluster,
) -> None:
    calls = Calls()
    lean, full = split_apps(calls)
    a = await cluster.engine("a", lean)
    # A child "a" claimed first goes back at once; "b"'s rescue (every sweep) takes it.
    await cluster.engine("b", full, sweep_ms=1_000)
    await a.start("parent", 7, id="p-1", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "p-1", WorkflowState.SUCCEEDED, move=True)
    assert (await a.status("p-1", tenant_id=cluster.tenant)).result == {"n": 7, "on": "b"}
    assert calls.made == [("work", "b")]
    assert cluster.of("child-run", engine="a") == []


# -- step slots ----------------------------------------------------------------------------


async def test_no_more_than_max_concurrent_steps_run_at_once_on_an_engine(
    cluster: Cluster,
) -> None:
    gate = Gate()
    running: list[int] = []
    peak = 0

    async def work() -> None:
        nonlocal peak
        running.append(1)
        peak = max(peak, len(running))
        await gate()
        running.pop()

    app = Workflows("busy")

    @app.workflow
    async def busy(ctx: WorkflowContext) -> None:
        await ctx.step("work", work)

    a = await cluster.engine("a", app, max_concurrent_steps=2)
    for i in range(6):
        await a.start("busy", id=f"b-{i}", tenant_id=cluster.tenant)

    async def all_arrived() -> bool:
        # Every run is in its step or waiting for a slot.
        return len(running) + a.slots.waiting == 6

    await until(all_arrived, lambda: f"6 runs at their step: {len(running)} in, {a.slots.waiting}")
    assert len(running) == 2
    gate.open()
    for i in range(6):
        await cluster.wait_state(a, f"b-{i}", WorkflowState.SUCCEEDED)
    assert peak == 2
