"""The cluster's LangGraph workload, written only against the public API
(`agboss_sql.runtime` and `agboss_sql.runtime.graphs`): what
`agboss-sql cluster --workload langgraph` runs.

    agboss-sql worker --url URL --app agboss_sql.lab.graph_app:app

Graph `agent`, one thread per run: an agent loop of `depth` rounds — `plan` decides the
round's tool calls, `Send` fans them out to `fan_out` `tool` tasks of one super-step (each
thinks `step_ms`, charges its call with `node_effect`: a business row `<run>|charge:<call>`,
and notifies with `node_outbound`), and `review` gathers them — then, for a thread whose
spec says so, an `approval` node calls `interrupt()` (the cluster answers it from two
workers at once) and records the decision with `node_effect` (`<run>|approved`), and
`finish` closes (`<run>|close`).

The workload's audit rules (beside the cluster's own), read from the database:

- `graph-state`: a succeeded thread's result is the state a run without faults gives;
- `graph-effect-once`: every tool call of a succeeded thread charged once, its approval
  and close recorded once; a cancelled thread charged nothing twice and nothing unplanned;
- `graph-epochs`: along each thread's checkpoints (in id order) the writer's lease epoch
  never goes down — no checkpoint was stored under an epoch superseded by then;
- `graph-interrupt-once`: each interrupt of a succeeded thread was answered and taken
  once (its pause), and the approval it resumed ran its effect once.
"""

from __future__ import annotations

import asyncio
import json
import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt

from agboss_sql.contracts.types import JsonValue
from agboss_sql.lab.business import insert_business_row
from agboss_sql.runtime import Workflows
from agboss_sql.runtime.graphs import (
    EPOCH_KEY,
    INTERRUPT_PREFIX,
    add_graph,
    current_lease,
    node_effect,
    node_outbound,
)

app = Workflows("langgraph-lab")


class AgentState(TypedDict, total=False):
    spec: dict[str, Any]
    round: int
    calls: list[str]
    results: Annotated[list[str], operator.add]
    approved: bool


class ToolCall(TypedDict):
    spec: dict[str, Any]
    call: str


def spec_of(value: Any) -> dict[str, Any]:
    """A thread's spec with its defaults: `rounds` of the agent loop, `fan_out` tool calls
    a round, an approval `pause`, `step_ms` of simulated work a tool call."""
    value = value if isinstance(value, dict) else {}
    return {
        "rounds": int(value.get("rounds", 2)),
        "fan_out": int(value.get("fan_out", 2)),
        "pause": bool(value.get("pause", False)),
        "step_ms": int(value.get("step_ms", 50)),
    }


def _row(what: str) -> Any:
    async def write(tx: Any) -> JsonValue:
        await insert_business_row(tx, f"{current_lease().execution_id}|{what}")
        return {"row": what}

    return write


def plan(state: AgentState) -> dict[str, Any]:
    spec = spec_of(state.get("spec"))
    number = int(state.get("round", 0))
    return {"calls": [f"r{number}-c{index}" for index in range(spec["fan_out"])]}


def fan_out(state: AgentState) -> list[Send]:
    return [Send("tool", {"spec": state.get("spec"), "call": call}) for call in state["calls"]]


async def tool(call: ToolCall) -> dict[str, Any]:
    spec = spec_of(call["spec"])
    if spec["step_ms"]:
        await asyncio.sleep(spec["step_ms"] / 1000)
    await node_effect("charge", _row(f"charge:{call['call']}"))

    async def send(attempt: int) -> JsonValue:
        return {"ok": True, "attempt": attempt}

    await node_outbound("notify", {"call": call["call"]}, send)
    return {"results": [call["call"]]}


def review(state: AgentState) -> dict[str, Any]:
    return {"round": int(state.get("round", 0)) + 1}


def after_review(state: AgentState) -> str:
    spec = spec_of(state.get("spec"))
    if int(state.get("round", 0)) < spec["rounds"]:
        return "plan"
    return "approval" if spec["pause"] else "finish"


