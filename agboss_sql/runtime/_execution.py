"""Running one execution of a user's workflow under its lease: the root of a tree or a
child on any instance. The engine (`engine.py`) decides when; this module does it.

A run calls the workflow's function from its start. Each context call is keyed (see
`context.py`) and stored through the fenced-effect store under the execution's scope, so
a resumed run replays what is stored and runs only what is not. A run ends one of four
ways: the function returned (the root's record `succeeded`, a child's queue entry finished
with its result), it raised (`failed`), it suspended (a pause or a wait for children: no
lease or slot held) or its lease went elsewhere (it stops; the new holder goes on).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.clocks import Clock
from agboss_sql.contracts.errors import (
    DuplicatePauseError,
    ExecutionCancelledError,
    ExecutionFencedError,
    ExecutionLeaseLostError,
    StoreUnavailableError,
)
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.stores import (
    ChildExecutionQueueRepository,
    ExecutionLeaseEventRepository,
    ExecutionRecordRepository,
    ExecutionTreeRepository,
    FencedEffectRepository,
    OutboundCallRepository,
    PausedExecutionRepository,
)
from agboss_sql.contracts.types import (
    ChildStatus,
    ExecutionContext,
    ExecutionRecordStatus,
    FencedEffectKey,
    FencedEffectResult,
    JsonValue,
    LeaseEventKind,
    PausedExecution,
    PauseStatus,
    QueuedChild,
    StepRef,
)
from agboss_sql.runtime._log import log_lease_event
from agboss_sql.runtime._run import (
    EFFECT_EFFECT,
    END_DECISION_KEY,
    OUTBOUND_EFFECT,
    PAUSE_PREFIX,
    STEP_EFFECT,
    Emit,
    Run,
    StoreGaveUpError,
    Suspended,
    bounded,
    check_fingerprint,
    child_id_of,
    value_of,
)
from agboss_sql.runtime.errors import (
    ChildWorkflowFailedError,
    PauseNotSupportedError,
    UnknownWorkflowError,
)
from agboss_sql.runtime.outbound import outbound_call
from agboss_sql.runtime.slots import StepKind, StepSlots
from agboss_sql.runtime.workflows import (
    Child,
    WorkflowDefinition,
    Workflows,
    checked_json,
)

logger = logging.getLogger("agboss_sql.runtime")


def _ms_since(started: float) -> float:
    """Milliseconds since `started` (`time.perf_counter()`), for the events' `ms`: a step's
    or effect's time, its wait for a slot and its store calls included."""
    return round((time.perf_counter() - started) * 1000, 3)


