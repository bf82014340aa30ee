"""LangGraph graphs run durably on the workflow runtime, across instances.

    from agboss_sql.runtime import Engine, Workflows
    from agboss_sql.runtime.graphs import add_graph, node_effect

    app = Workflows("agents")
    add_graph(app, "agent", builder)          # a StateGraph, or a compiled graph

    async def charge(state: dict) -> dict:
        paid = await node_effect("charge", pay, state["order"])   # once, whatever crashes
        return {"paid": paid}

    async with Engine(app, url=URL) as engine:           # on every worker
        await engine.start("agent", {"order": ...}, id="thread-1")   # the thread id
        await engine.resume("thread-1", {"approved": True})          # answers interrupt()
        print(await engine.result("thread-1", timeout_s=60))

A registered graph is a workflow of the app, named as given, whose run id is the graph's
`thread_id` (`thread_id_of`: `tenant/id` outside the default tenant). A run holds the thread's lease; the graph is invoked with the fenced checkpoint
saver of the instance's database (`SqlCheckpointSaver(fenced=True)`) and the run's lease
in `configurable["agboss_lease"]`, with `durability="sync"` (a super-step's checkpoint is
stored before the next super-step starts), so:

- a checkpoint or pending write of a holder whose lease went to another instance is refused
  by the database (`ExecutionFencedError`): a frozen worker that wakes writes nothing;
- a run whose worker died is taken over by another worker's recovery sweep, which resumes
  the thread from its last checkpoint: only the interrupted super-step runs again, and the
  tasks of that super-step that had stored their writes are not run again (LangGraph's
  pending writes);
- `interrupt(value)` in a node ends the invocation; the run turns each pending interrupt
  into a pause of the workflow (`ctx.pause`, two-phase: answered once, from any instance,
  by `Engine.resume(thread_id, value)`) and goes on with `Command(resume=...)`;
- `Engine.cancel(thread_id)` stops the thread at its next checkpoint or pending write after
  the renewal that saw it (every third of a lease);
- a node's side effects on the database run exactly once with `node_effect` (keyed by
  LangGraph's task id, stable across replays of a super-step, and committed with the
  fence), and calls to other systems at most once per attempt with `node_outbound`.

`thread_state(engine, thread_id)` reads a thread's `StateSnapshot` from any instance. This
module needs the `langgraph` package (`pip install langgraph`); importing it without one
is an `ImportError` naming it, and nothing else of the runtime imports it.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

try:
    from langgraph.config import get_config
    from langgraph.types import Command
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "agboss_sql.runtime.graphs runs LangGraph graphs: install langgraph "
        "(`pip install 'agboss-sql[langgraph]' langgraph`)"
    ) from missing

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.types import ExecutionLease, JsonValue
from agboss_sql.runtime.context import WorkflowContext
from agboss_sql.runtime.engine import DEFAULT_TENANT, Engine
from agboss_sql.runtime.errors import WorkflowDefinitionError
from agboss_sql.runtime.workflows import Workflows, checked_json, checked_name
from agboss_sql.sql.checkpoint import LEASE_KEY, SqlCheckpointSaver

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.types import StateSnapshot

    from agboss_sql.contracts.stores import FencedEffectRepository

T = TypeVar("T")

EPOCH_KEY = "agboss_epoch"
"""The checkpoint metadata key holding the lease epoch the checkpoint was written under."""
INSTANCE_KEY = "agboss_instance"
"""The checkpoint metadata key naming the instance that wrote the checkpoint."""
GUARD_KEY = "agboss_guard"
"""The `configurable` key of the run's check, called before every checkpoint write."""
UNREAD_KEY = "agboss_unread"
"""The `configurable` key marking a thread's first lease ever (`_Unread`)."""
INTERRUPTS_KEY = "__interrupt__"
"""Where an interrupted invocation's output lists its pending interrupts."""
INTERRUPT_PREFIX = "interrupt-"
"""A pause for LangGraph interrupt `id` is named `INTERRUPT_PREFIX + id`."""

Output = Callable[[dict[str, Any]], Any]
"""Makes the run's result (JSON) of the graph's output (what `ainvoke` answers at the end)."""


@dataclass(frozen=True, slots=True)
class GraphDefinition:
    """A graph registered on an app: its name, the compiled graph, how its output is made."""

    name: str
    graph: Any
    output: Output


