"""The workflow engine when a run changes hands, on the database under test: a run taken
over by another instance replays what it stored and re-runs only the interrupted step; a
zombie's step and effect writes are refused; an outbound call is sent at most once per
attempt; a step whose arguments changed under a running tree is a conflict.

Each instance is an `Engine` with its own connection. Instance "a" is frozen on its own
clock that never moves (its lease is neither renewed nor given up, as in a process that
stopped); the store's time is the cluster's virtual clock, which a test moves past the
lease before instance "b"'s sweep takes the run over: no real waiting."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from workflow_support import (
    Calls,
    Cluster,
    Gate,
    committed_rows,
    frozen_clock,
    insert_row,
    open_cluster,
    stored_results,
    until,
)

from agboss_sql.contracts import LeaseHolder
from agboss_sql.runtime import WorkflowContext, Workflows, WorkflowState
from agboss_sql.sql.connection import SqlConnection


@pytest.fixture
async def cluster(sql: SqlConnection, sql_url: str) -> AsyncIterator[Cluster]:
    async for made in open_cluster(sql_url, sql):
        yield made


class Holds:
    """Gates by `(point, instance)`: `await holds("pack", ctx.instance_id)` waits at the
    gate the test put there, if any."""

    def __init__(self, *where: tuple[str, str]) -> None:
        self.gates = {at: Gate() for at in where}

    def __getitem__(self, at: tuple[str, str]) -> Gate:
        return self.gates[at]

    async def __call__(self, point: str, instance: str) -> None:
        gate = self.gates.get((point, instance))
        if gate is not None:
            await gate()


def shop(calls: Calls, holds: Holds) -> Workflows:
    """`order`: reserve (step), charge (effect: a business row), pack (step), then a freeze
    point, and ship (effect)."""
    app = Workflows("shop")

    @app.workflow
    async def order(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
        me = ctx.instance_id

        async def reserve(o: dict[str, Any]) -> dict[str, Any]:
            calls("reserve", me)
            return {"held": o["id"]}

        async def charge(tx: Any, o: dict[str, Any]) -> dict[str, Any]:
            calls("charge", me)
            await insert_row(tx, f"{o['id']}|charge|{me}")
            return {"cents": o["cents"]}

        async def pack(o: dict[str, Any]) -> dict[str, Any]:
            calls("pack", me)
            await holds("pack", me)
            return {"box": o["id"], "by": me}

        async def ship(tx: Any, o: dict[str, Any]) -> dict[str, Any]:
            calls("ship", me)
            await insert_row(tx, f"{o['id']}|ship|{me}")
            return {"shipped": o["id"], "by": me}

        reserved = await ctx.step("reserve", reserve, order)
        charged = await ctx.effect("charge", charge, order)
        packed = await ctx.step("pack", pack, order)
        await holds("before-ship", me)
        shipped = await ctx.effect("ship", ship, order)
        return {"reserve": reserved, "charge": charged, "pack": packed, "ship": shipped}

    return app


ORDER = {"id": "o-1", "cents": 4200}


async def test_a_run_taken_over_replays_its_stored_steps_and_reruns_only_the_interrupted_one(
    cluster: Cluster, sql: SqlConnection
) -> None:
    calls, holds = Calls(), Holds(("pack", "a"))
    app = shop(calls, holds)
    a = await cluster.engine("a", app, background=False, clock=frozen_clock())
    b = await cluster.engine("b", app, background=False)
    await a.start("order", ORDER, id="o-1", tenant_id=cluster.tenant)
    # "a" stops in the middle of pack: reserve and charge stored, its lease left to run out.
    await holds["pack", "a"].wait_reached()
    lease = await cluster.take_over(b, "o-1")
    assert (lease.holder_instance_id, lease.lease_epoch) == ("b", 2)
    assert lease.taken_over_from == LeaseHolder("a", 1)
    await cluster.wait_state(b, "o-1", WorkflowState.SUCCEEDED)
    # Stored steps answered from the store; only the interrupted pack ran again.
    assert calls.made == [
        ("reserve", "a"),
        ("charge", "a"),
        ("pack", "a"),
        ("pack", "b"),
        ("ship", "b"),
    ]
    assert await committed_rows(sql) == ["o-1|charge|a", "o-1|ship|b"]
    status = await b.status("o-1", tenant_id=cluster.tenant)
    assert status.result == {
        "reserve": {"held": "o-1"},
        "charge": {"cents": 4200},
        "pack": {"box": "o-1", "by": "b"},
        "ship": {"shipped": "o-1", "by": "b"},
    }
    replayed = [e["step"] for e in cluster.of("step", engine="b", replayed=True)]
    replayed += [e["step"] for e in cluster.of("effect", engine="b", replayed=True)]
    assert sorted(replayed) == ["charge#1", "reserve#1"]
    for key in ("reserve#1", "charge#1", "pack#1", "ship#1"):
        assert await stored_results(sql, "o-1", key) == 1, key


async def test_a_zombies_step_write_is_refused_by_the_store_after_a_takeover(
    cluster: Cluster, sql: SqlConnection
) -> None:
    calls, holds = Calls(), Holds(("pack", "a"), ("pack", "b"))
    app = shop(calls, holds)
    a = await cluster.engine("a", app, background=False, clock=frozen_clock())
    b = await cluster.engine("b", app, background=False)
    await a.start("order", ORDER, id="o-1", tenant_id=cluster.tenant)
    await holds["pack", "a"].wait_reached()
    await cluster.take_over(b, "o-1")
    await holds["pack", "b"].wait_reached()
    # "a" thaws first, still trusting its lease by its own clock: its pack reaches the
    # store at epoch 1, and the store refuses it.
    holds["pack", "a"].open()

    async def a_handed_over() -> bool:
        return bool(cluster.of("handover", tree="o-1", engine="a"))

    await until(a_handed_over, lambda: f"a handing o-1 over; events: {cluster.events}")
    assert [e["error"] for e in cluster.of("handover", tree="o-1")] == ["ExecutionFencedError"]
    [refused] = cluster.of("refused", execution="o-1")
    assert (refused["engine"], refused["step"], refused["epoch"]) == ("a", "pack#1", 1)
    assert ("lost", "a", 1) in await cluster.lease_log(b, "o-1")
    assert await stored_results(sql, "o-1", "pack#1") == 0
    holds["pack", "b"].open()
    await cluster.wait_state(b, "o-1", WorkflowState.SUCCEEDED)
    status = await b.status("o-1", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict)
    assert status.result["pack"] == {"box": "o-1", "by": "b"}
    assert calls.of("ship") == ["b"]
    assert await committed_rows(sql) == ["o-1|charge|a", "o-1|ship|b"]


async def test_a_zombies_effect_is_refused_with_its_business_rows_and_runs_once_elsewhere(
    cluster: Cluster, sql: SqlConnection
) -> None:
    calls, holds = Calls(), Holds(("before-ship", "a"), ("before-ship", "b"))
    app = shop(calls, holds)
    a = await cluster.engine("a", app, background=False, clock=frozen_clock())
    b = await cluster.engine("b", app, background=False)
    await a.start("order", ORDER, id="o-1", tenant_id=cluster.tenant)
    await holds["before-ship", "a"].wait_reached()
    await cluster.take_over(b, "o-1")
    await holds["before-ship", "b"].wait_reached()
    holds["before-ship", "a"].open()

    async def a_handed_over() -> bool:
        return bool(cluster.of("handover", tree="o-1", engine="a"))

    await until(a_handed_over, lambda: f"a handing o-1 over; events: {cluster.events}")
    [refused] = cluster.of("refused", execution="o-1")
    assert (refused["engine"], refused["step"], refused["epoch"]) == ("a", "ship#1", 1)
    # Refused before its work ran: the zombie wrote no business row.
    assert calls.of("ship") == []
    assert await committed_rows(sql) == ["o-1|charge|a"]
    holds["before-ship", "b"].open()
    await cluster.wait_state(b, "o-1", WorkflowState.SUCCEEDED)
    assert calls.of("ship") == ["b"]
    assert calls.of("charge") == ["a"]
    assert await committed_rows(sql) == ["o-1|charge|a", "o-1|ship|b"]


def notifier(sends: Calls, holds: Holds) -> Workflows:
    app = Workflows("mail")

    @app.workflow
    async def notify(ctx: WorkflowContext, to: str) -> Any:
        me = ctx.instance_id

        async def send(attempt: int) -> dict[str, Any]:
            sends(f"attempt {attempt}", me)
            await holds("send", me)  # sent, and frozen before its end is stored
            return {"attempt": attempt, "by": me}

        return await ctx.outbound("notify", {"to": to}, send)

    return app


async def test_an_outbound_call_is_sent_at_most_once_per_attempt_across_a_takeover(
    cluster: Cluster,
) -> None:
    sends, holds = Calls(), Holds(("send", "a"))
    app = notifier(sends, holds)
    a = await cluster.engine("a", app, background=False, clock=frozen_clock())
    b = await cluster.engine("b", app, background=False)
    await a.start("notify", "ann@example.com", id="n-1", tenant_id=cluster.tenant)
    await holds["send", "a"].wait_reached()
    await cluster.take_over(b, "n-1")
    await cluster.wait_state(b, "n-1", WorkflowState.SUCCEEDED)
    # Attempt 1 was claimed (and sent) by "a": never sent again; "b" sent attempt 2.
    assert sends.made == [("attempt 1", "a"), ("attempt 2", "b")]
    status = await b.status("n-1", tenant_id=cluster.tenant)
    assert status.result == {"attempt": 2, "by": "b"}
    # The zombie's answer to attempt 1 comes late: it changes nothing and sends nothing.
    holds["send", "a"].open()

    async def a_stopped() -> bool:
        return bool(cluster.of("handover", tree="n-1", engine="a"))

    await until(a_stopped, lambda: f"a handing n-1 over; events: {cluster.events}")
    assert sends.made == [("attempt 1", "a"), ("attempt 2", "b")]
    assert (await b.status("n-1", tenant_id=cluster.tenant)).result == {"attempt": 2, "by": "b"}


async def test_a_step_replayed_with_other_arguments_after_a_code_change_is_a_conflict(
    cluster: Cluster,
) -> None:
    holds = Holds(("pack", "a"))
    version = {"price": 100}

    async def price(cents: int) -> int:
        return cents

    async def pack() -> str:
        await holds("pack", "a")
        return "packed"

    app = Workflows("shop")

    @app.workflow
    async def order(ctx: WorkflowContext) -> Any:
        # The code changed between the two runs: the step's argument is not the same.
        charged = await ctx.step("price", price, version["price"])
        if ctx.instance_id == "a":
            await ctx.step("pack", pack)
        return charged

    a = await cluster.engine("a", app, background=False, clock=frozen_clock())
    b = await cluster.engine("b", app, background=False)
    await a.start("order", id="o-1", tenant_id=cluster.tenant)
    await holds["pack", "a"].wait_reached()
    version["price"] = 150
    await cluster.take_over(b, "o-1")
    await cluster.wait_state(b, "o-1", WorkflowState.FAILED)
    status = await b.status("o-1", tenant_id=cluster.tenant)
    assert isinstance(status.error, dict)
    assert (status.error["type"], status.error["code"]) == (
        "StepConflictError",
        "workflow.step-conflict",
    )