@dataclass
class Executor:
    """Runs executions of the workflows in `workflows` on the given stores (see module)."""

    workflows: Workflows
    instance_id: str
    clock: Clock
    slots: StepSlots
    records: ExecutionRecordRepository
    tree: ExecutionTreeRepository
    queue: ChildExecutionQueueRepository
    pauses: PausedExecutionRepository
    effects: FencedEffectRepository[Any]
    outbound_calls: OutboundCallRepository
    events: ExecutionLeaseEventRepository | None
    lease_ms: int
    poll_ms: int
    emit: Emit
    after_resolve: Callable[[str, str], Awaitable[None]]
    queued: Callable[[], None] = lambda: None
    """Called when this instance queued children (the child pump may claim them now)."""

    def definition(self, workflow: str) -> WorkflowDefinition:
        found = self.workflows.get(workflow)
        if found is None:
            raise UnknownWorkflowError(
                f"workflow {workflow!r} is not registered in app {self.workflows.name!r} on "
                f"{self.instance_id}: register it, or run it on a worker whose app has it"
            )
        return found

    async def invoke(self, definition: WorkflowDefinition, ctx: Any, value: JsonValue) -> Any:
        """Call the workflow's function with the context (and the input, when it takes one)."""
        if definition.takes_input:
            return await definition.function(ctx, value)
        return await definition.function(ctx)

    # -- keys ------------------------------------------------------------------------------

    def _context(self, run: Run, key: str, name: str) -> ExecutionContext:
        return ExecutionContext(
            tenant_id=run.tenant_id,
            root_execution_id=run.root,
            execution_id=run.execution,
            lease=run.lease,
            step=StepRef(run.execution, bounded(key), name),
        )

    def fenced_key(
        self,
        run: Run,
        key: str,
        name: str,
        effect: str,
        business_key: str | None = None,
        fingerprint: str | None = None,
    ) -> FencedEffectKey:
        return fenced_effect_key_of(
            self._context(run, key, name),
            effect,
            business_key=business_key,
            fingerprint=fingerprint if business_key is not None else None,
        )

    # -- retries -----------------------------------------------------------------------------

    async def retrying(
        self, run: Run, what: str, call: Callable[[], Awaitable[Any]], *, guard: bool = True
    ) -> Any:
        """Run a store call again after a store outage while the lease is trusted, for up to
        one lease; past that the execution is handed over (`StoreGaveUpError`)."""
        first_failure: int | None = None
        while True:
            if guard:
                run.keeper.guard()
            else:
                run.keeper.check_lease()
            try:
                return await call()
            except StoreUnavailableError as error:
                now = self.clock.monotonic()
                first_failure = now if first_failure is None else first_failure
                if now - first_failure >= self.lease_ms:
                    raise StoreGaveUpError(
                        f"{what} failed for {now - first_failure} ms on this instance "
                        f"(last: {error}); handing {run.execution} over"
                    ) from error
                self.emit({"kind": "retry", "what": what, "error": repr(error)[:200]})
                await self.clock.sleep(self.poll_ms)

    # -- steps and effects -------------------------------------------------------------------

    def _kind(self, run: Run) -> StepKind:
        run.steps += 1
        if run.depth == 0 and run.steps == 1:
            return StepKind.ROOT
        return StepKind.DEEPER

    async def _save(
        self,
        run: Run,
        fenced: FencedEffectKey,
        key: str,
        work: Callable[[Any], Awaitable[JsonValue]],
    ) -> FencedEffectResult[JsonValue]:
        try:
            # The keeper knows when the effect's transaction holds the lease row (its work
            # runs after the fence): its renewal waits behind that lock meanwhile.
            async with run.keeper.effect() as held:

                async def holding(tx: Any) -> JsonValue:
                    held()
                    return await work(tx)

                return await self.effects.save_result_if_absent(fenced, holding)
        except ExecutionFencedError as refused:
            # A zombie's write: the store refused it. Logged as the lease lost, with why.
            await log_lease_event(
                self.events,
                self.clock,
                run.lease,
                LeaseEventKind.LOST,
                reason=f"refused by the store: {refused.reason}",
            )
            self.emit(
                {
                    "kind": "refused",
                    "execution": run.execution,
                    "step": key,
                    "epoch": run.lease.lease_epoch,
                    "reason": refused.reason,
                }
            )
            raise

    async def step(
        self,
        run: Run,
        key: str,
        name: str,
        fingerprint: str,
        compute: Callable[[], Awaitable[Any]],
    ) -> JsonValue:
        fenced = self.fenced_key(run, key, name, STEP_EFFECT)
        started = time.perf_counter()
        async with self.slots.step(self._kind(run), run.depth):
            run.keeper.guard()
            if not run.fresh:
                stored = await self.retrying(
                    run, f"read step {key}", lambda: self.effects.get_result(fenced)
                )
                if stored is not None:
                    check_fingerprint(run, key, fingerprint, stored.value)
                    self.emit(
                        {
                            "kind": "step",
                            "execution": run.execution,
                            "step": key,
                            "replayed": True,
                            "ms": _ms_since(started),
                        }
                    )
                    return value_of(stored.value)
            run.keeper.guard()
            output = checked_json(f"the result of step {key!r}", await compute())
            body: JsonValue = {"v": output, "fp": fingerprint}

            async def work(_tx: Any) -> JsonValue:
                return body

            result = await self.retrying(
                run, f"store step {key}", lambda: self._save(run, fenced, key, work)
            )
        if result.replayed:
            # Stored meanwhile by an earlier attempt of this same holder (a retried commit).
            check_fingerprint(run, key, fingerprint, result.value)
        self.emit(
            {
                "kind": "step",
                "execution": run.execution,
                "step": key,
                "replayed": result.replayed,
                "ms": _ms_since(started),
            }
        )
        return value_of(result.value)

    async def effect(
        self,
        run: Run,
        key: str,
        name: str,
        fingerprint: str,
        compute: Callable[[Any], Awaitable[Any]],
        business_key: str | None,
    ) -> JsonValue:
        fenced = self.fenced_key(run, key, name, EFFECT_EFFECT, business_key, fingerprint)

        async def work(tx: Any) -> JsonValue:
            run.keeper.guard()
            output = checked_json(f"the result of effect {key!r}", await compute(tx))
            return {"v": output, "fp": fingerprint}

        started = time.perf_counter()
        async with self.slots.step(self._kind(run), run.depth):
            result = await self.retrying(
                run, f"effect {key}", lambda: self._save(run, fenced, key, work)
            )
        if result.replayed and business_key is None:
            check_fingerprint(run, key, fingerprint, result.value)
        self.emit(
            {
                "kind": "effect",
                "execution": run.execution,
                "step": key,
                "replayed": result.replayed,
                "ms": _ms_since(started),
            }
        )
        return value_of(result.value)

    async def outbound(
        self,
        run: Run,
        key: str,
        name: str,
        intent: JsonValue,
        send: Callable[[int], Awaitable[JsonValue]],
    ) -> JsonValue:
        fenced = self.fenced_key(run, key, name, OUTBOUND_EFFECT)

        async def sending(attempt: int) -> JsonValue:
            run.keeper.guard()
            self.emit(
                {
                    "kind": "sent",
                    "execution": run.execution,
                    "call": f"{run.execution}|{key}",
                    "attempt": attempt,
                    "epoch": run.lease.lease_epoch,
                }
            )
            return checked_json(f"the response of outbound call {key!r}", await send(attempt))

        async with self.slots.step(self._kind(run), run.depth):
            call = await self.retrying(
                run,
                f"outbound call {key}",
                lambda: outbound_call(
                    self.outbound_calls, fenced, intent, self.clock.now(), sending
                ),
            )
        return call.response

    # -- children --------------------------------------------------------------------------

    async def children(self, run: Run, key: str, calls: Sequence[Child]) -> list[JsonValue]:
        ids = [child_id_of(run.execution, key, index) for index in range(len(calls))]
        rows = await self.retrying(
            run, "read the children", lambda: self.queue.children(run.tenant_id, run.execution)
        )
        known = {row.child_execution_id: row for row in rows}
        run.keeper.guard()
        missing = [
            QueuedChild(
                tenant_id=run.tenant_id,
                root_execution_id=run.root,
                parent_execution_id=run.execution,
                child_execution_id=child_id,
                depth=run.depth + 1,
                payload={"workflow": call.workflow, "input": call.input},
            )
            for child_id, call in zip(ids, calls, strict=True)
            if child_id not in known
        ]
        if missing:
            # One step for all of them; ids queued meanwhile (a retry after a lost reply,
            # another attempt of this run) are skipped, so a retry is safe.
            await self.retrying(
                run,
                f"queue {len(missing)} children of {run.execution}",
                functools.partial(self.queue.enqueue_many, missing),
            )
        if len(known) < len(ids):
            self.queued()
        if not all(
            known.get(i) is not None and known[i].status is ChildStatus.FINISHED for i in ids
        ):
            if run.attempt is None:
                if not await self._root_waits(run, ids):
                    return await self._outcomes(run, ids)
            elif await self._child_waits(run):
                raise Suspended(run.execution)
            else:
                return await self._outcomes(run, ids)
            raise Suspended(run.execution)
        return await self._outcomes(run, ids, rows)

    async def _outcomes(
        self, run: Run, ids: list[str], rows: Sequence[Any] | None = None
    ) -> list[JsonValue]:
        if rows is None:
            rows = await self.queue.children(run.tenant_id, run.execution)
        found = {row.child_execution_id: row.outcome for row in rows}
        results: list[JsonValue] = []
        failures: list[dict[str, JsonValue]] = []
        for child_id in ids:
            outcome = found.get(child_id)
            if isinstance(outcome, dict) and "result" in outcome:
                results.append(outcome["result"])
            else:
                failures.append({"child": child_id, "outcome": outcome})
                results.append(None)
        if failures:
            raise ChildWorkflowFailedError(
                f"{len(failures)} of {len(ids)} children of {run.execution} did not succeed: "
                + "; ".join(f"{f['child']}: {f['outcome']}" for f in failures[:5]),
                failures=failures,
            )
        return results

    async def _root_waits(self, run: Run, ids: list[str]) -> bool:
        """Wait for the children without a lease or a slot: the record moves `running ->
        queued` (no sweep resumes it), then the lease is yielded. True when this run ends
        here (the last child's finisher wakes the tree); False when it goes on (every child
        finished meanwhile and this run won the record back)."""
        keeper = run.keeper
        keeper.guard()
        if not await self.records.transition(
            run.tenant_id, run.root, ExecutionRecordStatus.RUNNING, ExecutionRecordStatus.QUEUED
        ):
            raise RuntimeError(f"run {run.root} was not running when it went to wait")
        if not await keeper.yield_():
            return True
        self.emit({"kind": "yielded", "tree": run.root, "epoch": run.lease.lease_epoch})
        record = await self.records.get(run.tenant_id, run.root)
        woken = record is not None and record.status is ExecutionRecordStatus.RUNNING
        rows = await self.queue.children(run.tenant_id, run.execution)
        finished = {c.child_execution_id for c in rows if c.status is ChildStatus.FINISHED}
        if not woken and all(child in finished for child in ids):
            # The last child finished before the record was `queued`: its wake found the
            # run running and did nothing, so the run wakes itself.
            woken = await self.records.transition(
                run.tenant_id, run.root, ExecutionRecordStatus.QUEUED, ExecutionRecordStatus.RUNNING
            )
        if not woken:
            return True
        if await keeper.reclaim() is None:
            return True  # another instance took the woken run
        self.emit({"kind": "reclaimed", "tree": run.root, "epoch": run.lease.lease_epoch})
        return False

    async def _child_waits(self, run: Run) -> bool:
        """A child waiting for its own children: its queue entry moves `running -> waiting`,
        then its lease is yielded. False when every one of them finished already."""
        run.keeper.guard()
        assert run.attempt is not None
        attempt = run.attempt
        waited = await self.retrying(
            run,
            f"the wait of {run.execution}",
            lambda: self.queue.wait_for_children(run.execution, attempt=attempt),
        )
        if waited is None:
            raise ExecutionLeaseLostError(
                f"child {run.execution} is no longer run by attempt {run.attempt}"
            )
        if not waited.waiting:
            return False
        if await run.keeper.yield_():
            self.emit({"kind": "yielded", "tree": run.execution, "epoch": run.lease.lease_epoch})
        return True

    # -- pauses ------------------------------------------------------------------------------

    def pause_id_of(self, run_root: str, key: str) -> str:
        return bounded(f"{run_root}:{key}")

    async def pause(self, run: Run, key: str, name: str, request: JsonValue) -> JsonValue:
        """A pause of the root: the decision when it is in; else the record goes `paused`,
        the lease is released and the run suspends."""
        if run.attempt is not None:
            raise PauseNotSupportedError(
                f"child {run.execution} cannot pause ({name!r}): only a tree's root pauses"
            )
        pause_id = self.pause_id_of(run.root, key)
        if await self.cancel_requested(run):
            # Before any pause is saved: a cancelled run never leaves one waiting.
            raise ExecutionCancelledError(f"run {run.root} was cancelled before it paused")
        found = await self.retrying(
            run, "read the pause", lambda: self.pauses.get(run.tenant_id, pause_id)
        )
        if found is None:
            await self.retrying(
                run,
                "name the pause",
                lambda: self.tree.save_if_absent(
                    run.tenant_id,
                    run.root,
                    bounded(PAUSE_PREFIX + key),
                    {"pause_id": pause_id, "name": name},
                ),
            )
            pause = PausedExecution(
                tenant_id=run.tenant_id,
                pause_id=pause_id,
                execution_id=run.execution,
                root_execution_id=run.root,
                thread_id=None,
                status=PauseStatus.PENDING,
                request=request,
                decision=None,
                created_at=self.clock.now(),
                resolved_at=None,
            )
            with contextlib.suppress(DuplicatePauseError):
                await self.retrying(run, "save the pause", lambda: self.pauses.save(pause))
            found = await self.pauses.get(run.tenant_id, pause_id)
        assert found is not None
        if found.status is PauseStatus.CANCELLED:
            raise ExecutionCancelledError(f"pause {name!r} of {run.root} was cancelled")
        if found.status is PauseStatus.RESOLVED:
            await self.pauses.take(run.tenant_id, pause_id, taker=self.instance_id)
            self.emit({"kind": "pause-taken", "tree": run.root, "pause": key})
            return found.decision
        if found.status is PauseStatus.TAKEN:
            return found.decision
        # Pending: the record leaves `running` first (the sweep leaves a paused run alone),
        # then the lease goes.
        run.keeper.guard()
        if not await self.records.transition(
            run.tenant_id, run.root, ExecutionRecordStatus.RUNNING, ExecutionRecordStatus.PAUSED
        ):
            raise RuntimeError(f"run {run.root} was not running when it paused")
        await run.keeper.release()
        self.emit({"kind": "paused", "tree": run.root, "pause": key})
        # A decision that came before the record was `paused` found nothing to resume, and
        # a cancel that read the record before it was `paused` cancelled no pause: whichever
        # came, this run or the canceller sees the other (each reads after its own write).
        if await self.end_decision(run.tenant_id, run.root) == "cancel":
            await self.pauses.cancel(run.tenant_id, pause_id)
            await self.records.transition(
                run.tenant_id,
                run.root,
                ExecutionRecordStatus.PAUSED,
                ExecutionRecordStatus.RUNNING,
            )
            raise Suspended(run.root)  # a sweep runs its undo
        again = await self.pauses.get(run.tenant_id, pause_id)
        if again is not None and again.status is PauseStatus.RESOLVED:
            await self.after_resolve(run.tenant_id, run.root)
        raise Suspended(run.root)

    # -- cancel and undo ---------------------------------------------------------------------

    async def end_decision(self, tenant_id: str, root: str) -> str | None:
        value = await self.tree.get(tenant_id, root, END_DECISION_KEY)
        decision = value.get("decision") if isinstance(value, dict) else None
        return decision if isinstance(decision, str) else None

    async def cancel_requested(self, run: Run) -> bool:
        if isinstance(run.keeper.signal.reason, ExecutionCancelledError):
            return True
        decision = await self.retrying(
            run,
            "read the end decision",
            lambda: self.end_decision(run.tenant_id, run.root),
            guard=False,
        )
        return bool(decision == "cancel")

    async def decide_close(self, run: Run) -> bool:
        """Claim the tree's end for its close: True when the close won (now or in an earlier
        run); False when a cancel won first."""
        if isinstance(run.keeper.signal.reason, ExecutionCancelledError):
            return False
        decision = {"decision": "close", "by": self.instance_id, "at": self.clock.now()}
        if await self.retrying(
            run,
            "decide the close",
            lambda: self.tree.save_if_absent(run.tenant_id, run.root, END_DECISION_KEY, decision),
        ):
            return True
        return await self.end_decision(run.tenant_id, run.root) == "close"

    async def descendants_ended(self, tenant_id: str, root: str) -> bool:
        pending = [root]
        while pending:
            parent = pending.pop()
            for child in await self.queue.children(tenant_id, parent):
                if child.status is not ChildStatus.FINISHED:
                    return False
                pending.append(child.child_execution_id)
        return True


__all__ = ["Executor"]