_graphs: weakref.WeakKeyDictionary[Workflows, dict[str, GraphDefinition]] = (
    weakref.WeakKeyDictionary()
)
_savers: weakref.WeakKeyDictionary[Any, tuple[SqlCheckpointSaver, dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True, slots=True)
class _GraphRun:
    """The run a graph's nodes execute for (found by `node_effect` through a contextvar)."""

    ctx: WorkflowContext
    loop: asyncio.AbstractEventLoop


_current: contextvars.ContextVar[_GraphRun | None] = contextvars.ContextVar(
    "agboss_graph_run", default=None
)


class _Unread:
    """A thread on its first lease ever: nothing of it is stored (its checkpoints are
    written under its leases only), so the first read of its latest checkpoint — LangGraph's,
    as the invocation starts — answers none without asking the database. Once only: any
    later read, or any read after a write, asks."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = True


def _unread(configurable: Any) -> bool:
    """Whether this read is a first-lease thread's first (see `_Unread`), using it up."""
    marker = configurable.get(UNREAD_KEY)
    if not isinstance(marker, _Unread) or not marker.pending:
        return False
    marker.pending = False
    return not configurable.get("checkpoint_ns") and not configurable.get("checkpoint_id")


def _written(configurable: Any) -> None:
    marker = configurable.get(UNREAD_KEY)
    if isinstance(marker, _Unread):
        marker.pending = False


class FencedGraphSaver(SqlCheckpointSaver):
    """The fenced saver a graph run writes through: before each checkpoint and pending
    write it calls the run's check (`configurable["agboss_guard"]`: a cancelled run or a
    lost lease stops there), and it records the writer's lease epoch and instance in each
    checkpoint's metadata (`agboss_epoch`, `agboss_instance`), which audits read. On a
    thread's first lease ever the invocation's first read of its latest checkpoint asks
    nothing of the database (nothing of the thread is stored yet)."""

    async def aget_tuple(self, config: RunnableConfig) -> Any:
        if _unread(config.get("configurable") or {}):
            return None
        return await super().aget_tuple(config)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Any,
        metadata: Any,
        new_versions: Any,
    ) -> RunnableConfig:
        configurable = config.get("configurable") or {}
        guard = configurable.get(GUARD_KEY)
        if guard is not None:
            guard()
        _written(configurable)
        lease = configurable.get(LEASE_KEY)
        epoch = getattr(lease, "lease_epoch", None)
        if epoch is not None:
            metadata = {
                **metadata,
                EPOCH_KEY: epoch,
                INSTANCE_KEY: getattr(lease, "holder_instance_id", None),
            }
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Any,
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config.get("configurable") or {}
        guard = configurable.get(GUARD_KEY)
        if guard is not None:
            guard()
        _written(configurable)
        await super().aput_writes(config, writes, task_id, task_path)


def _saver_of(effects: FencedEffectRepository[Any]) -> tuple[SqlCheckpointSaver, dict[str, Any]]:
    """The fenced saver of this instance (on its stores' connection and store clock), and
    the graphs compiled with it, by name."""
    found = _savers.get(effects)
    if found is None:
        connection = getattr(effects, "connection", None)
        if connection is None:
            raise TypeError(
                "LangGraph graphs run on the SQL stores (an Engine with url= or an Application "
                "of sql_stores()): this instance's stores have no SQL connection"
            )
        saver = FencedGraphSaver(
            connection,
            fenced=True,
            store_clock=getattr(effects, "store_clock", None),
            application=getattr(effects, "application", None),
        )
        found = (saver, {})
        _savers[effects] = found
    return found


def _compiled(graph: Any) -> Any:
    if hasattr(graph, "compile") and not hasattr(graph, "ainvoke"):
        graph = graph.compile()
    if not hasattr(graph, "ainvoke") or not hasattr(graph, "copy"):
        raise TypeError(
            f"add_graph takes a LangGraph StateGraph or compiled graph, got {type(graph).__name__}"
        )
    if getattr(graph, "interrupt_before_nodes", None) or getattr(
        graph, "interrupt_after_nodes", None
    ):
        raise WorkflowDefinitionError(
            "a graph run by the runtime pauses on interrupt(): compile it without "
            "interrupt_before / interrupt_after"
        )
    return graph


def jsonable(value: Any) -> JsonValue:
    """`value` as JSON: pydantic models (LangChain messages) by `model_dump`, dataclasses
    by their fields, other unknown values by their text."""

    def default(item: Any) -> Any:
        dump = getattr(item, "model_dump", None)
        if callable(dump):
            return dump(mode="json")
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            return dataclasses.asdict(item)
        if isinstance(item, set | frozenset | tuple):
            return list(item)
        return str(item)

    loaded: JsonValue = json.loads(json.dumps(value, default=default, allow_nan=False))
    return loaded


