"""Bad use of the workflow engine gets typed errors, on the database under test (a step
replayed with other arguments is in test_workflows_takeover.py): a non-JSON step result or
input, a workflow no worker knows, a run id reused with another input (the same start
again is idempotent), an invalid step name, a pause in a child, a result past its timeout,
the status of an unknown run, and a workflow that is not an `async def`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from workflow_support import WAIT_S, Calls, Cluster, Gate, open_cluster, stored_results

from agboss_sql.runtime import (
    Engine,
    InvalidStepNameError,
    NotJsonError,
    PauseNotSupportedError,
    UnknownWorkflowError,
    UnknownWorkflowRunError,
    WorkflowContext,
    WorkflowDefinitionError,
    WorkflowIdConflictError,
    Workflows,
    WorkflowState,
    WorkflowTimeoutError,
)
from agboss_sql.sql.connection import SqlConnection


@pytest.fixture
async def cluster(sql: SqlConnection, sql_url: str) -> AsyncIterator[Cluster]:
    async for made in open_cluster(sql_url, sql):
        yield made


def misuses(calls: Calls, gate: Gate | None = None) -> Workflows:
    app = Workflows("misuses")

    @app.workflow
    async def greet(ctx: WorkflowContext, name: str) -> str:
        async def hello(n: str) -> str:
            calls("hello", n)
            if gate is not None:
                await gate()
            return f"hello {n}"

        return await ctx.step("hello", hello, name)

    @app.workflow
    async def not_json(ctx: WorkflowContext) -> Any:
        async def first() -> int:
            return 1

        async def a_set() -> set[int]:
            return {1, 2}

        await ctx.step("first", first)
        return await ctx.step("a set", a_set)

    @app.workflow
    async def bad_name(ctx: WorkflowContext) -> Any:
        async def nothing() -> None:
            calls("nothing", ctx.instance_id)

        return await ctx.step("half/way", nothing)

    @app.workflow
    async def pausing_child(ctx: WorkflowContext) -> Any:
        return await ctx.pause("in a child")

    @app.workflow
    async def parent(ctx: WorkflowContext) -> Any:
        return await ctx.child("kid", "pausing_child")

    @app.workflow
    async def waits(ctx: WorkflowContext) -> Any:
        return await ctx.pause("forever")

    return app


async def failure_of(cluster: Cluster, engine: Engine, workflow_id: str) -> dict[str, Any]:
    await cluster.wait_state(engine, workflow_id, WorkflowState.FAILED, move=True)
    error = (await engine.status(workflow_id, tenant_id=cluster.tenant)).error
    assert isinstance(error, dict)
    return error


async def test_a_step_result_that_is_not_json_fails_the_run_and_stores_nothing(
    cluster: Cluster, sql: SqlConnection
) -> None:
    a = await cluster.engine("a", misuses(Calls()))
    await a.start("not_json", id="n-1", tenant_id=cluster.tenant)
    error = await failure_of(cluster, a, "n-1")
    assert (error["type"], error["code"]) == ("NotJsonError", NotJsonError.code)
    assert await stored_results(sql, "n-1", "a set#1") == 0
    assert await stored_results(sql, "n-1", "first#1") == 1


async def test_an_input_that_is_not_json_or_a_workflow_no_worker_knows_is_refused_at_start(
    cluster: Cluster,
) -> None:
    a = await cluster.engine("a", misuses(Calls()))
    with pytest.raises(NotJsonError):
        await a.start("greet", {"at": object()}, id="g-1", tenant_id=cluster.tenant)
    with pytest.raises(UnknownWorkflowError):
        await a.start("gret", "ann", id="g-2", tenant_id=cluster.tenant)
    # Nothing was recorded for either.
    for run in ("g-1", "g-2"):
        with pytest.raises(UnknownWorkflowRunError):
            await a.status(run, tenant_id=cluster.tenant)


async def test_a_run_id_started_again_answers_the_same_run_and_another_input_is_a_conflict(
    cluster: Cluster,
) -> None:
    calls, gate = Calls(), Gate()
    a = await cluster.engine("a", misuses(calls, gate))
    b = await cluster.engine("b", misuses(calls, gate))
    await a.start("greet", "ann", id="g-1", tenant_id=cluster.tenant)
    await gate.wait_reached()
    # The same start again, from another instance while the run is in its step.
    again = await b.start("greet", "ann", id="g-1", tenant_id=cluster.tenant)
    assert again.workflow_id == "g-1"
    with pytest.raises(WorkflowIdConflictError):
        await b.start("greet", "bob", id="g-1", tenant_id=cluster.tenant)
    gate.open()
    assert await again.result(timeout_s=WAIT_S) == "hello ann"
    # And once it ended.
    last = await a.start("greet", "ann", id="g-1", tenant_id=cluster.tenant)
    assert await last.result(timeout_s=WAIT_S) == "hello ann"
    assert calls.made == [("hello", "ann")]
    status = await a.status("g-1", tenant_id=cluster.tenant)
    assert (status.input, status.result) == ("ann", "hello ann")


async def test_an_invalid_step_name_fails_the_run_before_the_step_runs(
    cluster: Cluster,
) -> None:
    calls = Calls()
    a = await cluster.engine("a", misuses(calls))
    await a.start("bad_name", id="b-1", tenant_id=cluster.tenant)
    error = await failure_of(cluster, a, "b-1")
    assert (error["type"], error["code"]) == ("InvalidStepNameError", InvalidStepNameError.code)
    assert calls.made == []


async def test_a_pause_in_a_child_fails_the_child(cluster: Cluster) -> None:
    a = await cluster.engine("a", misuses(Calls()))
    await a.start("parent", id="p-1", tenant_id=cluster.tenant)
    error = await failure_of(cluster, a, "p-1")
    assert error["type"] == "ChildWorkflowFailedError"
    assert PauseNotSupportedError.code in error["message"]


async def test_a_result_past_its_timeout_and_the_status_of_an_unknown_run_are_typed(
    cluster: Cluster,
) -> None:
    a = await cluster.engine("a", misuses(Calls()))
    handle = await a.start("waits", id="w-1", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "w-1", WorkflowState.PAUSED)
    with pytest.raises(WorkflowTimeoutError):
        await asyncio.wait_for(handle.result(timeout_s=0.1), WAIT_S)
    assert await cluster.state(a, "w-1") is WorkflowState.PAUSED
    with pytest.raises(UnknownWorkflowRunError):
        await a.status("w-2", tenant_id=cluster.tenant)


def test_a_workflow_that_is_not_an_async_def_is_refused_at_registration() -> None:
    app = Workflows("app")

    def plain(ctx: WorkflowContext) -> None:
        return None

    with pytest.raises(WorkflowDefinitionError):
        app.register(plain)  # type: ignore[arg-type]  # the bad use under test
    assert "plain" not in app
