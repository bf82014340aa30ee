"""`Worker`: one application instance that runs trees of steps on shared stores.

    agboss-sql worker --url URL

A worker runs, on one `Application` over the SQL stores:

- the `RecoverySweep` (trees whose holder died or let go, claimed up to the free slots),
- a `ChildWorker` whose children are claimed only while a step slot is free,
- a `LeaseKeeper` per tree run and per child run,
- `StepSlots`: at most `max_concurrent_steps` steps at once, served in priority order; the
  readiness component `step-slots` is DEGRADED while every slot is busy,
- a pause resolver (pauses created on other instances), and the commands a cluster sends
  it (`start`, `cancel`, `resume`) on its standard input as JSON lines.

The tree it runs (the cluster's workload) is, under the root's lease:

1. `plan` (a durable step), `reserve` (a business effect, undone on cancel);
2. for some trees, a pause for a decision that another instance resolves; while paused
   the record is `paused` and the tree holds no lease (two-phase resume: resolve the
   pause, then take the lease);
3. its children queued for any instance; while they run the parent's record is `queued`,
   its lease yielded and its slot free; whoever finishes the last child wakes it;
4. `close` (the step that closes the branch), then the record `succeeded` and the lease
   finished.

A child above the deepest level queues its own children and waits for them as a root
does: its queue entry moves `running -> waiting` (neither claimed nor rescued while it
waits), its lease is yielded and its run ends; the finish of its last child makes it
claimable again, and whichever instance claims it replays its steps and `merge`s. A leaf
`think`s, charges its order (a business effect with the order as business key) and
records an outbound call. Every finished step's output is
stored through `FencedEffectRepository.save_result_if_absent` under the step's key, so a
run resumed elsewhere replays its finished steps (no work is done again) and runs only the
interrupted one; a zombie's write is refused by the store.

A cancel (`Worker.cancel`, from any instance) and the root's close race for one tree key,
`END_DECISION_KEY`: the first to write it wins, so a cancel either ends the tree cancelled
or is told it came too late. A cancel that won writes the cancel request
(`CANCEL_REQUEST_KEY`), seen at the holder's next renewal; the root waits for its
descendants to end, then undoes its effects last first (`Unwinder`: durable, each undo
once) and ends `cancelled`.

Events (JSON lines on standard output) say what the worker does; the cluster's live view
reads them. The cluster's audit never trusts them for a verdict it can read from the
database.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import time
import traceback
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any

from agboss_sql.application import (
    Application,
    ComponentHealth,
    DatabaseUrl,
    HealthStatus,
    ReadinessReport,
)
from agboss_sql.contracts.clocks import Clock, SystemClock
from agboss_sql.contracts.errors import (
    DuplicateChildError,
    DuplicateExecutionError,
    DuplicatePauseError,
    ExecutionCancelledError,
    ExecutionFencedError,
    ExecutionLeaseLostError,
    NotPausedError,
    StoreUnavailableError,
)
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.stores import (
    CANCEL_REQUEST_KEY,
    ChildExecutionQueueRepository,
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    ExecutionRecordRepository,
    ExecutionTreeRepository,
    FencedEffectRepository,
    OutboundCallRepository,
    PausedExecutionRepository,
)
from agboss_sql.contracts.types import (
    ClaimedChild,
    ExecutionContext,
    ExecutionLease,
    ExecutionRecord,
    ExecutionRecordStatus,
    JsonValue,
    LeaseEventKind,
    PausedExecution,
    PauseStatus,
    QueuedChild,
    StepRef,
)
from agboss_sql.runtime._log import log_lease_event
from agboss_sql.runtime.children import (
    ChildWorker,
    ChildYielded,
    FinishReporting,
    cancel_and_wait,
    flush_bounded,
    release_bounded,
)
from agboss_sql.runtime.keeper import LeaseKeeper, current_keeper
from agboss_sql.runtime.outbound import outbound_call
from agboss_sql.runtime.slots import DEFAULT_AGING_MS, StepKind, StepSlots
from agboss_sql.runtime.sweep import RecoverySweep
from agboss_sql.runtime.unwind import Compensator, Unwinder

logger = logging.getLogger("agboss_sql.runtime")

SPEC_KEY = "@cluster/spec"
"""The tree key holding a tree's spec (fan-out, depth, pause), written at submission."""
BUSINESS_EFFECT = "charge"
"""The fenced effect name of every step that writes a business row (row `<execution>|<step>`)."""
STEP_EFFECT = "step"
"""The fenced effect name of a durable step without business rows."""
END_DECISION_KEY = "@cluster/end"
"""The tree key that decides between a cancel and the tree's close: whichever writes it
first wins (`save_if_absent`), so a cancel either ends the tree cancelled or is told it came
too late; never is a cancel accepted and the tree then succeeds. Its value is
`{"decision": "cancel" | "close", "by": instance, "at": ms}`."""
HANDOVER = (ExecutionLeaseLostError, ExecutionFencedError)
"""Errors that mean another instance owns the execution now: stop, undo nothing."""

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class TreeSpec:
    """What a tree does: `fan_out` children per parent down to depth `depth` (the leaves),
    and whether the root pauses for a decision first."""

    fan_out: int = 2
    depth: int = 2
    pause: bool = False

    def to_json(self) -> dict[str, JsonValue]:
        return {"fan_out": self.fan_out, "depth": self.depth, "pause": self.pause}

    @classmethod
    def from_json(cls, value: JsonValue) -> TreeSpec:
        if not isinstance(value, dict):
            return cls()
        fan_out, depth, pause = value.get("fan_out", 2), value.get("depth", 2), value.get("pause")
        return cls(
            fan_out=fan_out if isinstance(fan_out, int) else 2,
            depth=depth if isinstance(depth, int) else 2,
            pause=bool(pause),
        )


def children_of(execution_id: str, fan_out: int) -> list[str]:
    """The ids of an execution's children."""
    return [f"{execution_id}.c{index}" for index in range(fan_out)]


def descendants_of(root: str, spec: TreeSpec) -> list[tuple[str, int]]:
    """Every descendant of a tree with its depth, parents before their children."""
    found: list[tuple[str, int]] = []
    level = [root]
    for depth in range(1, spec.depth + 1):
        level = [child for parent in level for child in children_of(parent, spec.fan_out)]
        found.extend((child, depth) for child in level)
    return found


