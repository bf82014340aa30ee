"""`WorkflowContext`: what a workflow's code calls to do durable work.

Every call is keyed by its name and how many calls of that name came before it in the run
(`reserve#1`, `reserve#2`, ...), so a run resumed on any instance finds what the first run
stored: a finished step answers its stored result (its function is not called again), an
effect's business rows are not written twice, an outbound call is not sent again, a child
is not queued again, an answered pause answers its decision.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agboss_sql.contracts.types import ExecutionLease, JsonValue, LeaseEventKind
from agboss_sql.runtime._log import log_lease_event
from agboss_sql.runtime._run import bounded
from agboss_sql.runtime.signal import AbortSignal
from agboss_sql.runtime.workflows import Child, checked_json, checked_name, fingerprint_of

if TYPE_CHECKING:
    from agboss_sql.contracts.stores import FencedEffectRepository
    from agboss_sql.runtime._execution import Executor
    from agboss_sql.runtime._run import Run

T = TypeVar("T")

StepUndo = Callable[[Any], Awaitable[Any]]
"""Undoes a finished step: called with the step's result."""
EffectUndo = Callable[[Any, Any], Awaitable[Any]]
"""Undoes a finished effect inside the fence's transaction: called with `(tx, result)`."""
Send = Callable[[int], Awaitable[JsonValue]]
"""Sends attempt N of an outbound call and answers the other system's response."""


class Replayer(Protocol):
    """What a context hands its calls to while a cancelled tree is replayed for its undos
    (`_collect.Collector`): each call answers what the first run stored, or ends the replay
    where the first run stopped."""

    async def step(
        self,
        run: Run,
        key: str,
        name: str,
        fingerprint: str,
        undo: Callable[..., Awaitable[Any]] | None,
        business_key: str | None,
        *,
        effect: bool = False,
    ) -> JsonValue: ...

    async def outbound(self, run: Run, key: str, name: str) -> JsonValue: ...

    async def children(self, run: Run, key: str, calls: Sequence[Child]) -> list[JsonValue]: ...

    async def pause(self, run: Run, key: str) -> JsonValue: ...


