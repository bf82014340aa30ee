"""LangGraph graphs on the workflow runtime (`agboss_sql.runtime.graphs`), on the database
under test: a thread runs under its lease on any instance; a frozen holder's late pending
write and checkpoint are refused by the database after another instance took the thread
over, and the node's effect is not repeated; an interrupt answered from two instances at
once resumes the thread once; a cancel from another instance stops the thread at its next
checkpoint write; sync nodes, a subgraph and a `Send` fan-out run their effects once each.

Instances are `Engine`s on one virtual clock (`workflow_support`): "a" is frozen on a clock
that never moves when a test takes its thread over. A worker killed by a signal mid-node is
tested with real processes in tests/examples/test_langgraph_agent.py."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
from workflow_support import (
    Cluster,
    Gate,
    committed_rows,
    frozen_clock,
    insert_row,
    open_cluster,
    until,
)

from agboss_sql.contracts.errors import NotPausedError
from agboss_sql.runtime import Engine, WorkflowDefinitionError, Workflows, WorkflowState
from agboss_sql.sql.connection import SqlConnection

pytest.importorskip("langgraph.graph")

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt

from agboss_sql.runtime.graphs import (
    EPOCH_KEY,
    FencedGraphSaver,
    add_graph,
    current_lease,
    node_effect,
    node_effect_sync,
    node_outbound,
    thread_id_of,
    thread_state,
)
from agboss_sql.sql.checkpoint import SqlCheckpointSaver


@pytest.fixture
async def cluster(sql: SqlConnection, sql_url: str) -> AsyncIterator[Cluster]:
    async for made in open_cluster(sql_url, sql):
        yield made


class State(TypedDict):
    order: str
    log: Annotated[list[str], operator.add]


class Gates:
    """Gates by `(node, instance)`: a node waits at the gate a test put there, if any."""

    def __init__(self, *where: tuple[str, str]) -> None:
        self.gates = {at: Gate() for at in where}

    def __getitem__(self, at: tuple[str, str]) -> Gate:
        return self.gates[at]

    async def __call__(self, node: str) -> None:
        gate = self.gates.get((node, current_lease().holder_instance_id))
        if gate is not None:
            await gate()


async def row_of(tx: Any, row: str) -> str:
    """An effect's business write: one row, on the fence's transaction."""
    await insert_row(tx, row)
    return row


async def signed_row(tx: Any, row: str) -> str:
    """An effect's business write naming the instance that made it (read inside the
    effect: an argument that differs between instances is a step conflict)."""
    return await row_of(tx, f"{row}|{current_lease().holder_instance_id}")


def shop(gates: Gates, ran: list[tuple[str, str]]) -> Workflows:
    """`order`: `charge` (an effect writing a business row, then a gate), `ship` (an effect),
    `notify`; each node notes which instance ran it."""
    app = Workflows("graphs")

    async def charge(state: State) -> dict[str, Any]:
        me = current_lease().holder_instance_id
        ran.append(("charge", me))
        await node_effect("charge", signed_row, f"{state['order']}|charge")
        await gates("charge")
        return {"log": [f"charged by {me}"]}

    async def ship(state: State) -> dict[str, Any]:
        me = current_lease().holder_instance_id
        ran.append(("ship", me))
        await node_effect("ship", signed_row, f"{state['order']}|ship")
        return {"log": [f"shipped by {me}"]}

    def notify(state: State) -> dict[str, Any]:
        ran.append(("notify", current_lease().holder_instance_id))
        return {"log": ["notified"]}

    graph = StateGraph(State)
    graph.add_node("charge", charge)
    graph.add_node("ship", ship)
    graph.add_node("notify", notify)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", "ship")
    graph.add_edge("ship", "notify")
    graph.add_edge("notify", END)
    add_graph(app, "order", graph)
    return app


async def epochs_of(engine: Engine, tenant: str, run: str) -> list[int]:
    """The lease epoch each stored checkpoint of the thread was written under, oldest first."""
    saver = SqlCheckpointSaver(engine.executor.effects.connection)  # type: ignore[attr-defined]
    config: Any = {"configurable": {"thread_id": thread_id_of(tenant, run)}}
    found = [t async for t in saver.alist(config)]
    return [int(t.metadata[EPOCH_KEY]) for t in reversed(found)]


async def test_a_frozen_holders_late_checkpoint_is_refused_and_its_effect_not_repeated(
    cluster: Cluster, sql: SqlConnection
) -> None:
    ran: list[tuple[str, str]] = []
    gates = Gates(("charge", "a"))
    app = shop(gates, ran)
    a = await cluster.engine("a", app, background=False, clock=frozen_clock())
    b = await cluster.engine("b", app, background=False)
    await a.start("order", {"order": "o-1", "log": []}, id="t-1", tenant_id=cluster.tenant)
    # "a" froze inside `charge`, after its effect committed and before its writes.
    await gates["charge", "a"].wait_reached()
    lease = await cluster.take_over(b, "t-1")
    assert (lease.holder_instance_id, lease.lease_epoch) == ("b", 2)
    await cluster.wait_state(b, "t-1", WorkflowState.SUCCEEDED)
    status = await b.status("t-1", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict)
    assert status.result["log"] == ["charged by b", "shipped by b", "notified"]
    # The super-step ran again on "b" (same LangGraph task): the effect answered what "a"
    # stored, and wrote nothing.
    assert ran == [("charge", "a"), ("charge", "b"), ("ship", "b"), ("notify", "b")]
    assert await committed_rows(sql) == ["o-1|charge|a", "o-1|ship|b"]
    stored = await epochs_of(b, cluster.tenant, "t-1")
    assert stored[-1] == 2 and stored == sorted(stored)
    # "a" thaws, still trusting its lease by its own clock: its task's writes reach the
    # store at epoch 1 and are refused; it hands the thread over and stores nothing.
    gates["charge", "a"].open()

    async def a_handed_over() -> bool:
        return bool(cluster.of("handover", tree="t-1", engine="a"))

    await until(a_handed_over, lambda: f"a handing t-1 over; events: {cluster.events}")
    assert [e["error"] for e in cluster.of("handover", tree="t-1")] == ["ExecutionFencedError"]
    [refused] = cluster.of("refused", execution="t-1")
    assert (refused["engine"], refused["step"], refused["epoch"]) == ("a", "checkpoint", 1)
    assert ("lost", "a", 1) in await cluster.lease_log(b, "t-1")
    assert await epochs_of(b, cluster.tenant, "t-1") == stored
    assert await committed_rows(sql) == ["o-1|charge|a", "o-1|ship|b"]
    assert (await b.status("t-1", tenant_id=cluster.tenant)).result == status.result


async def test_a_thread_taken_over_between_a_steps_writes_and_its_checkpoint_goes_on(
    cluster: Cluster, sql: SqlConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder stored `charge`'s writes, then froze before the checkpoint that applies
    them: LangGraph's `next` is empty there (the task has its writes), yet the thread is
    not done; the new holder goes on from those writes without running `charge` again."""
    ran: list[tuple[str, str]] = []
    app = shop(Gates(), ran)
    frozen = Gate()
    put = FencedGraphSaver.aput

    async def aput(self: Any, config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
        if metadata.get("step") == 1 and current_lease().holder_instance_id == "a":
            await frozen()
        return await put(self, config, checkpoint, metadata, versions)

    monkeypatch.setattr(FencedGraphSaver, "aput", aput)
    a = await cluster.engine("a", app, background=False, clock=frozen_clock())
    b = await cluster.engine("b", app, background=False)
    await a.start("order", {"order": "o-5", "log": []}, id="t-5", tenant_id=cluster.tenant)
    await frozen.wait_reached()
    await cluster.take_over(b, "t-5")
    await cluster.wait_state(b, "t-5", WorkflowState.SUCCEEDED)
    status = await b.status("t-5", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict)
    assert status.result["log"] == ["charged by a", "shipped by b", "notified"]
    assert ran == [("charge", "a"), ("ship", "b"), ("notify", "b")]
    assert await committed_rows(sql) == ["o-5|charge|a", "o-5|ship|b"]
    frozen.open()

    async def a_handed_over() -> bool:
        return bool(cluster.of("handover", tree="t-5", engine="a"))

    await until(a_handed_over, lambda: f"a handing t-5 over; events: {cluster.events}")


def approvals(ran: list[tuple[str, Any]]) -> Workflows:
    """`refund`: `ask` interrupts for an approval; `pay` writes the decision as a row."""
    app = Workflows("approvals")

    def ask(state: State) -> dict[str, Any]:
        decision = interrupt({"approve": state["order"]})
        ran.append(("ask", decision))
        return {"log": [f"decided {decision}"]}

    async def pay(state: State) -> dict[str, Any]:
        ran.append(("pay", state["log"][-1]))
        await node_effect("pay", row_of, f"{state['order']}|{state['log'][-1]}")
        return {"log": ["paid"]}

    graph = StateGraph(State)
    graph.add_node("ask", ask)
    graph.add_node("pay", pay)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "pay")
    graph.add_edge("pay", END)
    add_graph(app, "refund", graph.compile())
    return app