async def approval(state: AgentState) -> dict[str, Any]:
    decision = interrupt({"question": "approve the charges?", "calls": len(state["results"])})
    approved = bool(decision.get("approved")) if isinstance(decision, dict) else bool(decision)
    await node_effect("approved", _row("approved"))
    return {"approved": approved}


async def finish(state: AgentState) -> dict[str, Any]:
    await node_effect("close", _row("close"))
    return {}


def _graph() -> Any:
    graph = StateGraph(AgentState)
    graph.add_node("plan", plan)
    graph.add_node("tool", tool)  # type: ignore[arg-type]
    graph.add_node("review", review)
    graph.add_node("approval", approval)
    graph.add_node("finish", finish)
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", fan_out, ["tool"])
    graph.add_edge("tool", "review")
    graph.add_conditional_edges("review", after_review, ["plan", "approval", "finish"])
    graph.add_edge("approval", "finish")
    graph.add_edge("finish", END)
    return graph


add_graph(app, "agent", _graph())


def expected_state(value: Any) -> dict[str, Any]:
    """The result of a thread run without faults (its final state values, as JSON)."""
    spec = spec_of(value.get("spec") if isinstance(value, dict) else None)
    rounds, width = spec["rounds"], spec["fan_out"]
    state: dict[str, Any] = {
        "spec": value.get("spec") if isinstance(value, dict) else None,
        "round": rounds,
        "calls": [f"r{rounds - 1}-c{i}" for i in range(width)] if rounds else [],
        "results": [f"r{r}-c{i}" for r in range(rounds) for i in range(width)],
    }
    if spec["pause"]:
        state["approved"] = True
    return state


# -- the cluster's workload ------------------------------------------------------------------

_urls: dict[str, str] = {}
"""The database of each cluster run, by its runs' id prefix (the audit reads checkpoints)."""


def _runs(config: Any, run_id: str) -> list[Any]:
    from agboss_sql.lab.workload import ClusterRun

    runs = []
    for index in range(config.trees):
        pause = config.pause_every > 0 and index % config.pause_every == config.pause_every - 1
        spec = {
            "rounds": config.depth,
            "fan_out": config.fan_out,
            "pause": pause,
            "step_ms": config.step_ms,
        }
        runs.append(ClusterRun("agent", {"spec": spec}, f"g{run_id}-t{index:02d}"))
    _urls[f"g{run_id}"] = config.url
    return runs


def _rows_of(spec: dict[str, Any]) -> int:
    """The business rows a thread of `spec` writes: a charge per tool call, its approval,
    its close."""
    return int(spec["rounds"]) * int(spec["fan_out"]) + (1 if spec["pause"] else 0) + 1


def _progress(connection: Any, runs: list[Any]) -> float:
    """The share of the business rows written (the close last: 1.0 only at the end)."""
    import sqlalchemy as sa

    from agboss_sql.lab.business import business_rows

    if not runs:
        return 1.0
    prefix = runs[0].id.rsplit("-", 1)[0]
    written = connection.execute(
        sa.select(sa.func.count()).where(business_rows.c.row.like(f"{prefix}-%|%"))
    ).scalar_one()
    total: int = sum(_rows_of(spec_of(run.input["spec"])) for run in runs)
    return float(written) / max(1, total)