def add_graph(
    app: Workflows,
    name: str,
    graph: Any,
    *,
    output: Output | None = None,
) -> GraphDefinition:
    """Register `graph` (a LangGraph `StateGraph`, compiled here, or a compiled graph; its
    own checkpointer is replaced by the fenced saver) as workflow `name` of `app`: start a
    thread with `engine.start(name, input, id=thread_id)`, answer its `interrupt()` with
    `engine.resume(thread_id, value)`, cancel it with `engine.cancel(thread_id)`, and read
    its result (`output(the graph's output)`, by default that output as JSON) with
    `engine.result(thread_id)` — each from any instance. See the module for what a run
    promises."""
    compiled = _compiled(graph)
    checked_name("a graph name", name)
    definition = GraphDefinition(name, compiled, output if output is not None else jsonable)

    async def run_graph(ctx: WorkflowContext, value: Any) -> Any:
        return await _run(definition, ctx, value)

    run_graph.__name__ = name
    app.register(run_graph, name=name)
    _graphs.setdefault(app, {})[name] = definition
    return definition


def graph_of(app: Workflows, name: str) -> GraphDefinition | None:
    """The graph registered as `name` on `app`, or `None`."""
    return _graphs.get(app, {}).get(name)


async def _run(definition: GraphDefinition, ctx: WorkflowContext, value: Any) -> Any:
    """One run of a thread under its lease (see the module)."""
    if ctx.replaying:
        return None  # a cancelled run's undo replay: a graph's nodes have no undo
    saver, compiled = _saver_of(ctx.effect_store)
    graph = compiled.get(definition.name)
    if graph is None:
        graph = definition.graph.copy(update={"checkpointer": saver})
        compiled[definition.name] = graph
    config: dict[str, Any] = {
        "configurable": {
            "thread_id": thread_id_of(ctx.tenant_id, _thread_run_of(ctx)),
            LEASE_KEY: ctx.lease,
            GUARD_KEY: ctx.check,
        }
    }
    token = _current.set(_GraphRun(ctx, asyncio.get_running_loop()))
    try:
        command: Any = value
        interrupts: list[Any] | None = None
        if ctx.first_lease and not ctx.is_child:
            # Nothing of the thread is stored: the invocation's first read asks nothing.
            config["configurable"][UNREAD_KEY] = _Unread()
        else:
            # Taken over, or resumed after a pause. With tasks left — even ones whose writes are
            # stored, which LangGraph's `next` leaves out — the super-step the last holder
            # was in runs on from its checkpoint; a finished thread answers its output.
            state = await graph.aget_state(config)
            if state.created_at is not None:
                command, interrupts = None, _interrupts(state) or None
        while True:
            if interrupts is None:
                output = await _invoke(ctx, graph, command, config)
                if isinstance(output, dict):
                    interrupts = list(output.get(INTERRUPTS_KEY) or ())
                    if not interrupts:
                        return definition.output(output)
                else:  # not a state graph's output: the state tells
                    state = await graph.aget_state(config)
                    interrupts = _interrupts(state)
                    if not interrupts:
                        return definition.output(dict(state.values))
            answers: dict[str, Any] = {}
            for interrupt in sorted(interrupts, key=lambda i: str(i.id)):
                answers[str(interrupt.id)] = await ctx.pause(
                    INTERRUPT_PREFIX + str(interrupt.id), _request_of(interrupt.value)
                )
            command, interrupts = Command(resume=answers), None
    finally:
        _current.reset(token)


async def _invoke(ctx: WorkflowContext, graph: Any, command: Any, config: dict[str, Any]) -> Any:
    """One invocation of the graph, answering its output; a checkpoint write the store
    refused is logged as the lease lost (with why), as a refused step is."""
    try:
        return await graph.ainvoke(command, config, durability="sync")
    except ExecutionFencedError as refused:
        await ctx.refused("checkpoint", refused.reason)
        raise
    except Exception:
        ctx.check()  # a cancel or a lost lease, rather than what it broke
        raise


def _interrupts(state: StateSnapshot) -> list[Any]:
    return list(getattr(state, "interrupts", ()) or ())


def _request_of(value: Any) -> JsonValue:
    try:
        return checked_json("an interrupt's value", value)
    except Exception:
        return jsonable(value)


def _thread_run_of(ctx: WorkflowContext) -> str:
    """The run id a graph's thread is named by: the execution running it (a root's id, or a
    child's), and under a `call` the call's keys too, so two graphs of one tree never share
    a thread."""
    path = ctx.call_path
    return ctx.execution_id if not path else f"{ctx.execution_id}/{path}"


def thread_id_of(tenant_id: str, run_id: str) -> str:
    """The LangGraph `thread_id` of run `run_id`: the run id itself in the default tenant,
    else `tenant/run id` (threads of two tenants never share checkpoints)."""
    return run_id if tenant_id == DEFAULT_TENANT else f"{tenant_id}/{run_id}"