async def test_an_interrupt_answered_on_two_instances_at_once_resumes_the_thread_once(
    cluster: Cluster, sql: SqlConnection
) -> None:
    ran: list[tuple[str, Any]] = []
    app = approvals(ran)
    a = await cluster.engine("a", app, background=False)
    b = await cluster.engine("b", app, background=False)
    await a.start("refund", {"order": "r-1", "log": []}, id="t-2", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "t-2", WorkflowState.PAUSED)
    [pause] = (await b.status("t-2", tenant_id=cluster.tenant)).pauses
    assert (pause.status, pause.request) == ("pending", {"approve": "r-1"})
    answers = await asyncio.gather(
        a.resume("t-2", "yes-a", tenant_id=cluster.tenant),
        b.resume("t-2", "yes-b", tenant_id=cluster.tenant),
        return_exceptions=True,
    )
    refused = [answer for answer in answers if isinstance(answer, NotPausedError)]
    assert len(refused) == 1 and answers.count(None) == 1, answers
    winner = "yes-a" if answers[0] is None else "yes-b"
    await cluster.wait_state(a, "t-2", WorkflowState.SUCCEEDED)
    status = await a.status("t-2", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict)
    assert status.result["log"] == [f"decided {winner}", "paid"]
    assert [p.status for p in status.pauses] == ["taken"]
    assert await committed_rows(sql) == [f"r-1|decided {winner}"]
    # The node after the interrupt ran once with the winner's answer (the interrupting
    # node itself runs again on resume, as LangGraph does, answered the same decision).
    assert [what for what in ran if what[0] == "pay"] == [("pay", f"decided {winner}")]
    assert {what for what in ran if what[0] == "ask"} == {("ask", winner)}