def _json(value: Any) -> Any:
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _audit(history: Any, runs: list[Any]) -> list[Any]:
    """The workload's rules (see the module)."""
    from agboss_sql.lab.faults.audit import Violation

    found: list[Any] = []
    rows = list(history.business_rows)
    records = {str(r["execution_id"]): r for r in history.records}
    tenant = str(history.records[0]["tenant_id"]) if history.records else ""
    for run in runs:
        record = records.get(run.id)
        status = None if record is None else str(record["status"])
        spec = spec_of(run.input["spec"])
        planned = {
            f"{run.id}|charge:r{r}-c{i}"
            for r in range(spec["rounds"])
            for i in range(spec["fan_out"])
        }
        mine = [row for row in rows if row.startswith(f"{run.id}|")]
        charged = [row for row in mine if "|charge:" in row]
        if status == "succeeded":
            outcome = _json(record.get("outcome")) if record else None
            result = outcome.get("result") if isinstance(outcome, dict) else None
            if result != expected_state(run.input):
                found.append(Violation("graph-state", f"{run.id} ended with {str(result)[:300]}"))
            extra = [f"{run.id}|close"] + ([f"{run.id}|approved"] if spec["pause"] else [])
            if sorted(mine) != sorted([*planned, *extra]):
                found.append(
                    Violation(
                        "graph-effect-once",
                        f"{run.id} succeeded with rows {sorted(mine)} (planned "
                        f"{len(planned)} charges and {extra})",
                    )
                )
        elif status == "cancelled" and (
            len(set(charged)) != len(charged) or not set(charged) <= planned
        ):
            found.append(
                Violation("graph-effect-once", f"{run.id} cancelled with rows {sorted(mine)}")
            )
        pauses = [p for p in history.pauses if str(p["root_execution_id"]) == run.id]
        if status == "succeeded" and spec["pause"]:
            if len(pauses) != 1 or pauses[0]["status"] != "taken":
                found.append(
                    Violation(
                        "graph-interrupt-once",
                        f"{run.id}: interrupts {[(p['pause_id'], p['status']) for p in pauses]}",
                    )
                )
            elif INTERRUPT_PREFIX not in str(pauses[0]["pause_id"]):
                found.append(Violation("graph-interrupt-once", f"{run.id}: not an interrupt"))
    found += _epochs(runs, tenant)
    return found


def _epochs(runs: list[Any], tenant: str) -> list[Any]:
    """`graph-epochs`: per thread, the checkpoints' writer epochs never go down."""
    import sqlalchemy as sa

    from agboss_sql.lab.faults.audit import Violation
    from agboss_sql.runtime.graphs import thread_id_of
    from agboss_sql.sql.migrate import sync_url
    from agboss_sql.sql.schema import checkpoints

    if not runs:
        return []
    url = _urls.get(runs[0].id.rsplit("-", 1)[0])
    if url is None:
        return [Violation("graph-epochs", "the run's database is not known: not audited")]
    threads = {thread_id_of(tenant, run.id): run.id for run in runs}
    found = []
    engine = sa.create_engine(sync_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(
                    checkpoints.c.thread_id, checkpoints.c.checkpoint_id, checkpoints.c.metadata
                )
                .where(
                    checkpoints.c.thread_id.in_(list(threads)), checkpoints.c.checkpoint_ns == ""
                )
                .order_by(checkpoints.c.thread_id, checkpoints.c.checkpoint_id)
            ).all()
    finally:
        engine.dispose()
    last: dict[str, int] = {}
    for thread, checkpoint_id, metadata in rows:
        epoch = _json(metadata).get(EPOCH_KEY) if isinstance(_json(metadata), dict) else None
        if not isinstance(epoch, int):
            found.append(Violation("graph-epochs", f"{thread} {checkpoint_id}: no epoch"))
            continue
        if epoch < last.get(thread, 0):
            found.append(
                Violation(
                    "graph-epochs",
                    f"{threads[thread]}: checkpoint {checkpoint_id} stored at epoch {epoch} "
                    f"after one at epoch {last[thread]}",
                )
            )
        last[thread] = max(epoch, last.get(thread, 0))
    return found


def _workload() -> Any:
    from agboss_sql.lab.workload import ClusterWorkload

    return ClusterWorkload(
        name="langgraph",
        app="agboss_sql.lab.graph_app:app",
        runs=_runs,
        progress=_progress,
        audit=_audit,
        business_table=True,
    )


workload: Any = _workload()
"""The LangGraph agent as the cluster's workload."""

__all__ = ["app", "expected_state", "spec_of", "workload"]
