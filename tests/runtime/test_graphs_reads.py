"""What a graph run reads of its thread's checkpoints, on the database under test: on the
thread's first lease ever nothing of it is stored, so the run reads no checkpoint (not even
the one LangGraph's invocation asks for as it starts); a run resumed after its pause reads
the thread and goes on from where it stopped; the finished thread reads back whole."""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
from workflow_support import Cluster, open_cluster

from agboss_sql.runtime import Child, Workflows, WorkflowState
from agboss_sql.sql.connection import SqlConnection

pytest.importorskip("langgraph.graph")

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from agboss_sql.runtime.graphs import add_graph, thread_id_of, thread_state
from agboss_sql.sql.checkpoint import SqlCheckpointSaver


@pytest.fixture
async def cluster(sql: SqlConnection, sql_url: str) -> AsyncIterator[Cluster]:
    async for made in open_cluster(sql_url, sql):
        yield made


class State(TypedDict):
    order: str
    log: Annotated[list[str], operator.add]


def steps(ask: bool) -> Workflows:
    """`plan`, then (with `ask`) `ask` (an interrupt), then `done`."""
    app = Workflows("graph-reads")

    def plan(state: State) -> dict[str, Any]:
        return {"log": ["planned"]}

    def asked(state: State) -> dict[str, Any]:
        return {"log": [f"answered {interrupt({'order': state['order']})}"]}

    def done(state: State) -> dict[str, Any]:
        return {"log": ["done"]}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("done", done)
    graph.add_edge(START, "plan")
    if ask:
        graph.add_node("ask", asked)
        graph.add_edge("plan", "ask")
        graph.add_edge("ask", "done")
    else:
        graph.add_edge("plan", "done")
    graph.add_edge("done", END)
    add_graph(app, "steps", graph)
    return app


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread ids of the checkpoint reads the saver sends to the database, in order."""
    seen: list[str] = []
    read = SqlCheckpointSaver._get_tuple

    async def counted(self: SqlCheckpointSaver, connection: Any, config: Any) -> Any:
        seen.append(str((config.get("configurable") or {}).get("thread_id")))
        return await read(self, connection, config)

    monkeypatch.setattr(SqlCheckpointSaver, "_get_tuple", counted)
    return seen


async def test_a_threads_first_run_reads_no_checkpoint(cluster: Cluster, reads: list[str]) -> None:
    a = await cluster.engine("a", steps(ask=False), background=False)
    await a.start("steps", {"order": "o-1", "log": []}, id="r-1", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "r-1", WorkflowState.SUCCEEDED)
    thread = thread_id_of(cluster.tenant, "r-1")
    assert thread not in reads
    status = await a.status("r-1", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict) and status.result["log"] == ["planned", "done"]
    # What the run wrote is all there: the database's latest checkpoint is the end.
    state = await thread_state(a, "r-1", tenant_id=cluster.tenant)
    assert reads.count(thread) == 1
    assert state.values["log"] == ["planned", "done"] and state.next == ()


async def test_a_run_resumed_after_its_pause_reads_the_thread_and_goes_on(
    cluster: Cluster, reads: list[str]
) -> None:
    app = steps(ask=True)
    a = await cluster.engine("a", app, background=False)
    b = await cluster.engine("b", app, background=False)
    await a.start("steps", {"order": "o-2", "log": []}, id="r-2", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "r-2", WorkflowState.PAUSED)
    thread = thread_id_of(cluster.tenant, "r-2")
    assert thread not in reads
    await b.resume("r-2", "yes", tenant_id=cluster.tenant)
    await cluster.wait_state(b, "r-2", WorkflowState.SUCCEEDED)
    # The resumed run (a later lease) read the thread: `plan` did not run again.
    assert thread in reads
    status = await b.status("r-2", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict)
    assert status.result["log"] == ["planned", "answered yes", "done"]


async def test_graphs_run_as_children_and_calls_each_have_a_thread_of_their_own(
    cluster: Cluster,
) -> None:
    app = steps(ask=False)

    @app.workflow
    async def parent(ctx: Any, value: Any) -> Any:
        kids = await ctx.children(
            "kids",
            [
                Child("steps", {"order": "o-a", "log": []}),
                Child("steps", {"order": "o-b", "log": []}),
            ],
        )
        first = await ctx.call("inline", "steps", {"order": "o-c", "log": []})
        second = await ctx.call("inline", "steps", {"order": "o-d", "log": []})
        return {"kids": kids, "calls": [first, second]}

    a = await cluster.engine("a", app)
    await a.start("parent", None, id="p-1", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "p-1", WorkflowState.SUCCEEDED)
    status = await a.status("p-1", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict)
    # A thread shared by the tree's graphs would answer one run's state for the others.
    ran = status.result["kids"] + status.result["calls"]
    assert [state["order"] for state in ran] == ["o-a", "o-b", "o-c", "o-d"]
    assert all(state["log"] == ["planned", "done"] for state in ran)