async def test_a_cancel_from_another_instance_stops_the_thread_at_its_next_checkpoint(
    cluster: Cluster, sql: SqlConnection
) -> None:
    ran: list[tuple[str, str]] = []
    gates = Gates(("charge", "a"))
    app = shop(gates, ran)
    a = await cluster.engine("a", app, background=False)
    b = await cluster.engine("b", app, background=False, work=False)
    await a.start("order", {"order": "o-3", "log": []}, id="t-3", tenant_id=cluster.tenant)
    await gates["charge", "a"].wait_reached()
    assert await b.cancel("t-3", tenant_id=cluster.tenant)

    async def a_saw_the_cancel() -> bool:
        return any(keeper.signal.aborted for keeper in a._keepers)

    # The holder's next renewal (a third of a lease on the cluster's clock) reads the cancel.
    await until(a_saw_the_cancel, "a's renewal seeing the cancel", clock=cluster.clock)
    gates["charge", "a"].open()
    await cluster.wait_state(a, "t-3", WorkflowState.CANCELLED)
    # `charge` finished, but its writes were stopped before the store: `ship` never ran.
    assert ran == [("charge", "a")]
    assert await committed_rows(sql) == ["o-3|charge|a"]
    stored = await thread_state(a, "t-3", tenant_id=cluster.tenant)
    assert stored.next == ("charge",)


