"""Undoing a cancelled tree: a replay that runs nothing finds every finished step with an
undo (children's steps where the parent waited for them), and the undos run last first,
each once, under the root's lease (`Unwinder`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.types import (
    ChildStatus,
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    JsonValue,
    OutboundCallStatus,
    PauseStatus,
    StepRef,
)
from agboss_sql.runtime._execution import Executor
from agboss_sql.runtime._run import (
    EFFECT_EFFECT,
    OUTBOUND_EFFECT,
    STEP_EFFECT,
    UNDO_EFFECT,
    Run,
    bounded,
    child_id_of,
    value_of,
)
from agboss_sql.runtime.unwind import Compensator, Unwinder
from agboss_sql.runtime.workflows import Child, WorkflowDefinition, checked_json

T = TypeVar("T")


class ReplayEnd(Exception):
    """A collecting replay reached a call the first run never finished: nothing after it
    happened, so nothing after it is undone."""


async def unwind(
    executor: Executor, run: Run, definition: WorkflowDefinition, value: JsonValue
) -> int:
    """Undo a cancelled tree: wait for its descendants to end (they see the cancel too),
    replay the tree to find what finished, then run the undos last first, durably (each
    once, across instances). How many undos this call ran."""
    keeper = run.keeper
    executor.emit({"kind": "unwinding", "tree": run.root})
    while not await executor.descendants_ended(run.tenant_id, run.root):
        keeper.check_lease()
        await executor.clock.sleep(executor.poll_ms)
    collector = Collector(executor, run)
    # A replay of its own: the run may have made calls already, and its keys count from one.
    await collector.replay(dataclasses.replace(run, counters={}, steps=0), definition, value)
    if collector.failure is not None:
        # What finished could not be read: undo nothing rather than part of it. The next
        # holder (or this one, at its next run) unwinds again.
        raise collector.failure
    ran = await Unwinder(executor.tree).compensate(
        run.tenant_id, run.root, collector.compensators, keeper=keeper
    )
    executor.emit({"kind": "unwound", "tree": run.root, "undone": len(ran)})
    return len(ran)


class Collector:
    """Replays a finished part of a tree without doing anything, to list its undos in the
    order their steps finished (children's steps where the parent waited for them)."""

    def __init__(self, executor: Executor, root_run: Run) -> None:
        self.executor = executor
        self.root_run = root_run
        self.compensators: list[Compensator] = []
        self.failure: BaseException | None = None
        """A store call of the replay that failed (the workflow's own code may swallow it)."""

    async def replay(self, run: Run, definition: WorkflowDefinition, value: JsonValue) -> None:
        from agboss_sql.runtime.context import WorkflowContext

        ctx = WorkflowContext(self.executor, run, collector=self)
        with contextlib.suppress(ReplayEnd, Exception):
            await self.executor.invoke(definition, ctx, value)

    def _read_key(
        self,
        run: Run,
        key: str,
        name: str,
        effect: str,
        business_key: str | None,
        fingerprint: str | None = None,
    ) -> FencedEffectKey:
        lease = ExecutionLease(
            tenant_id=run.tenant_id,
            execution_id=run.execution,
            holder_instance_id=self.executor.instance_id,
            lease_epoch=1,
            remaining_ms=0,
            taken_over_from=None,
        )
        ctx = ExecutionContext(
            tenant_id=run.tenant_id,
            root_execution_id=run.root,
            execution_id=run.execution,
            lease=lease,
            step=StepRef(run.execution, bounded(key), name),
        )
        return fenced_effect_key_of(
            ctx,
            effect,
            business_key=business_key,
            fingerprint=fingerprint if business_key is not None else None,
        )

    async def _read(self, call: Awaitable[T]) -> T:
        """A store read of the replay; its failure is kept, whatever the workflow does."""
        try:
            return await call
        except Exception as error:
            if self.failure is None:
                self.failure = error
            raise

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
    ) -> JsonValue:
        kind = EFFECT_EFFECT if effect else STEP_EFFECT
        stored = await self._read(
            self.executor.effects.get_result(
                self._read_key(run, key, name, kind, business_key, fingerprint)
            )
        )
        if stored is None:
            raise ReplayEnd(key)
        value = value_of(stored.value)
        if undo is not None:
            self.compensators.append(
                (bounded(f"{run.execution}/{key}"), self._undo(run, key, undo, value, effect))
            )
        return value

    def _undo(
        self,
        run: Run,
        key: str,
        undo: Callable[..., Awaitable[Any]],
        value: JsonValue,
        effect: bool,
    ) -> Callable[[], Awaitable[None]]:
        root_run = self.root_run
        executor = self.executor
        undo_key = bounded(f"undo/{run.execution}/{key}")

        async def compensate() -> None:
            fenced = executor.fenced_key(root_run, undo_key, "undo", UNDO_EFFECT)
            work: Callable[[Any], Awaitable[JsonValue]]
            if effect:

                async def in_transaction(tx: Any) -> JsonValue:
                    return {"v": checked_json("an undo's result", await undo(tx, value))}

                work = in_transaction
            else:
                if await executor.effects.get_result(fenced) is not None:
                    return
                output = checked_json("an undo's result", await undo(value))

                async def stored(_tx: Any) -> JsonValue:
                    return {"v": output}

                work = stored
            await executor.retrying(
                root_run,
                f"undo {key} of {run.execution}",
                lambda: executor._save(root_run, fenced, undo_key, work),
                guard=False,
            )

        return compensate

    async def outbound(self, run: Run, key: str, name: str) -> JsonValue:
        call = await self._read(
            self.executor.outbound_calls.get(self._read_key(run, key, name, OUTBOUND_EFFECT, None))
        )
        if call is None or call.status is not OutboundCallStatus.COMPLETED:
            raise ReplayEnd(key)
        return call.response

    async def children(self, run: Run, key: str, calls: Sequence[Child]) -> list[JsonValue]:
        ids = [child_id_of(run.execution, key, index) for index in range(len(calls))]
        rows = {
            row.child_execution_id: row
            for row in await self._read(self.executor.queue.children(run.tenant_id, run.execution))
        }
        results: list[JsonValue] = []
        for child_id, call in zip(ids, calls, strict=True):
            row = rows.get(child_id)
            if row is None:
                raise ReplayEnd(key)
            definition = self.executor.workflows.get(call.workflow)
            if definition is not None:
                child_run = Run(
                    tenant_id=run.tenant_id,
                    root=run.root,
                    execution=child_id,
                    depth=run.depth + 1,
                    keeper=self.root_run.keeper,
                    workflow=call.workflow,
                    attempt=row.attempt,
                )
                await self.replay(child_run, definition, call.input)
            outcome = row.outcome
            results.append(outcome.get("result") if isinstance(outcome, dict) else None)
            if row.status is not ChildStatus.FINISHED:
                raise ReplayEnd(key)
        return results

    async def pause(self, run: Run, key: str) -> JsonValue:
        found = await self._read(
            self.executor.pauses.get(run.tenant_id, self.executor.pause_id_of(run.root, key))
        )
        if found is None or found.status not in (PauseStatus.RESOLVED, PauseStatus.TAKEN):
            raise ReplayEnd(key)
        return found.decision


__all__ = ["Collector", "ReplayEnd", "unwind"]