def leaves_of(root: str, spec: TreeSpec) -> list[str]:
    """The leaves of a tree (the executions that charge an order)."""
    return [child for child, depth in descendants_of(root, spec) if depth == spec.depth]


@dataclass(frozen=True)
class WorkerConfig:
    """A worker's settings. `step_ms` is the simulated work of each step; `sweep_ms` and
    `poll_ms` default from the lease (a third of it, and a fifteenth)."""

    url: str | None = None
    instance_id: str | None = None
    lease_ms: int = 30_000
    max_concurrent_steps: int = 4
    step_ms: int = 50
    sweep_ms: int | None = None
    poll_ms: int | None = None
    aging_ms: int = DEFAULT_AGING_MS
    shutdown_ms: int = 10_000
    resolve_pauses: bool = True
    status_ms: int = 500

    def __post_init__(self) -> None:
        for what in ("lease_ms", "max_concurrent_steps", "aging_ms", "shutdown_ms", "status_ms"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{what} must be a positive int, got {value!r}")
        if isinstance(self.step_ms, bool) or not isinstance(self.step_ms, int) or self.step_ms < 0:
            raise ValueError(f"step_ms must be an int >= 0, got {self.step_ms!r}")
        for what in ("sweep_ms", "poll_ms"):
            value = getattr(self, what)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise ValueError(f"{what} must be a positive int or None, got {value!r}")

    @property
    def sweep_every_ms(self) -> int:
        return self.sweep_ms if self.sweep_ms is not None else max(1, self.lease_ms // 3)

    @property
    def trust_margin_ms(self) -> int:
        """The keepers' trust margin: 1 s, or a third of a shorter lease."""
        return min(1_000, self.lease_ms // 3)

    @property
    def poll_every_ms(self) -> int:
        return self.poll_ms if self.poll_ms is not None else max(10, self.lease_ms // 15)


class StoreGaveUpError(ExecutionLeaseLostError):
    """A store call kept failing on this instance for a whole lease: the run stops as if
    its lease were lost (nothing is undone) and another instance runs the execution on."""


class _NotStored(Exception):
    """Raised inside a probe's work: nothing is stored under the key (rolled back)."""


async def _probe(_tx: Any) -> JsonValue:
    raise _NotStored


@dataclass
class _Run:
    """One run of one execution on this worker."""

    tenant_id: str
    root: str
    execution: str
    depth: int
    keeper: LeaseKeeper
    spec: TreeSpec

    @property
    def lease(self) -> ExecutionLease:
        lease = self.keeper.lease
        assert lease is not None
        return lease


@dataclass
class Worker:
    """One application instance running trees (see the module). `start()` then `stop()`,
    or `async with Worker(config) as worker:`."""

    config: WorkerConfig
    emit: Emit = field(default=lambda _event: None)
    clock: Clock = field(default_factory=SystemClock)
    app: Application | None = None
    slots: StepSlots = field(init=False)
    instance_id: str = field(init=False)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _keepers: set[LeaseKeeper] = field(default_factory=set)
    _sweep: RecoverySweep | None = None
    _children: ChildWorker | None = None
    _active_children: int = 0
    _pending_children: set[str] = field(default_factory=set)
    _made: weakref.WeakSet[LeaseKeeper] = field(default_factory=weakref.WeakSet)
    _roots: set[str] = field(default_factory=set)
    _changed: asyncio.Event | None = None
    _stopping: bool = False

    def __post_init__(self) -> None:
        self.instance_id = self.config.instance_id or f"worker-{uuid.uuid4().hex[:8]}"
        self.slots = StepSlots(
            self.config.max_concurrent_steps, self.clock, aging_ms=self.config.aging_ms
        )

    # -- stores --------------------------------------------------------------------------

    def _store(self, contract: type[Any]) -> Any:
        assert self.app is not None, "start the worker first"
        return self.app.store(contract)

    @property
    def leases(self) -> ExecutionLeaseRepository:
        return self._store(ExecutionLeaseRepository)  # type: ignore[no-any-return]

    @property
    def events(self) -> ExecutionLeaseEventRepository:
        return self._store(ExecutionLeaseEventRepository)  # type: ignore[no-any-return]

    @property
    def records(self) -> ExecutionRecordRepository:
        return self._store(ExecutionRecordRepository)  # type: ignore[no-any-return]

    @property
    def tree(self) -> ExecutionTreeRepository:
        return self._store(ExecutionTreeRepository)  # type: ignore[no-any-return]

    @property
    def queue(self) -> ChildExecutionQueueRepository:
        return self._store(ChildExecutionQueueRepository)  # type: ignore[no-any-return]

    @property
    def pauses(self) -> PausedExecutionRepository:
        return self._store(PausedExecutionRepository)  # type: ignore[no-any-return]

    @property
    def effects(self) -> FencedEffectRepository[Any]:
        return self._store(FencedEffectRepository)  # type: ignore[no-any-return]

    @property
    def outbound(self) -> OutboundCallRepository:
        return self._store(OutboundCallRepository)  # type: ignore[no-any-return]

    @property
    def sweep(self) -> RecoverySweep:
        """The recovery sweep (after `start()`)."""
        assert self._sweep is not None, "start the worker first"
        return self._sweep

    @property
    def child_worker(self) -> ChildWorker:
        """The child worker (after `start()`)."""
        assert self._children is not None, "start the worker first"
        return self._children

    # -- life ----------------------------------------------------------------------------

    async def start(self, *, background: bool = True) -> None:
        """Assemble the application and start the sweep, the child worker, the pause
        resolver and the status reports (`background=False` starts only the application:
        the tests drive the pieces one call at a time)."""
        from agboss_sql.sql import sql_stores

        if self.app is None:
            self.app = Application(
                "agboss-worker",
                sql_stores(),
                {DatabaseUrl: DatabaseUrl(self.config.url)} if self.config.url else {},
                instance_id=self.instance_id,
            )
        await self.app.start()
        self.app.add_readiness_component("step-slots", self.slot_health)
        self._changed = asyncio.Event()
        config = self.config
        self._sweep = RecoverySweep(
            self.records,
            self.leases,
            self.events,
            self.pauses,
            self.clock,
            resume=self._resume_claimed,
            free_slots=lambda: self.slots.free,
            lease_ms=config.lease_ms,
            every_ms=config.sweep_every_ms,
        )
        self._children = ChildWorker(
            FinishReporting(self.queue, self.emit),  # type: ignore[arg-type]
            self.leases,
            self.events,
            self.clock,
            run_child=self._run_child,
            wake_parent=self._wake_parent,
            lease_ms=config.lease_ms,
            tree=self.tree,
            instance_id=self.instance_id,
            trust_margin_ms=config.trust_margin_ms,
            wake_claim_ms=max(config.lease_ms, 1_000),
        )
        if background:
            self._sweep.start()
            self._spawn(self._child_pump())
            self._spawn(self._child_rescue())
            if config.resolve_pauses:
                self._spawn(self._resolver())
            self._spawn(self._status())
        self.emit({"kind": "ready", "pid": os.getpid(), "max_steps": config.max_concurrent_steps})

    async def stop(self) -> None:
        """Stop gracefully within `shutdown_ms`: no new work; every run is cancelled and the
        lease of each one still held is released so another instance takes it at once.

        Each phase has a share of the bound: the sweep 10% of it, the tree runs and what
        starts work 30%, the children's runs 30%. A task still going past its share (stuck
        in a clean-up that outlived its cancellation) is cancelled again and left, its
        stack printed on standard error and counted in a `stop-stuck` event, and the
        leases are released all the same (together, each bounded to 2 s). `TimeoutError`
        (a `stop-timeout` event) only if the whole bound passed anyway."""
        self._stopping = True
        self.emit({"kind": "stopping"})
        began = time.monotonic()
        bound_s = self.config.shutdown_ms / 1000
        try:
            async with asyncio.timeout(bound_s):
                # First what starts work (the sweep, the child pump, the rescue, the
                # resolver, the commands' calls) and the tree runs, then the children's
                # runs: nothing new is started while the leases are released.
                report = functools.partial(self._report_stuck, "runs")
                if self._sweep is not None:
                    # Alone first: a pass going on would hand the trees it takes to new runs.
                    sweep = asyncio.get_running_loop().create_task(self._sweep.stop())
                    await cancel_and_wait([sweep], 0.1 * bound_s, on_stuck=report, cancel=False)
                await cancel_and_wait(list(self._tasks), 0.3 * bound_s, on_stuck=report)
                self.emit({"kind": "stop-phase", "phase": "runs stopped"})
                released = 0
                if self._children is not None:
                    released += await self._children.stop(
                        release=True,
                        timeout_s=0.3 * bound_s,
                        on_stuck=functools.partial(self._report_stuck, "children"),
                    )
                self.emit({"kind": "stop-phase", "phase": "children stopped"})
                keepers = [keeper for keeper in self._keepers if keeper.held]
                released += sum(await asyncio.gather(*(release_bounded(k) for k in keepers)))
                await flush_bounded(list(self._made))
                self.emit({"kind": "released", "leases": released})
        except TimeoutError:
            # What the stop still waited for, for the operator (standard error).
            self.emit({"kind": "stop-timeout", "ms": self.config.shutdown_ms})
            traceback.print_exc(file=sys.stderr)
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task() and not task.done():
                    task.print_stack(limit=12, file=sys.stderr)
            raise
        finally:
            if self.app is not None:
                await self.app.close()
            self.emit({"kind": "stopped", "ms": round((time.monotonic() - began) * 1000, 1)})

    def _report_stuck(self, phase: str, stuck: set[asyncio.Task[Any]]) -> None:
        self.emit({"kind": "stop-stuck", "phase": phase, "tasks": len(stuck)})
        for task in stuck:
            with contextlib.suppress(Exception):
                task.print_stack(limit=12, file=sys.stderr)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _nap(self, ms: int) -> None:
        """Sleep `ms` on the clock, or less when something changed (a slot freed)."""
        changed = self._changed
        if changed is None:
            await self.clock.sleep(ms)
            return
        changed.clear()
        sleeper = asyncio.get_running_loop().create_task(self.clock.sleep(ms))
        waiter = asyncio.get_running_loop().create_task(changed.wait())
        try:
            await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiter.cancel()

    # -- readiness -----------------------------------------------------------------------

    def slot_health(self) -> ComponentHealth:
        """The `step-slots` component: DEGRADED while every slot is busy."""
        slots = self.slots
        if slots.full:
            return ComponentHealth(
                "step-slots",
                HealthStatus.DEGRADED,
                0.0,
                f"all {slots.max_steps} step slots busy, {slots.waiting} steps waiting",
            )
        return ComponentHealth("step-slots", HealthStatus.UP, 0.0)

    async def check_readiness(self) -> ReadinessReport:
        """Every store's ping and the step slots (see `Application.check_readiness`)."""
        assert self.app is not None, "start the worker first"
        return await self.app.check_readiness()

    # -- submitting, starting, resuming, cancelling ---------------------------------------

    async def submit(
        self, tenant_id: str, tree_id: str, spec: TreeSpec, *, start: bool = True
    ) -> None:
        """Record a new tree (its spec, then its `running` record, so a sweep anywhere runs
        it if this instance dies first) and, with `start`, run it here."""
        await submit_tree(
            self.tree, self.records, self.leases, tenant_id, tree_id, spec, self.clock
        )
        if start:
            await self.start_tree(tenant_id, tree_id, StepKind.ROOT)

    async def start_tree(
        self, tenant_id: str, tree_id: str, kind: StepKind = StepKind.ROOT
    ) -> bool:
        """Take the tree's lease and run it as a task of this worker. False when the lease is
        held elsewhere (the holder runs it)."""
        keeper = self._keeper(tree_id)
        # Known before the take: a stop that cancels this call after the take still
        # releases the lease (or logs it lost).
        self._keepers.add(keeper)
        try:
            lease = await keeper.take(tenant_id, tree_id)
        finally:
            if not keeper.held:
                self._keepers.discard(keeper)
        if lease is None:
            return False
        self._spawn(self._run_root(tenant_id, tree_id, keeper, kind))
        return True

    async def _resume_claimed(self, record: ExecutionRecord, lease: ExecutionLease) -> None:
        """The sweep's resume: hold the lease it took and run the tree from its stored steps."""
        keeper = self._keeper(record.execution_id)
        self._keepers.add(keeper)
        if not await keeper.adopt(lease):
            raise ExecutionLeaseLostError(f"could not confirm the lease of {record.execution_id}")
        self.emit({"kind": "recovered", "tree": record.execution_id, "epoch": lease.lease_epoch})
        self._spawn(self._run_root(record.tenant_id, record.execution_id, keeper, StepKind.DEEPER))

    async def resume(self, tenant_id: str, tree_id: str, decision: JsonValue) -> bool:
        """Two-phase resume of a paused tree: resolve its pause (a second answer, here or on
        any instance, is `NotPausedError`), then move its record back to `running` and take
        its lease (tried a few times; past that a sweep runs it). True when this call
        resolved the pause."""
        await self.pauses.resolve(tenant_id, pause_id_of(tree_id), decision)
        self.emit({"kind": "resolved", "tree": tree_id})
        await self._after_resolve(tenant_id, tree_id)
        return True

    async def _after_resolve(self, tenant_id: str, tree_id: str) -> None:
        if not await self.records.transition(
            tenant_id, tree_id, ExecutionRecordStatus.PAUSED, ExecutionRecordStatus.RUNNING
        ):
            return  # still running (its runner sees the decision), or moved by another
        for _ in range(3):
            if self._stopping or await self.start_tree(tenant_id, tree_id, StepKind.DEEPER):
                return
            # The pausing run may not have released the lease yet; past these tries the
            # record is running with a free lease, which a sweep runs.
            await self.clock.sleep(self.config.poll_every_ms)

    async def cancel(self, tenant_id: str, tree_id: str) -> bool:
        """Cancel a tree from this instance, wherever it runs. True when the tree will end
        cancelled (this request or an earlier one won `END_DECISION_KEY`); False when the
        tree had already decided to close (too late: it ends succeeded, and no cancel
        request is written).

        After the decision, the cancel request is written (its holder sees it at the next
        renewal and unwinds); a paused tree's pause is cancelled and its record set
        running, so a sweep runs its unwind. Calling it again is harmless."""
        decision = {"decision": "cancel", "by": self.instance_id, "at": self.clock.now()}
        if not await self.tree.save_if_absent(tenant_id, tree_id, END_DECISION_KEY, decision):
            found = await self.tree.get(tenant_id, tree_id, END_DECISION_KEY)
            if end_decision(found) != "cancel":
                self.emit({"kind": "cancel-too-late", "tree": tree_id})
                return False
        await self.tree.save_if_absent(
            tenant_id, tree_id, CANCEL_REQUEST_KEY, {"by": self.instance_id, "at": self.clock.now()}
        )
        self.emit({"kind": "cancel-requested", "tree": tree_id})
        record = await self.records.get(tenant_id, tree_id)
        if record is not None and record.status is ExecutionRecordStatus.PAUSED:
            await self.pauses.cancel(tenant_id, pause_id_of(tree_id))
            await self.records.transition(
                tenant_id, tree_id, ExecutionRecordStatus.PAUSED, ExecutionRecordStatus.RUNNING
            )
        return True

    # -- running a tree --------------------------------------------------------------------

    def _keeper(self, root: str) -> LeaseKeeper:
        keeper = self._new_keeper(root)
        self._made.add(keeper)
        return keeper

    def _new_keeper(self, root: str) -> LeaseKeeper:
        return LeaseKeeper(
            self.leases,
            self.events,
            self.clock,
            lease_ms=self.config.lease_ms,
            tree=self.tree,
            root_execution_id=root,
            trust_margin_ms=self.config.trust_margin_ms,
        )

    async def _run_root(
        self, tenant_id: str, tree_id: str, keeper: LeaseKeeper, kind: StepKind
    ) -> None:
        self._keepers.add(keeper)
        self._roots.add(tree_id)
        lease = keeper.lease
        assert lease is not None
        self.emit(
            {
                "kind": "tree-run",
                "tree": tree_id,
                "epoch": lease.lease_epoch,
                "taken_over_from": None
                if lease.taken_over_from is None
                else lease.taken_over_from.instance_id,
            }
        )
        keeper.start()
        run = _Run(tenant_id, tree_id, tree_id, 0, keeper, TreeSpec())
        try:
            record = await self._retrying(
                run, "read the record", lambda: self.records.get(tenant_id, tree_id), guard=False
            )
            if record is None or record.status is not ExecutionRecordStatus.RUNNING:
                # Paused, waiting or ended since this run was asked for: not this run's.
                await keeper.release()
                return
            spec = await self._retrying(run, "read the spec", lambda: self._spec(run))
            run.spec = spec
            if await self._cancel_requested(run):
                raise ExecutionCancelledError(f"tree {tree_id} was cancelled")
            await self._step(run, "plan", kind, lambda: self._work({"fan_out": spec.fan_out}))
            await self._step(
                run,
                "reserve",
                StepKind.DEEPER,
                lambda: self._work({"reserved": tree_id}),
                business=True,
            )
            if spec.pause and not await self._pause(run):
                return  # paused: no lease held; a resume elsewhere runs it on
            children = children_of(tree_id, spec.fan_out)
            await self._enqueue(run, children)
            if not await self._all_finished(run, children) and await self._yield_for_children(
                run, children
            ):
                return  # waiting: whoever finishes the last child wakes the tree
            if not await self._decide_close(run):
                raise ExecutionCancelledError(f"tree {tree_id} was cancelled")
            await self._step(
                run, "close", StepKind.CLOSE_BRANCH, lambda: self._work({"closed": tree_id})
            )
            await self._end(run, ExecutionRecordStatus.SUCCEEDED, {"by": self.instance_id})
        except ExecutionCancelledError:
            await self._unwind(run)
        except HANDOVER as error:
            await self._handover(run, error)
        except asyncio.CancelledError:
            # A graceful stop: release the lease so another instance takes the tree now.
            await keeper.stop()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await keeper.release()
            raise
        except Exception as error:
            task = asyncio.current_task()
            if self._stopping or (task is not None and task.cancelling()):
                # Cancelled, but a library turned the cancellation into an error (SQLAlchemy
                # does when it lands in an engine's first connect): a stop, not a failure.
                logger.info("tree %s stopped by %s", tree_id, type(error).__name__)
                await keeper.stop()
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2):
                        await keeper.release()
                return
            logger.warning("tree %s failed", tree_id, exc_info=True)
            with contextlib.suppress(Exception):
                await self._end(
                    run,
                    ExecutionRecordStatus.FAILED,
                    {"reason": f"{type(error).__name__}: {str(error)[:300]}"},
                )
        finally:
            self._roots.discard(tree_id)
            if keeper.held and not self._stopping:
                # Whatever stopped this run without ending the tree: let another try now.
                with contextlib.suppress(Exception):
                    await keeper.release()

    async def _spec(self, run: _Run) -> TreeSpec:
        return TreeSpec.from_json(await self.tree.get(run.tenant_id, run.root, SPEC_KEY))

    async def _end(self, run: _Run, status: ExecutionRecordStatus, outcome: JsonValue) -> None:
        keeper = run.keeper
        keeper.check_lease()
        done = await self._retrying(
            run,
            f"complete {run.root}",
            lambda: self.records.complete(
                run.tenant_id, run.root, ExecutionRecordStatus.RUNNING, status, outcome
            ),
            guard=False,
        )
        if done:
            self.emit({"kind": "tree-end", "tree": run.root, "status": status.value})
            await keeper.finish()
        else:
            # The record was not running: not this run's to end (never finish its lease).
            await keeper.release()

    async def _handover(self, run: _Run, error: BaseException) -> None:
        self.emit(
            {
                "kind": "handover",
                "tree": run.execution,
                "epoch": run.lease.lease_epoch,
                "error": type(error).__name__,
            }
        )
        await run.keeper.stop()

    async def _pause(self, run: _Run) -> bool:
        """The pause step. True when the decision is in (go on); False when the tree is
        now paused (its record `paused`, its lease released)."""
        pause_id = pause_id_of(run.root)
        found = await self._retrying(
            run, "read the pause", lambda: self.pauses.get(run.tenant_id, pause_id)
        )
        if found is None:
            with contextlib.suppress(DuplicatePauseError):
                await self._retrying(run, "save the pause", lambda: self._save_pause(run))
            found = await self.pauses.get(run.tenant_id, pause_id)
        assert found is not None
        if found.status is PauseStatus.CANCELLED:
            raise ExecutionCancelledError(f"the pause of {run.root} was cancelled")
        if found.status is PauseStatus.RESOLVED:
            await self.pauses.take(run.tenant_id, pause_id, taker=self.instance_id)
            self.emit({"kind": "pause-taken", "tree": run.root})
            return True
        if found.status is PauseStatus.TAKEN:
            return True
        # Pending: the record leaves `running` first (the sweep leaves a paused tree alone),
        # then the lease goes.
        run.keeper.guard()
        if not await self.records.transition(
            run.tenant_id, run.root, ExecutionRecordStatus.RUNNING, ExecutionRecordStatus.PAUSED
        ):
            raise RuntimeError(f"tree {run.root} was not running when it paused")
        await run.keeper.release()
        self.emit({"kind": "paused", "tree": run.root})
        # A decision that came before the record was `paused` found nothing to resume.
        again = await self.pauses.get(run.tenant_id, pause_id)
        if again is not None and again.status is PauseStatus.RESOLVED:
            await self._after_resolve(run.tenant_id, run.root)
        return False

    async def _save_pause(self, run: _Run) -> None:
        await self.pauses.save(
            PausedExecution(
                tenant_id=run.tenant_id,
                pause_id=pause_id_of(run.root),
                execution_id=run.root,
                root_execution_id=run.root,
                thread_id=None,
                status=PauseStatus.PENDING,
                request={"by": self.instance_id, "question": "approve the orders?"},
                decision=None,
                created_at=self.clock.now(),
                resolved_at=None,
            )
        )

    async def _enqueue(self, run: _Run, children: list[str]) -> None:
        run.keeper.guard()
        for child in children:
            queued = QueuedChild(
                tenant_id=run.tenant_id,
                root_execution_id=run.root,
                parent_execution_id=run.execution,
                child_execution_id=child,
                depth=run.depth + 1,
                payload={"depth": run.depth + 1, "spec": run.spec.to_json()},
            )
            with contextlib.suppress(DuplicateChildError):
                await self._retrying(
                    run, f"queue {child}", functools.partial(self.queue.enqueue, queued)
                )

    async def _all_finished(self, run: _Run, children: list[str]) -> bool:
        rows = await self._retrying(
            run, "read the children", lambda: self.queue.children(run.tenant_id, run.execution)
        )
        finished = {c.child_execution_id for c in rows if c.status == "finished"}
        return all(child in finished for child in children)

    async def _yield_for_children(self, run: _Run, children: list[str]) -> bool:
        """Wait for the children without a lease or a slot: the record moves `running ->
        queued` (so no sweep resumes it), then the lease is yielded. True when this run
        ends here (the last child's finisher wakes the tree); False when it goes on (every
        child finished meanwhile and this run won the record back)."""
        keeper = run.keeper
        keeper.guard()
        if not await self.records.transition(
            run.tenant_id, run.root, ExecutionRecordStatus.RUNNING, ExecutionRecordStatus.QUEUED
        ):
            raise RuntimeError(f"tree {run.root} was not running when it went to wait")
        if not await keeper.yield_():
            return True
        self.emit({"kind": "yielded", "tree": run.root, "epoch": run.lease.lease_epoch})
        record = await self.records.get(run.tenant_id, run.root)
        woken = record is not None and record.status is ExecutionRecordStatus.RUNNING
        # Read without the lease (it is yielded): a guarded read would refuse.
        rows = await self.queue.children(run.tenant_id, run.execution)
        finished = {c.child_execution_id for c in rows if c.status == "finished"}
        if not woken and all(child in finished for child in children):
            # The last child finished before the record was `queued`: its wake found the
            # tree running and did nothing, so the tree wakes itself.
            woken = await self.records.transition(
                run.tenant_id,
                run.root,
                ExecutionRecordStatus.QUEUED,
                ExecutionRecordStatus.RUNNING,
            )
        if not woken:
            return True
        if await keeper.reclaim() is None:
            return True  # another instance took the woken tree
        self.emit({"kind": "reclaimed", "tree": run.root, "epoch": run.lease.lease_epoch})
        return False

    async def _wake_parent(self, tenant_id: str, parent_execution_id: str) -> None:
        """Called by the finisher of a parent's last child: a waiting tree's record goes
        back to `running` and this instance takes its lease and runs it on (a parent that is
        itself a child was made claimable again by the finish itself: it has no record, and
        the child pump claims it)."""
        moved = await self.records.transition(
            tenant_id,
            parent_execution_id,
            ExecutionRecordStatus.QUEUED,
            ExecutionRecordStatus.RUNNING,
        )
        self.emit({"kind": "woke", "tree": parent_execution_id, "moved": moved})
        # A parent that is itself a child was made claimable by the finish: claim it soon.
        self._poke()
        if moved and not self._stopping:
            # If the take is refused the record is running and its lease free: a sweep
            # (here or elsewhere) runs it.
            self._spawn(self.start_tree(tenant_id, parent_execution_id, StepKind.CLOSE_BRANCH))

    async def _cancel_requested(self, run: _Run) -> bool:
        if isinstance(run.keeper.signal.reason, ExecutionCancelledError):
            return True
        # The decision, not the request: a canceller that died between writing the two
        # has still cancelled the tree.
        return await self._end_decision(run) == "cancel"

    async def _end_decision(self, run: _Run) -> str | None:
        """The tree's end decision (`END_DECISION_KEY`), read without the guard."""
        value = await self._retrying(
            run,
            "read the end decision",
            lambda: self.tree.get(run.tenant_id, run.root, END_DECISION_KEY),
            guard=False,
        )
        return end_decision(value)

    async def _decide_close(self, run: _Run) -> bool:
        """Claim the tree's end for its close: True when the close won (now, or in an
        earlier run of this tree); False when a cancel won first."""
        if isinstance(run.keeper.signal.reason, ExecutionCancelledError):
            return False
        decision = {"decision": "close", "by": self.instance_id, "at": self.clock.now()}
        if await self._retrying(
            run,
            "decide the close",
            lambda: self.tree.save_if_absent(run.tenant_id, run.root, END_DECISION_KEY, decision),
        ):
            return True
        return await self._end_decision(run) == "close"

    async def _unwind(self, run: _Run) -> None:
        """Undo a cancelled tree: wait for its descendants to end (they see the cancel
        request too), then run the undos last first, durably, and end `cancelled`."""
        keeper = run.keeper
        self.emit({"kind": "unwinding", "tree": run.root})
        try:
            # Read again without the guard: a cancel seen when the lease was taken aborts
            # the guarded read of the spec, and the undo list must be this tree's.
            run.spec = await self._retrying(
                run, "read the spec", lambda: self._spec(run), guard=False
            )
            if run.spec.depth > 0:
                while not await self._descendants_ended(run):
                    keeper.check_lease()
                    await self.clock.sleep(self.config.poll_every_ms)
            compensators: list[Compensator] = [("reserve", self._undo(run, "reserve", None))]
            for leaf in leaves_of(run.root, run.spec):
                compensators.append((f"charge:{leaf}", self._undo(run, f"charge:{leaf}", leaf)))
            ran = await Unwinder(self.tree).compensate(
                run.tenant_id, run.root, compensators, keeper=keeper
            )
            self.emit({"kind": "unwound", "tree": run.root, "undone": len(ran)})
            await self._end(
                run,
                ExecutionRecordStatus.CANCELLED,
                {"reason": "cancelled by request", "by": self.instance_id},
            )
        except HANDOVER as error:
            await self._handover(run, error)

    async def _descendants_ended(self, run: _Run) -> bool:
        pending = [run.root]
        while pending:
            parent = pending.pop()
            for child in await self.queue.children(run.tenant_id, parent):
                if child.status != "finished":
                    return False
                pending.append(child.child_execution_id)
        return True

    def _undo(self, run: _Run, what: str, leaf: str | None) -> Callable[[], Awaitable[None]]:
        async def undo() -> None:
            if leaf is not None and not await self._charged(run, leaf):
                return
            await self._effect(run, f"undo:{what}", business=True, value={"undone": what})

        return undo

    async def _charged(self, run: _Run, leaf: str) -> bool:
        """Whether the leaf's order was charged (probed under the root's lease by the
        order's business key: nothing is written)."""
        key = fenced_effect_key_of(
            self._context(run, "probe:" + leaf), BUSINESS_EFFECT, business_key=order_key(leaf)
        )
        try:
            await self.effects.save_result_if_absent(key, _probe)
        except _NotStored:
            return False
        return True

    # -- steps -----------------------------------------------------------------------------

    def _context(self, run: _Run, step: str) -> ExecutionContext:
        return ExecutionContext(
            tenant_id=run.tenant_id,
            root_execution_id=run.root,
            execution_id=run.execution,
            lease=run.lease,
            step=StepRef(run.execution, step, step),
        )

    async def _work(self, value: JsonValue) -> JsonValue:
        """A step's simulated work."""
        if self.config.step_ms:
            await self.clock.sleep(self.config.step_ms)
        return value

    async def _step(
        self,
        run: _Run,
        name: str,
        kind: StepKind,
        compute: Callable[[], Awaitable[JsonValue]],
        *,
        business: bool = False,
        business_key: str | None = None,
    ) -> JsonValue:
        """One durable step in a slot: a stored output replays (nothing runs again);
        else `compute()` runs and its output is stored under the step's key (with the
        business row `<execution>|<name>` when `business`), fenced by the run's lease."""
        effect = BUSINESS_EFFECT if business else STEP_EFFECT
        key = fenced_effect_key_of(self._context(run, name), effect, business_key=business_key)

        async def attempt() -> JsonValue:
            async with self.slots.step(kind, run.depth):
                run.keeper.guard()
                try:
                    stored = await self.effects.save_result_if_absent(key, _probe)
                except _NotStored:
                    pass
                else:
                    self.emit(
                        {"kind": "step", "execution": run.execution, "step": name, "replayed": True}
                    )
                    value = stored.value
                    return value.get("value") if isinstance(value, dict) else value
                started = self.clock.monotonic()
                output = await compute()
                ms = self.clock.monotonic() - started
                return await self._store_step(run, key, name, output, ms, business)

        try:
            return await self._retrying(run, f"{run.execution} {name}", attempt)
        finally:
            self._poke()

    async def _effect(self, run: _Run, name: str, *, business: bool, value: JsonValue) -> JsonValue:
        """A step with no simulated work (an undo)."""
        key = fenced_effect_key_of(
            self._context(run, name), BUSINESS_EFFECT if business else STEP_EFFECT
        )
        return await self._retrying(
            run,
            f"{run.execution} {name}",
            lambda: self._store_step(run, key, name, value, 0, business),
            guard=False,
        )

    async def _store_step(
        self, run: _Run, key: Any, name: str, output: JsonValue, ms: int, business: bool
    ) -> JsonValue:
        row = f"{run.execution}|{name}"
        stored_output = {"value": output, "ms": ms, "by": self.instance_id}

        async def work(tx: Any) -> JsonValue:
            if business:
                from agboss_sql.lab.business import insert_business_row

                await insert_business_row(tx, row)
            return stored_output

        try:
            result = await self.effects.save_result_if_absent(key, work)
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
                    "step": name,
                    "epoch": run.lease.lease_epoch,
                    "reason": refused.reason,
                }
            )
            raise
        self.emit(
            {
                "kind": "step",
                "execution": run.execution,
                "step": name,
                "replayed": result.replayed,
                "ms": ms,
                "epoch": run.lease.lease_epoch,
            }
        )
        value = result.value
        return value.get("value") if isinstance(value, dict) else value

    async def _retrying(
        self,
        run: _Run,
        what: str,
        call: Callable[[], Awaitable[Any]],
        *,
        guard: bool = True,
    ) -> Any:
        """Run a store call again after a store outage while the lease is trusted, for up
        to one lease: past that this instance hands the execution over
        (`StoreGaveUpError`, a lease loss: the lease is released or runs out, and another
        instance, perhaps with a working connection, runs it on)."""
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
                if now - first_failure >= self.config.lease_ms:
                    raise StoreGaveUpError(
                        f"{what} failed for {now - first_failure} ms on this instance "
                        f"(last: {error}); handing {run.execution} over"
                    ) from error
                self.emit({"kind": "retry", "what": what, "error": repr(error)[:200]})
                await self.clock.sleep(self.config.poll_every_ms)

    # -- children ----------------------------------------------------------------------------

    async def _child_pump(self) -> None:
        """Claim queued children while a slot is free and fewer child runs are at work than
        there are slots (a child waiting for its own children has no run: it yielded)."""
        assert self._children is not None
        while True:
            claimed = None
            try:
                at_work = self._active_children + len(self._pending_children)
                if self.slots.free > 0 and at_work < self.slots.max_steps:
                    claimed, task = await self._children.start_once()
                    if claimed is not None and task is not None:
                        child_id = claimed.child_execution_id
                        self._pending_children.add(child_id)
                        task.add_done_callback(functools.partial(self._child_done, child_id))
            except Exception:
                logger.warning("the child pump failed a pass", exc_info=True)
            if claimed is None:
                await self._nap(self.config.poll_every_ms)

    def _child_done(self, child_id: str, _task: asyncio.Task[None]) -> None:
        self._pending_children.discard(child_id)
        self._poke()

    async def _child_rescue(self) -> None:
        """Every sweep period: rescue running children whose lease ran out (as many as
        there are free slots), and wake the parents whose wake was lost."""
        assert self._children is not None
        while True:
            await self.clock.sleep(self.config.sweep_every_ms)
            try:
                free = self.slots.free
                if free > 0:
                    # Read past the live ones: the orphans may be behind them.
                    await self._children.rescue_once(max(free, 100), spawn=True, max_runs=free)
                await self._children.wake_once()
            except Exception:
                logger.warning("the child rescue failed a pass", exc_info=True)

    async def _run_child(self, child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
        keeper = current_keeper()
        assert keeper is not None
        self._keepers.add(keeper)
        self._pending_children.discard(child.child_execution_id)
        self._active_children += 1
        payload = child.payload if isinstance(child.payload, dict) else {}
        spec = TreeSpec.from_json(payload.get("spec"))
        run = _Run(
            child.tenant_id,
            child.root_execution_id,
            child.child_execution_id,
            child.depth,
            keeper,
            spec,
        )
        self.emit(
            {
                "kind": "child-run",
                "child": child.child_execution_id,
                "attempt": child.attempt,
                "epoch": lease.lease_epoch,
            }
        )
        try:
            if child.depth < spec.depth:
                await self._step(run, "split", StepKind.DEEPER, lambda: self._work(None))
                grandchildren = children_of(run.execution, spec.fan_out)
                await self._enqueue(run, grandchildren)
                if await self._child_yields(run, child):
                    raise ChildYielded(child.child_execution_id)
                await self._step(
                    run, "merge", StepKind.CLOSE_BRANCH, lambda: self._work({"merged": True})
                )
                return {"merged": run.execution}
            await self._step(run, "think", StepKind.DEEPER, lambda: self._work({"ok": True}))

            async def charge() -> JsonValue:
                if await self._cancel_requested(run):
                    raise ExecutionCancelledError(f"tree {run.root} was cancelled")
                return await self._work({"order": order_key(run.execution), "cents": 4200})

            await self._step(
                run,
                "charge",
                StepKind.DEEPER,
                charge,
                business=True,
                business_key=order_key(run.execution),
            )
            await self._retrying(run, f"notify {run.execution}", lambda: self._notify(run))
            return {"charged": order_key(run.execution)}
        finally:
            self._active_children -= 1
            self._poke()

    async def _child_yields(self, run: _Run, child: ClaimedChild) -> bool:
        """A child waiting for its own children, as a root does: its queue entry moves
        `running -> waiting` (neither claimed nor rescued while its children run), then its
        lease is yielded and the run ends (its slot free). True when it waits; False when
        every one of its children finished already (it goes on)."""
        run.keeper.guard()
        waited = await self._retrying(
            run,
            f"the wait of {run.execution}",
            lambda: self.queue.wait_for_children(run.execution, attempt=child.attempt),
        )
        if waited is None:
            raise ExecutionLeaseLostError(
                f"child {run.execution} is no longer run by attempt {child.attempt}"
            )
        if not waited.waiting:
            return False
        # If the yield is refused the lease is lost: it runs out, and whoever claims the
        # woken child takes it then (the rescue, if the claim came too early).
        if await run.keeper.yield_():
            self.emit(
                {
                    "kind": "yielded",
                    "tree": run.execution,
                    "epoch": run.lease.lease_epoch,
                    "waiting_for": waited.remaining,
                }
            )
        return True

    async def _notify(self, run: _Run) -> None:
        """The leaf's outbound call: recorded, claimed, sent once per attempt, completed."""
        key = fenced_effect_key_of(self._context(run, "notify"), "notify")

        async def send(attempt: int) -> JsonValue:
            run.keeper.guard()
            self.emit(
                {
                    "kind": "sent",
                    "call": f"{run.execution}|notify",
                    "attempt": attempt,
                    "epoch": run.lease.lease_epoch,
                }
            )
            return {"ok": True}

        await outbound_call(
            self.outbound, key, {"order": order_key(run.execution)}, self.clock.now(), send
        )

    # -- pauses ----------------------------------------------------------------------------

    async def _resolver(self) -> None:
        """Answer the pauses of trees paused on other instances (or on this one, once a
        pause has waited a whole lease with nobody answering), and finish the resumes
        whose resolver died between the two phases."""
        while True:
            await self.clock.sleep(self.config.sweep_every_ms)
            try:
                for record in await self.records.find_by_status(ExecutionRecordStatus.PAUSED, 100):
                    await self._answer(record)
            except Exception:
                logger.warning("the pause resolver failed a pass", exc_info=True)

    async def _answer(self, record: ExecutionRecord) -> None:
        tenant_id, tree_id = record.tenant_id, record.execution_id
        pause = await self.pauses.get(tenant_id, pause_id_of(tree_id))
        if pause is None:
            return
        now = self.clock.now()
        if pause.status is PauseStatus.PENDING:
            by = pause.request.get("by") if isinstance(pause.request, dict) else None
            if by == self.instance_id and now - pause.created_at < self.config.lease_ms:
                return
            try:
                await self.resume(tenant_id, tree_id, {"approved": True, "by": self.instance_id})
            except NotPausedError:
                self.emit({"kind": "resume-refused", "tree": tree_id})
        elif pause.status is PauseStatus.RESOLVED and (
            pause.resolved_at is None or now - pause.resolved_at > self.config.lease_ms
        ):
            await self._after_resolve(tenant_id, tree_id)

    # -- status ----------------------------------------------------------------------------

    async def _status(self) -> None:
        while True:
            self._keepers = {k for k in self._keepers if k.held or k.lease is None}
            self.emit(
                {
                    "kind": "status",
                    "busy": self.slots.busy,
                    "max": self.slots.max_steps,
                    "waiting": self.slots.waiting,
                    "trees": len(self._roots),
                    "children": self._active_children,
                    "leases": sum(1 for k in self._keepers if k.held),
                }
            )
            await self.clock.sleep(self.config.status_ms)


def pause_id_of(tree_id: str) -> str:
    """The pause id of a tree's approval."""
    return f"{tree_id}.approval"


def order_key(leaf: str) -> str:
    """The business key of the order a leaf charges."""
    return f"order:{leaf}"


def end_decision(value: JsonValue | None) -> str | None:
    """The decision stored under `END_DECISION_KEY` (`"cancel"`, `"close"`), or `None`."""
    return str(value.get("decision")) if isinstance(value, dict) else None


async def submit_tree(
    tree: ExecutionTreeRepository,
    records: ExecutionRecordRepository,
    leases: ExecutionLeaseRepository,
    tenant_id: str,
    tree_id: str,
    spec: TreeSpec,
    clock: Clock,
) -> None:
    """Record a new tree: its spec, its execution id, then its `running` record (a sweep
    anywhere runs it from there). Idempotent."""
    await tree.save_if_absent(tenant_id, tree_id, SPEC_KEY, spec.to_json())
    await leases.save_execution_id_if_absent(tenant_id, tree_id)
    now = clock.now()
    with contextlib.suppress(DuplicateExecutionError):
        await records.save(
            ExecutionRecord(
                tenant_id=tenant_id,
                execution_id=tree_id,
                root_execution_id=tree_id,
                parent_execution_id=None,
                thread_id=None,
                workflow="cluster-tree",
                owner=None,
                status=ExecutionRecordStatus.RUNNING,
                created_at=now,
                updated_at=now,
            )
        )


# -- the process -------------------------------------------------------------------------


def _print_event(instance_id: str) -> Emit:
    def emit(event: dict[str, Any]) -> None:
        line = json.dumps(
            {"t": time.time_ns() // 1_000_000, "pod": instance_id, **event}, default=str
        )
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass

    return emit


async def _commands(worker: Worker, stop: asyncio.Event) -> None:
    """JSON line commands on standard input: `start`, `cancel`, `resume`, `stop`. Standard
    input closing (the cluster is gone) stops the worker."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            stop.set()
            return
        try:
            command = json.loads(line)
            kind, tenant_id, tree_id = command["cmd"], command.get("tenant"), command.get("tree")
            if kind == "start":
                worker._spawn(worker.start_tree(tenant_id, tree_id, StepKind.ROOT))
            elif kind == "cancel":
                worker._spawn(_retried(worker, "cancel", worker.cancel, tenant_id, tree_id))
            elif kind == "resume":

                async def resume(t: str = tenant_id, r: str = tree_id) -> None:
                    try:
                        await worker.resume(t, r, {"approved": True, "by": worker.instance_id})
                    except NotPausedError:
                        worker.emit({"kind": "resume-refused", "tree": r})

                worker._spawn(resume())
            elif kind == "stop":
                stop.set()
            else:
                worker.emit({"kind": "bad-command", "command": command})
        except Exception as error:
            worker.emit({"kind": "bad-command", "error": repr(error)})


async def _retried(
    worker: Worker, what: str, call: Callable[[str, str], Awaitable[object]], tenant: str, tree: str
) -> None:
    """A command's call, tried again after a store outage for up to three leases; a failure
    that persists is reported as a `command-failed` event."""
    deadline = worker.clock.monotonic() + 3 * worker.config.lease_ms
    while True:
        try:
            await call(tenant, tree)
            return
        except StoreUnavailableError as error:
            if worker.clock.monotonic() >= deadline:
                worker.emit(
                    {"kind": "command-failed", "cmd": what, "tree": tree, "error": repr(error)}
                )
                return
            await worker.clock.sleep(worker.config.poll_every_ms)


async def run_worker(config: WorkerConfig, *, commands: bool = True) -> int:
    """Run a worker process until SIGTERM/SIGINT (or standard input closes); its exit
    status (3 when the graceful stop overran `shutdown_ms`)."""
    worker = Worker(config)
    worker.emit = _print_event(worker.instance_id)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    helpers = [loop.create_task(_commands(worker, stop))] if commands else []
    await stop.wait()
    for helper in helpers:
        helper.cancel()
    try:
        await worker.stop()
    except TimeoutError:
        return 3
    return 0


def config_json(config: WorkerConfig) -> dict[str, Any]:
    """The config as JSON (what the cluster writes for each worker)."""
    return asdict(config)


__all__ = [
    "BUSINESS_EFFECT",
    "HANDOVER",
    "END_DECISION_KEY",
    "SPEC_KEY",
    "STEP_EFFECT",
    "StoreGaveUpError",
    "TreeSpec",
    "Worker",
    "WorkerConfig",
    "children_of",
    "descendants_of",
    "end_decision",
    "leaves_of",
    "order_key",
    "pause_id_of",
    "run_worker",
    "submit_tree",
]