class WorkflowContext:
    """The handle a running workflow gets as its first argument (see the module).

    The workflow's own code between these calls must be deterministic: it runs again from
    the start on every resume, and each call must get the same name (and arguments) as the
    first time. `signal` tells a long step that the run must stop (its lease was lost or
    the tree was cancelled); `check()` raises then."""

    def __init__(
        self,
        executor: Executor,
        run: Run,
        *,
        prefix: str = "",
        collector: Replayer | None = None,
    ) -> None:
        self._executor = executor
        self._run = run
        self._prefix = prefix
        self._collector = collector

    # -- what the run is -------------------------------------------------------------------

    @property
    def workflow_id(self) -> str:
        """The id of the tree's root run (what `Engine.start` named)."""
        return self._run.root

    @property
    def execution_id(self) -> str:
        """This execution's id: the root's, or a child's."""
        return self._run.execution

    @property
    def tenant_id(self) -> str:
        return self._run.tenant_id

    @property
    def workflow(self) -> str:
        """The name of the workflow running."""
        return self._run.workflow

    @property
    def is_child(self) -> bool:
        """True in a child run (queued by a parent, run on any instance)."""
        return self._run.execution != self._run.root

    @property
    def instance_id(self) -> str:
        """The instance running this attempt (it changes when another instance resumes)."""
        return self._executor.instance_id

    @property
    def signal(self) -> AbortSignal:
        """Aborted when the run must stop: its lease was lost, or the tree was cancelled."""
        return self._run.keeper.signal

    def check(self) -> None:
        """Raise now if the run must stop (`ExecutionLeaseLostError`,
        `ExecutionCancelledError`): call it inside a long step between its parts."""
        if self._collector is None:
            self._run.keeper.guard()

    def _key(self, what: str, name: str) -> str:
        name = checked_name(what, name)
        counted = self._prefix + name
        number = self._run.counters.get(counted, 0) + 1
        self._run.counters[counted] = number
        return f"{counted}#{number}"

    # -- durable work ------------------------------------------------------------------------

    async def step(
        self,
        name: str,
        function: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        undo: StepUndo | None = None,
        **kwargs: Any,
    ) -> T:
        """Run `function(*args, **kwargs)` once and store its result (JSON) under this
        step's key, fenced by the run's lease: a resumed run gets the stored result and the
        function is not called again. Its arguments must be JSON too; a replay with other
        arguments is `StepConflictError`. `undo(result)` runs, once, if the tree is
        cancelled after this step finished (last step undone first).

        The function runs outside any transaction, so a crash after it returned and before
        its result was stored runs it again on resume: give work with outside effects an
        idempotency key, or use `effect` for work on the database."""
        fingerprint = fingerprint_of(args, kwargs)
        key = self._key("a step name", name)
        if self._collector is not None:
            return await self._collector.step(self._run, key, name, fingerprint, undo, None)  # type: ignore[no-any-return]
        return await self._executor.step(  # type: ignore[no-any-return]
            self._run, key, name, fingerprint, lambda: function(*args, **kwargs)
        )

    async def effect(
        self,
        name: str,
        function: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        business_key: str | None = None,
        undo: EffectUndo | None = None,
        **kwargs: Any,
    ) -> T:
        """Run `function(tx, *args, **kwargs)` inside the fence's transaction: the lease
        check, the result (JSON) and the rows `function` writes on `tx` (a SQLAlchemy
        `AsyncConnection` on the SQL stores) commit together or not at all — exactly once
        per key, a zombie's write refused. With `business_key` (an order id, a payment id)
        the effect is keyed by it across every run of the tenant: a second run with that key
        gets the stored result. `undo(tx, result)` runs, once and in its own fenced
        transaction, if the tree is cancelled after this effect."""
        fingerprint = fingerprint_of(args, kwargs)
        key = self._key("an effect name", name)
        if self._collector is not None:
            return await self._collector.step(  # type: ignore[no-any-return]
                self._run, key, name, fingerprint, undo, business_key, effect=True
            )
        return await self._executor.effect(  # type: ignore[no-any-return]
            self._run,
            key,
            name,
            fingerprint,
            lambda tx: function(tx, *args, **kwargs),
            business_key,
        )

    async def outbound(self, name: str, intent: JsonValue, send: Send) -> JsonValue:
        """Call another system at most once per attempt: the intent is recorded, each
        attempt is claimed before `send(attempt)` runs and ended with its response, and a
        resumed run never sends an attempt an earlier holder claimed. Answers the response
        (JSON). Use the attempt number (and the intent) as the other system's idempotency
        key where it has one."""
        checked_json(f"the intent of outbound call {name!r}", intent)
        key = self._key("an outbound call name", name)
        if self._collector is not None:
            return await self._collector.outbound(self._run, key, name)
        return await self._executor.outbound(self._run, key, name, intent, send)

    async def children(self, name: str, calls: Sequence[Child]) -> list[JsonValue]:
        """Run `calls` as child workflows on any instance and answer their results in
        order. While they run this run holds no lease and no slot: whoever finishes the last
        child wakes it, and it resumes (on any instance) from its stored steps. A child that
        failed or was cancelled is `ChildWorkflowFailedError` here."""
        if not calls:
            return []
        for call in calls:
            if not isinstance(call, Child):
                raise TypeError(f"children takes Child(workflow, input) values, got {call!r}")
            checked_name("a child's workflow name", call.workflow)
            checked_json(f"the input of child workflow {call.workflow!r}", call.input)
        key = self._key("a children name", name)
        if self._collector is not None:
            return await self._collector.children(self._run, key, calls)
        return await self._executor.children(self._run, key, calls)

    async def child(self, name: str, workflow: str, input: JsonValue = None) -> JsonValue:
        """One child workflow on any instance (`children(name, [Child(workflow, input)])`)."""
        return (await self.children(name, [Child(workflow, input)]))[0]

    async def call(self, name: str, workflow: str, input: JsonValue = None) -> Any:
        """Run another workflow of this app here, inside this run and under its lease (its
        steps keyed under `name`): a sub-workflow on this instance, with no queue round."""
        key = self._key("a call name", name)
        definition = self._executor.definition(workflow)
        inner = WorkflowContext(
            self._executor, self._run, prefix=key + "/", collector=self._collector
        )
        return await self._executor.invoke(definition, inner, input)

    async def pause(self, name: str, request: JsonValue = None) -> JsonValue:
        """Wait for a decision that any instance gives (`Engine.resume(workflow_id,
        decision)`), holding no lease while it waits, and answer it. Answered once: a
        second answer is `NotPausedError`. Only a tree's root pauses."""
        checked_json(f"the request of pause {name!r}", request)
        key = self._key("a pause name", name)
        if self._collector is not None:
            return await self._collector.pause(self._run, key)
        return await self._executor.pause(self._run, key, name, request)

    # -- for integrations ------------------------------------------------------------------
    # What a framework run as a workflow needs beyond the calls above (`runtime.graphs` runs
    # a LangGraph graph with them): the lease, the stores, effects under keys the framework
    # keeps stable itself. Nothing here is counted by name: a replay must give the same keys.

    @property
    def lease(self) -> ExecutionLease:
        """The run's current lease (its holder instance and epoch; renewals replace it)."""
        return self._run.lease

    @property
    def call_path(self) -> str:
        """Where this context runs inside its execution: "" in the workflow itself, or the
        keys of the `call`s it runs under joined by "/" (the same on every replay)."""
        return self._prefix.rstrip("/")

    @property
    def first_lease(self) -> bool:
        """True when this is the execution's first lease ever (epoch 1, not taken over):
        nothing can be stored under the run yet, so there is nothing to look for."""
        return self._run.fresh

    @property
    def replaying(self) -> bool:
        """True while a cancelled tree is replayed to find its undos: the workflow's calls
        answer what the first run stored and run nothing; code outside them must not act."""
        return self._collector is not None

    @property
    def effect_store(self) -> FencedEffectRepository[Any]:
        """The fenced-effect store the run's calls write through (on the SQL stores it has
        `connection`, `store_clock` and `application`: a saver of the same database)."""
        return self._executor.effects

    async def keyed_effect(
        self,
        key: str,
        name: str,
        function: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        business_key: str | None = None,
        **kwargs: Any,
    ) -> T:
        """`effect` under the explicit `key` (unique in the run, the same on every replay:
        a framework's task id) instead of the counted name: exactly once per key, the
        stored result answered on a second call. A long key is shortened to a digest."""
        checked_name("an effect name", name)
        key = bounded(key)
        fingerprint = fingerprint_of(args, kwargs)
        if self._collector is not None:
            return await self._collector.step(  # type: ignore[no-any-return]
                self._run, key, name, fingerprint, None, business_key, effect=True
            )
        return await self._executor.effect(  # type: ignore[no-any-return]
            self._run,
            key,
            name,
            fingerprint,
            lambda tx: function(tx, *args, **kwargs),
            business_key,
        )

    async def keyed_outbound(self, key: str, name: str, intent: JsonValue, send: Send) -> JsonValue:
        """`outbound` under the explicit `key` (as `keyed_effect`): at most once per attempt."""
        checked_name("an outbound call name", name)
        checked_json(f"the intent of outbound call {name!r}", intent)
        key = bounded(key)
        if self._collector is not None:
            return await self._collector.outbound(self._run, key, name)
        return await self._executor.outbound(self._run, key, name, intent, send)

    async def refused(self, step: str, reason: str) -> None:
        """Record that the store refused a fenced write the run made outside these calls
        (`step`: what was written, `checkpoint`) as this holder's lease lost, with why
        ("refused by the store: a checkpoint write: ..."), as a refused step is logged and
        reported. The caller raises the refusal on."""
        lease = self._run.lease
        executor = self._executor
        await log_lease_event(
            executor.events,
            executor.clock,
            lease,
            LeaseEventKind.LOST,
            reason=f"refused by the store: a {step} write: {reason}",
        )
        executor.emit(
            {
                "kind": "refused",
                "execution": self._run.execution,
                "step": step,
                "epoch": lease.lease_epoch,
                "reason": reason,
            }
        )


__all__ = ["EffectUndo", "Send", "StepUndo", "WorkflowContext"]