def fan_out(ran: list[str]) -> Workflows:
    """`batch`: a sync node fans out with `Send` to a sync worker per item (each with an
    effect), then a subgraph node whose inner node has an effect."""
    app = Workflows("fan-out")

    def plan(state: State) -> dict[str, Any]:
        return {"log": ["planned"]}

    def route(state: State) -> list[Send]:
        return [Send("item", {"order": f"{state['order']}-{i}", "log": []}) for i in range(3)]

    def item(state: State) -> dict[str, Any]:
        ran.append(state["order"])
        node_effect_sync("item", row_of, f"{state['order']}|item")
        return {"log": [f"did {state['order']}"]}

    async def inner(state: State) -> dict[str, Any]:
        ran.append("inner")
        await node_effect("inner", row_of, f"{state['order']}|inner")
        return {"log": ["inner"]}

    sub = StateGraph(State)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("item", item)
    graph.add_node("sub", sub.compile())
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", route, ["item"])
    graph.add_edge("item", "sub")
    graph.add_edge("sub", END)
    add_graph(app, "batch", graph)
    return app


async def test_sync_nodes_a_send_fan_out_and_a_subgraph_run_each_effect_once(
    cluster: Cluster, sql: SqlConnection
) -> None:
    ran: list[str] = []
    app = fan_out(ran)
    a = await cluster.engine("a", app, background=False)
    await a.start("batch", {"order": "b-1", "log": []}, id="t-4", tenant_id=cluster.tenant)
    await cluster.wait_state(a, "t-4", WorkflowState.SUCCEEDED)
    status = await a.status("t-4", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict)
    log = status.result["log"]
    assert log[0] == "planned" and sorted(log[1:4]) == ["did b-1-0", "did b-1-1", "did b-1-2"]
    # The subgraph's node ran once (its state comes back whole into the parent's list).
    assert log[-1] == "inner" and log.count("inner") == 1
    assert sorted(ran) == ["b-1-0", "b-1-1", "b-1-2", "inner"]
    assert sorted(await committed_rows(sql)) == [
        "b-1-0|item",
        "b-1-1|item",
        "b-1-2|item",
        "b-1|inner",
    ]


def notifier(sent: list[tuple[int, str]], gates: Gates) -> Workflows:
    """`mail`: `send` calls another system with `node_outbound`, then waits at its gate."""
    app = Workflows("mail")

    async def send(state: State) -> dict[str, Any]:
        async def deliver(attempt: int) -> Any:
            sent.append((attempt, current_lease().holder_instance_id))
            return {"attempt": attempt}

        answer = await node_outbound("notify", {"to": state["order"]}, deliver)
        await gates("send")
        return {"log": [f"sent attempt {answer['attempt']}"]}

    graph = StateGraph(State)
    graph.add_node("send", send)
    graph.add_edge(START, "send")
    graph.add_edge("send", END)
    add_graph(app, "mail", graph)
    return app


async def test_a_nodes_outbound_call_is_not_sent_again_when_its_step_runs_again(
    cluster: Cluster,
) -> None:
    sent: list[tuple[int, str]] = []
    gates = Gates(("send", "a"))
    app = notifier(sent, gates)
    a = await cluster.engine("a", app, background=False, clock=frozen_clock())
    b = await cluster.engine("b", app, background=False)
    await a.start("mail", {"order": "m-1", "log": []}, id="t-6", tenant_id=cluster.tenant)
    await gates["send", "a"].wait_reached()
    await cluster.take_over(b, "t-6")
    await cluster.wait_state(b, "t-6", WorkflowState.SUCCEEDED)
    # The step ran again on "b": the call "a" completed answers its response, unsent.
    assert sent == [(1, "a")]
    status = await b.status("t-6", tenant_id=cluster.tenant)
    assert isinstance(status.result, dict)
    assert status.result["log"] == ["sent attempt 1"]
    gates["send", "a"].open()


def test_a_graph_with_static_breakpoints_is_refused() -> None:
    graph = StateGraph(State)
    graph.add_node("ask", lambda state: {})
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    with pytest.raises(WorkflowDefinitionError):
        add_graph(Workflows("x"), "ask", graph.compile(interrupt_before=["ask"]))


async def test_node_effects_outside_a_graph_run_are_refused() -> None:
    async def nothing(tx: Any) -> None:
        return None

    with pytest.raises(RuntimeError, match="add_graph"):
        await node_effect("charge", nothing)
    with pytest.raises(RuntimeError, match="add_graph"):
        current_lease()