async def thread_state(
    engine: Engine,
    run_id: str,
    *,
    graph: str | None = None,
    tenant_id: str = DEFAULT_TENANT,
) -> Any:
    """The thread's LangGraph `StateSnapshot` as the database holds it, read from any
    instance (`graph`: the registered name; by default the workflow the run was started
    with). `UnknownWorkflowRunError` for no such run."""
    name = (
        graph if graph is not None else (await engine.status(run_id, tenant_id=tenant_id)).workflow
    )
    definition = graph_of(engine.workflows, name)
    if definition is None:
        raise KeyError(f"no graph {name!r} registered on app {engine.workflows.name!r}")
    saver, _compiled_graphs = _saver_of(engine.executor.effects)
    reader = definition.graph.copy(update={"checkpointer": saver})
    config = {"configurable": {"thread_id": thread_id_of(tenant_id, run_id)}}
    return await reader.aget_state(config)


# -- in node code ----------------------------------------------------------------------------


def _here(what: str) -> tuple[_GraphRun, str]:
    current = _current.get()
    if current is None:
        raise RuntimeError(
            f"{what} is called from a node of a graph run by the workflow runtime "
            "(add_graph): none runs here"
        )
    config = get_config()
    configurable = config.get("configurable") or {}
    task_id = configurable.get("__pregel_task_id")
    if not isinstance(task_id, str) or not task_id:
        raise RuntimeError(f"{what}: LangGraph gave this node no task id")
    return current, task_id


def current_lease() -> ExecutionLease:
    """The lease of the run this graph node executes for: which instance runs it now
    (`holder_instance_id`) and at which epoch. `RuntimeError` outside a graph run."""
    current = _current.get()
    if current is None:
        raise RuntimeError("current_lease() is called from a node of a graph run by add_graph")
    return current.ctx.lease


async def node_effect(
    name: str,
    function: Callable[..., Awaitable[T]],
    /,
    *args: Any,
    business_key: str | None = None,
    **kwargs: Any,
) -> T:
    """Run `function(tx, *args, **kwargs)` inside the fence's transaction, from a node of a
    graph run by the runtime: the lease check, the rows `function` writes on `tx` and its
    result (JSON) commit together or not at all, once per (LangGraph task, `name`). The task
    id is the same whenever the super-step runs again (on this instance or after a takeover),
    so a node that crashed after its effect and before its checkpoint gets the stored result
    and `function` is not called again; a zombie's effect is refused with its rows. With
    `business_key` the effect is once per key across every thread of the tenant. Give each
    effect of one node its own name (a second call with the same name answers the first)."""
    current, task_id = _here("node_effect")
    return await _effect(current, task_id, name, function, args, kwargs, business_key)


async def _effect(
    current: _GraphRun,
    task_id: str,
    name: str,
    function: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    business_key: str | None,
) -> T:
    result = current.ctx.keyed_effect(
        f"{task_id}/{name}", name, function, *args, business_key=business_key, **kwargs
    )
    return await _on_loop(current, result)  # type: ignore[no-any-return]


async def node_outbound(
    name: str, intent: JsonValue, send: Callable[[int], Awaitable[JsonValue]]
) -> JsonValue:
    """Call another system at most once per attempt from a node (as `ctx.outbound`), keyed
    by (LangGraph task, `name`): a super-step run again after a crash never sends an attempt
    an earlier holder claimed; `send(attempt)` gets the attempt number to pass on as the
    other system's idempotency key."""
    current, task_id = _here("node_outbound")
    result = current.ctx.keyed_outbound(f"{task_id}/{name}", name, intent, send)
    return await _on_loop(current, result)


def node_effect_sync(
    name: str,
    function: Callable[..., Awaitable[T]],
    /,
    *args: Any,
    business_key: str | None = None,
    **kwargs: Any,
) -> T:
    """`node_effect` from a synchronous node (which LangGraph runs on a worker thread):
    runs on the run's event loop and waits for it."""
    current, task_id = _here("node_effect_sync")
    done = asyncio.run_coroutine_threadsafe(
        _effect(current, task_id, name, function, args, kwargs, business_key), current.loop
    )
    return done.result()


async def _on_loop(current: _GraphRun, work: Awaitable[Any]) -> Any:
    """`work` on the run's event loop (a graph may run a node on another)."""
    if asyncio.get_running_loop() is current.loop:
        return await work
    future = asyncio.run_coroutine_threadsafe(_awaited(work), current.loop)
    return await asyncio.wrap_future(future)


async def _awaited(work: Awaitable[Any]) -> Any:
    return await work


__all__ = [
    "EPOCH_KEY",
    "INSTANCE_KEY",
    "INTERRUPT_PREFIX",
    "FencedGraphSaver",
    "GraphDefinition",
    "Output",
    "add_graph",
    "current_lease",
    "graph_of",
    "jsonable",
    "node_effect",
    "node_effect_sync",
    "node_outbound",
    "thread_id_of",
    "thread_state",
]
