"""The fixture workload a pod runs: trees of fenced steps, an outbound call, children
through the queue, and a pause resolved by another pod.

A tree (a root execution) runs, under its lease:

1. `s1`: a fenced effect writing the business row `<tree>|s1`;
2. `s2`: an outbound call recorded, claimed (`mark_pending`), sent (a `sent` event: the
   other system is the pod's event log) and marked completed;
3. `s3`: its children queued; it waits until all are finished (woken, or seen finished);
   each child runs on any pod under its own lease and writes `<child>|work`;
4. `s4` (some trees): a pause it waits on; another pod resolves it (or, when no other pod
   answers within a lease, the pod itself);
5. `s5`: a fenced effect writing `<tree>|s5`;
6. its record completed (`running -> succeeded`) and its lease finished.

Every step is idempotent on resume: a tree taken over runs from the start and the stored
results replay. A run that loses its lease (lost, fenced) stops without undoing anything:
the next holder owns the tree. A store error retries the step while the lease is trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.contracts.errors import (
    DuplicateExecutionError,
    DuplicatePauseError,
    ExecutionFencedError,
    ExecutionLeaseLostError,
    NotPausedError,
)
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.types import (
    ClaimedChild,
    ExecutionContext,
    ExecutionLease,
    ExecutionRecord,
    ExecutionRecordStatus,
    JsonValue,
    PausedExecution,
    PauseStatus,
    QueuedChild,
    StepRef,
)
from agboss_sql.lab.faults.fixture import PodIdentity, PodStores
from agboss_sql.runtime import ChildWorker, LeaseKeeper, RecoverySweep, compensate
from agboss_sql.runtime.children import FinishReporting
from agboss_sql.runtime.outbound import outbound_call

logger = logging.getLogger("agboss_sql.lab.faults")

WOKEN_KEY = "@fault/woken"
EFFECT = "charge"
HANDOVER = (ExecutionLeaseLostError, ExecutionFencedError)
"""Errors that mean another instance owns the execution now: stop, undo nothing."""

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class WorkloadConfig:
    """What a pod runs: the trees it submits, every tree of the run (for the pause
    resolver), the children per tree, the trees with a pause, the lease, and the pieces
    the tests that prove the audit bites break: `compensate_on_handover` (undo a tree
    whose lease was lost), `recovery=False` (no recovery sweep), `release_on_stop=False`
    (a graceful stop that lets the leases run out)."""

    tenant_id: str = "fault-tenant"
    trees: tuple[str, ...] = ()
    all_trees: tuple[str, ...] = ()
    children: int = 2
    pause_trees: tuple[str, ...] = ()
    lease_ms: int = 30_000
    poll_ms: int = 1_000
    compensate_on_handover: bool = False
    recovery: bool = True
    release_on_stop: bool = True


@dataclass
class Workload:
    """One pod's runtime around its stores: tree runners, the recovery sweep, the child
    worker and the pause resolver."""

    stores: PodStores
    pod: PodIdentity
    config: WorkloadConfig
    emit: Emit
    keeper_class: type[LeaseKeeper] = LeaseKeeper
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _keepers: set[LeaseKeeper] = field(default_factory=set)
    _sweep: RecoverySweep | None = None
    _worker: ChildWorker | None = None

    @property
    def me(self) -> str:
        return self.pod.instance_id

    def _keeper(self, root: str | None = None) -> LeaseKeeper:
        return self.keeper_class(
            self.stores.leases,
            self.stores.events,
            self.pod.clock,
            lease_ms=self.config.lease_ms,
            tree=self.stores.tree,
            root_execution_id=root,
        )

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- life ----------------------------------------------------------------------------

    def start(self) -> None:
        """Submit this pod's trees, and start the sweep, the child worker and the pause
        resolver."""
        stores, config = self.stores, self.config
        for tree in config.trees:
            self._spawn(self._submit(tree))
        self._sweep = RecoverySweep(
            stores.records,
            stores.leases,
            stores.events,
            None,
            self.pod.clock,
            resume=self._resume,
            free_slots=lambda: 100,
            lease_ms=config.lease_ms,
            every_ms=max(1, config.lease_ms // 3),
        )
        if config.recovery:
            self._sweep.start()
        self._worker = ChildWorker(
            FinishReporting(stores.queue, self.emit),  # type: ignore[arg-type]
            stores.leases,
            stores.events,
            self.pod.clock,
            run_child=self._run_child,
            wake_parent=self._wake_parent,
            lease_ms=config.lease_ms,
            tree=stores.tree,
            instance_id=self.me,
        )
        self._worker.start(poll_ms=config.poll_ms, rescue_every_ms=max(1, config.lease_ms // 3))
        self._spawn(self._resolver())

    async def stop(self) -> None:
        """Stop gracefully: no new work; every tree run stops and releases its lease."""
        if self._sweep is not None:
            await self._sweep.stop()
        if self._worker is not None:
            await self._worker.stop()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- trees ---------------------------------------------------------------------------

    async def _submit(self, tree: str) -> None:
        # The record first, then the lease: a run whose start failed half way is found by
        # a recovery sweep (a sweep may also take it before this take; then it runs there).
        config = self.config
        while True:
            try:
                await self._record(tree, "s0", None, None)
                keeper = self._keeper(tree)
                lease = await keeper.take(config.tenant_id, tree)
                break
            except Exception as error:
                self.emit({"kind": "retry", "what": f"submit {tree}", "error": repr(error)[:200]})
                await self.pod.clock.sleep(config.poll_ms)
        if lease is None:
            self.emit({"kind": "tree-skip", "tree": tree})
            return
        await self._run_tree(tree, keeper, lease)

    async def _resume(self, record: ExecutionRecord, lease: ExecutionLease) -> None:
        keeper = self._keeper(record.execution_id)
        if not await keeper.adopt(lease):
            raise ExecutionLeaseLostError(f"could not confirm the lease of {record.execution_id}")
        self._spawn(self._run_tree(record.execution_id, keeper, lease))

    async def _run_tree(self, tree: str, keeper: LeaseKeeper, lease: ExecutionLease) -> None:
        config = self.config
        self._keepers.add(keeper)
        self.emit(
            {
                "kind": "tree-run",
                "tree": tree,
                "epoch": lease.lease_epoch,
                "taken_over_from": None
                if lease.taken_over_from is None
                else lease.taken_over_from.instance_id,
            }
        )
        keeper.start()
        self._spawn(self._report_loss(tree, keeper, lease))
        steps = [
            ("s0", self._record),
            ("s1", self._effect),
            ("s2", self._outbound),
            ("s3", self._children),
            ("s4", self._pause),
            ("s5", self._effect),
        ]
        try:
            for step, run in steps:
                await self._step(tree, step, keeper, lease, run)
            while True:
                keeper.guard()
                try:
                    done = await self.stores.records.complete(
                        config.tenant_id,
                        tree,
                        ExecutionRecordStatus.RUNNING,
                        ExecutionRecordStatus.SUCCEEDED,
                        {"by": self.me, "epoch": lease.lease_epoch},
                    )
                    break
                except HANDOVER:
                    raise
                except Exception as error:
                    await self._retry_pause(f"complete {tree}", error)
            if done:
                self.emit({"kind": "tree-done", "tree": tree, "epoch": lease.lease_epoch})
            await keeper.finish()
        except HANDOVER as error:
            self.emit(
                {
                    "kind": "handover",
                    "tree": tree,
                    "epoch": lease.lease_epoch,
                    "error": type(error).__name__,
                }
            )
            if config.compensate_on_handover:
                # A broken runtime (for the tests that prove the audit bites): it undoes
                # the tree's steps on a hand-over, which the next holder then continues.
                with contextlib.suppress(Exception):
                    self.emit({"kind": "compensate", "tree": tree, "epoch": lease.lease_epoch})
                    await compensate(self.stores.tree, config.tenant_id, tree, [("s1", _noop)])
            await keeper.stop()
        except asyncio.CancelledError:
            # A graceful stop: hand the tree over now instead of letting the lease run out.
            await keeper.stop()
            if config.release_on_stop:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2):
                        if keeper.held:
                            await keeper.release()
            raise
        finally:
            self._keepers.discard(keeper)

    async def _report_loss(self, tree: str, keeper: LeaseKeeper, lease: ExecutionLease) -> None:
        """Report the moment the keeper fences itself (its signal aborted, the lease lost)."""
        await keeper.signal.wait()
        if keeper.lost:
            self.emit(
                {
                    "kind": "lease-lost",
                    "tree": tree,
                    "epoch": lease.lease_epoch,
                    "reason": str(keeper.signal.reason)[:200],
                }
            )

    async def _step(
        self, tree: str, step: str, keeper: LeaseKeeper, lease: ExecutionLease, run: Any
    ) -> None:
        while True:
            keeper.guard()
            try:
                await run(tree, step, keeper, lease)
                return
            except HANDOVER:
                raise
            except Exception as error:
                await self._retry_pause(f"{tree} {step}", error)

    async def _retry_pause(self, what: str, error: BaseException) -> None:
        self.emit({"kind": "retry", "what": what, "error": repr(error)[:200]})
        await self.pod.clock.sleep(self.config.poll_ms)

    def _context(
        self, lease: ExecutionLease, root: str, execution: str, step: str
    ) -> ExecutionContext:
        return ExecutionContext(
            tenant_id=self.config.tenant_id,
            root_execution_id=root,
            execution_id=execution,
            lease=lease,
            step=StepRef(execution, step, step),
        )

    async def _charge(self, lease: ExecutionLease, root: str, execution: str, step: str) -> None:
        key = fenced_effect_key_of(self._context(lease, root, execution, step), EFFECT)
        row = f"{execution}|{step}"
        business_row = self.stores.business_row

        async def work(tx: Any) -> JsonValue:
            await business_row(tx, row)
            return {"row": row}

        result = await self.stores.effects.save_result_if_absent(key, work)
        self.emit(
            {
                "kind": "effect",
                "execution": execution,
                "step": step,
                "epoch": lease.lease_epoch,
                "replayed": result.replayed,
            }
        )

    async def _record(
        self, tree: str, step: str, keeper: LeaseKeeper | None, lease: ExecutionLease | None
    ) -> None:
        now = self.pod.clock.now()
        with contextlib.suppress(DuplicateExecutionError):
            await self.stores.records.save(
                ExecutionRecord(
                    tenant_id=self.config.tenant_id,
                    execution_id=tree,
                    root_execution_id=tree,
                    parent_execution_id=None,
                    thread_id=None,
                    workflow="fault-tree",
                    owner=self.me,
                    status=ExecutionRecordStatus.RUNNING,
                    created_at=now,
                    updated_at=now,
                )
            )

    async def _effect(
        self, tree: str, step: str, keeper: LeaseKeeper, lease: ExecutionLease
    ) -> None:
        await self._charge(lease, tree, tree, step)

    async def _outbound(
        self, tree: str, step: str, keeper: LeaseKeeper, lease: ExecutionLease
    ) -> None:
        key = fenced_effect_key_of(self._context(lease, tree, tree, step), "notify")

        async def send(attempt: int) -> JsonValue:
            keeper.guard()
            self.emit(
                {
                    "kind": "sent",
                    "call": f"{tree}|{step}",
                    "attempt": attempt,
                    "epoch": lease.lease_epoch,
                }
            )
            return {"ok": True}

        await outbound_call(self.stores.outbound, key, {"tree": tree}, self.pod.clock.now(), send)

    async def _children(
        self, tree: str, step: str, keeper: LeaseKeeper, lease: ExecutionLease
    ) -> None:
        config, queue = self.config, self.stores.queue
        # All of them in one step, as the runtime queues a run's children: queued one by
        # one, the first could finish before the next was queued, see none left, and wake
        # the tree while its sibling was still to run. Ids queued already (a take-over
        # running this step again) are skipped.
        await queue.enqueue_many(
            [
                QueuedChild(
                    tenant_id=config.tenant_id,
                    root_execution_id=tree,
                    parent_execution_id=tree,
                    child_execution_id=f"{tree}.c{index}",
                    depth=1,
                    payload={"index": index},
                )
                for index in range(config.children)
            ]
        )
        while True:
            keeper.guard()
            woken = await self.stores.tree.get(config.tenant_id, tree, WOKEN_KEY)
            children = await queue.children(config.tenant_id, tree)
            if woken is not None or all(c.status == "finished" for c in children):
                return
            await self.pod.clock.sleep(config.poll_ms)

    async def _pause(
        self, tree: str, step: str, keeper: LeaseKeeper, lease: ExecutionLease
    ) -> None:
        config, pauses, clock = self.config, self.stores.pauses, self.pod.clock
        if tree not in config.pause_trees:
            return
        pause_id = f"{tree}.approval"
        if await pauses.get(config.tenant_id, pause_id) is None:
            with contextlib.suppress(DuplicatePauseError):
                await pauses.save(
                    PausedExecution(
                        tenant_id=config.tenant_id,
                        pause_id=pause_id,
                        execution_id=tree,
                        root_execution_id=tree,
                        thread_id=None,
                        status=PauseStatus.PENDING,
                        request={"by": self.me},
                        decision=None,
                        created_at=clock.now(),
                        resolved_at=None,
                    )
                )
                self.emit({"kind": "paused", "tree": tree, "epoch": lease.lease_epoch})
        while True:
            keeper.guard()
            found = await pauses.get(config.tenant_id, pause_id)
            if found is not None and found.status is PauseStatus.RESOLVED:
                await pauses.take(config.tenant_id, pause_id)
                return
            if found is not None and found.status is PauseStatus.TAKEN:
                return
            await clock.sleep(config.poll_ms)

    async def _resolver(self) -> None:
        config, pauses, clock = self.config, self.stores.pauses, self.pod.clock
        answered: set[str] = set()
        while True:
            for tree in config.pause_trees:
                if tree in answered:
                    continue
                pause_id = f"{tree}.approval"
                try:
                    found = await pauses.get(config.tenant_id, pause_id)
                    if found is None:
                        continue
                    if found.status is not PauseStatus.PENDING:
                        answered.add(tree)
                        continue
                    by = found.request.get("by") if isinstance(found.request, dict) else None
                    alone = clock.now() - found.created_at > config.lease_ms
                    if by == self.me and not alone:
                        continue
                    await pauses.resolve(
                        config.tenant_id, pause_id, {"approved": True, "by": self.me}
                    )
                    self.emit({"kind": "resolved", "tree": tree})
                    answered.add(tree)
                except NotPausedError:
                    answered.add(tree)
                except Exception as error:
                    self.emit(
                        {"kind": "retry", "what": f"resolve {tree}", "error": repr(error)[:200]}
                    )
            await clock.sleep(config.poll_ms)

    # -- children ------------------------------------------------------------------------

    async def _run_child(self, child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
        self.emit(
            {
                "kind": "child-run",
                "child": child.child_execution_id,
                "attempt": child.attempt,
                "epoch": lease.lease_epoch,
            }
        )
        while True:
            try:
                await self._charge(lease, child.root_execution_id, child.child_execution_id, "work")
                return {"done": child.child_execution_id}
            except HANDOVER:
                raise
            except Exception as error:
                await self._retry_pause(f"child {child.child_execution_id}", error)

    async def _wake_parent(self, tenant_id: str, parent_execution_id: str) -> None:
        await self.stores.tree.save_if_absent(tenant_id, parent_execution_id, WOKEN_KEY, True)
        self.emit({"kind": "woke", "tree": parent_execution_id})


async def _noop() -> None:
    return None


__all__ = ["EFFECT", "HANDOVER", "WOKEN_KEY", "Workload", "WorkloadConfig"]
