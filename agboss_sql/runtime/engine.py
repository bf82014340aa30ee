"""`Engine`: runs a `Workflows` app on the shared stores, and starts, resumes, cancels and
reads its runs from any instance.

    async with Engine(app, url="postgresql://…/shop") as engine:
        handle = await engine.start("order", {"id": "o-1", "cents": 4200}, id="o-1")
        print(await handle.result(timeout_s=60))

Every instance that runs an `Engine` (with `work=True`, the default) also:

- takes over runs whose holder died or let go (the `RecoverySweep`, every third of a
  lease), and resumes each from its stored steps;
- claims children queued by any instance while a step slot is free (`ChildWorker`), and
  rescues children whose runner died;
- wakes a parent when the last of its children finished, and finishes resumes whose
  resolver died between answering a pause and taking the run's lease.

At most `max_concurrent_steps` steps run at once per instance. A run of a workflow this
instance's app does not know is left to an instance whose app does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import weakref
from collections import Counter
from typing import Any

from agboss_sql.application import Application, DatabaseUrl
from agboss_sql.contracts.clocks import Clock, SystemClock
from agboss_sql.contracts.errors import (
    DuplicateExecutionError,
    NotPausedError,
)
from agboss_sql.contracts.keys import checked_identifier
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
    ExecutionLease,
    ExecutionRecord,
    ExecutionRecordStatus,
    JsonValue,
    PauseStatus,
)
from agboss_sql.runtime._execution import Executor
from agboss_sql.runtime._run import (
    END_DECISION_KEY,
    INPUT_KEY,
    PAUSE_PREFIX,
    REGISTRY_ROOT,
    REGISTRY_TENANT,
)
from agboss_sql.runtime._runs import Runs
from agboss_sql.runtime.children import (
    ChildWorker,
    FinishReporting,
    cancel_and_wait,
    flush_bounded,
    release_bounded,
)
from agboss_sql.runtime.errors import (
    AmbiguousPauseError,
    UnknownWorkflowError,
    UnknownWorkflowRunError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowIdConflictError,
    WorkflowTimeoutError,
)
from agboss_sql.runtime.handle import WorkflowHandle
from agboss_sql.runtime.keeper import LeaseKeeper
from agboss_sql.runtime.slots import DEFAULT_AGING_MS, StepKind, StepSlots
from agboss_sql.runtime.sweep import RecoverySweep
from agboss_sql.runtime.workflows import (
    PauseInfo,
    Workflows,
    WorkflowState,
    WorkflowStatus,
    checked_json,
    checked_name,
)

logger = logging.getLogger("agboss_sql.runtime")

DEFAULT_TENANT = "default"


def _positive(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive int, got {value!r}")


class Engine(Runs):
    """One instance of a workflow application (see the module). `open()` then `close()`,
    or `async with Engine(app, url=URL) as engine:`.

    - `workflows`: the app whose workflows this instance runs.
    - `url` (or `application`, an `Application` over the SQL stores you assembled): the
      database every instance shares. Neither: a SQLite file under `.agboss/`.
    - `work=False` makes a client: it starts, resumes, cancels and reads runs, and runs
      nothing itself.
    - `lease_ms` (30 s): how long a run's lease lasts unrenewed; a dead instance's runs are
      taken over within about a lease. `max_concurrent_steps` (8): steps at once here.
    """

    def __init__(
        self,
        workflows: Workflows,
        *,
        url: str | None = None,
        application: Application | None = None,
        instance_id: str | None = None,
        work: bool = True,
        lease_ms: int = 30_000,
        max_concurrent_steps: int = 8,
        sweep_ms: int | None = None,
        poll_ms: int | None = None,
        shutdown_ms: int = 10_000,
        aging_ms: int = DEFAULT_AGING_MS,
        clock: Clock | None = None,
        on_event: Any = None,
    ) -> None:
        if not isinstance(workflows, Workflows):
            raise TypeError(f"Engine runs a Workflows app, got {type(workflows).__name__}")
        for what, value in (
            ("lease_ms", lease_ms),
            ("max_concurrent_steps", max_concurrent_steps),
            ("shutdown_ms", shutdown_ms),
            ("aging_ms", aging_ms),
        ):
            _positive(what, value)
        for what, maybe in (("sweep_ms", sweep_ms), ("poll_ms", poll_ms)):
            if maybe is not None:
                _positive(what, maybe)
        self.workflows = workflows
        self.url = url
        self.app = application
        self.instance_id = (
            application.instance_id
            if application is not None
            else instance_id or f"engine-{uuid.uuid4().hex[:8]}"
        )
        self.work = work
        self.lease_ms = lease_ms
        self.sweep_ms = sweep_ms if sweep_ms is not None else max(1, lease_ms // 3)
        self.poll_ms = poll_ms if poll_ms is not None else max(10, lease_ms // 15)
        self.shutdown_ms = shutdown_ms
        self.trust_margin_ms = min(1_000, lease_ms // 3)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.slots = StepSlots(max_concurrent_steps, self.clock, aging_ms=aging_ms)
        self.emit = on_event if on_event is not None else (lambda _event: None)
        self._executor: Executor | None = None
        self._sweep: RecoverySweep | None = None
        self._children: ChildWorker | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._keepers: set[LeaseKeeper] = set()
        self._made: weakref.WeakSet[LeaseKeeper] = weakref.WeakSet()
        self._known: set[str] = set()
        self._ended: dict[tuple[str, str], asyncio.Event] = {}
        self._result_waiters: Counter[tuple[str, str]] = Counter()
        self._changed: asyncio.Event | None = None
        self._active_children = 0
        self._pending_children: set[str] = set()
        self._stopping = False
        self._pump_starved = False
        self._opened = False
        self._owns_app = application is None

    # -- stores --------------------------------------------------------------------------

    def _store(self, contract: type[Any]) -> Any:
        if self.app is None or not self._opened:
            raise RuntimeError("open the engine first (`await engine.open()` or `async with`)")
        return self.app.store(contract)

    @property
    def records(self) -> ExecutionRecordRepository:
        return self._store(ExecutionRecordRepository)  # type: ignore[no-any-return]

    @property
    def tree(self) -> ExecutionTreeRepository:
        return self._store(ExecutionTreeRepository)  # type: ignore[no-any-return]

    @property
    def pauses(self) -> PausedExecutionRepository:
        return self._store(PausedExecutionRepository)  # type: ignore[no-any-return]

    @property
    def queue(self) -> ChildExecutionQueueRepository:
        return self._store(ChildExecutionQueueRepository)  # type: ignore[no-any-return]

    @property
    def leases(self) -> ExecutionLeaseRepository:
        return self._store(ExecutionLeaseRepository)  # type: ignore[no-any-return]

    @property
    def events(self) -> ExecutionLeaseEventRepository:
        return self._store(ExecutionLeaseEventRepository)  # type: ignore[no-any-return]

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            raise RuntimeError("open the engine first (`await engine.open()` or `async with`)")
        return self._executor

    # -- life ----------------------------------------------------------------------------

    async def open(self, *, background: bool = True) -> None:
        """Assemble the stores, register this app's workflow names, and (with `work`) start
        the sweep, the child pump and rescue, and the resume finisher. `background=False`
        starts none of the loops (tests drive them one pass at a time)."""
        from agboss_sql.sql import sql_stores

        if self.app is None:
            values: dict[Any, Any] = {DatabaseUrl: DatabaseUrl(self.url)} if self.url else {}
            self.app = Application(
                "agboss-engine", sql_stores(), values, instance_id=self.instance_id
            )
        await self.app.start()
        self._opened = True
        self._changed = asyncio.Event()
        self._executor = Executor(
            workflows=self.workflows,
            instance_id=self.instance_id,
            clock=self.clock,
            slots=self.slots,
            records=self.records,
            tree=self.tree,
            queue=self.queue,
            pauses=self.pauses,
            effects=self._store(FencedEffectRepository),
            outbound_calls=self._store(OutboundCallRepository),
            events=self.events,
            lease_ms=self.lease_ms,
            poll_ms=self.poll_ms,
            emit=self.emit,
            after_resolve=self._after_resolve,
            queued=self._poke,
        )
        if not self.work:
            return
        await self._register()
        self._sweep = RecoverySweep(
            self.records,
            self.leases,
            self.events,
            self.pauses,
            self.clock,
            resume=self._resume_claimed,
            free_slots=lambda: self.slots.free,
            lease_ms=self.lease_ms,
            every_ms=self.sweep_ms,
            accepts=lambda record: record.workflow in self.workflows,
        )
        self._children = ChildWorker(
            FinishReporting(self.queue, self.emit),  # type: ignore[arg-type]
            self.leases,
            self.events,
            self.clock,
            run_child=self._run_child,
            wake_parent=self._wake_parent,
            lease_ms=self.lease_ms,
            tree=self.tree,
            instance_id=self.instance_id,
            trust_margin_ms=self.trust_margin_ms,
            wake_claim_ms=max(self.lease_ms, 1_000),
            accepts=self._accepts_child,
        )
        if background:
            self._sweep.start()
            self._spawn(self._child_pump())
            self._spawn(self._housekeeping())
        self.emit(
            {"kind": "ready", "instance": self.instance_id, "workflows": self.workflows.names}
        )

    async def close(self) -> None:
        """Stop within `shutdown_ms`: start nothing new, cancel every run here and release
        each lease still held, so another instance takes those runs on at once."""
        if not self._opened:
            return
        self._stopping = True
        bound_s = self.shutdown_ms / 1000
        try:
            async with asyncio.timeout(bound_s):
                if self._sweep is not None:
                    await self._sweep.stop()
                await cancel_and_wait(list(self._tasks), 0.3 * bound_s)
                if self._children is not None:
                    await self._children.stop(release=True, timeout_s=0.3 * bound_s)
                keepers = [keeper for keeper in self._keepers if keeper.held]
                await asyncio.gather(*(release_bounded(k) for k in keepers))
                await flush_bounded(list(self._made))
        finally:
            self._opened = False
            if self.app is not None and self._owns_app:
                await self.app.close()
            self.emit({"kind": "stopped"})

    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # -- the client API ------------------------------------------------------------------

    async def start(
        self,
        workflow: str,
        input: JsonValue = None,
        *,
        id: str | None = None,
        tenant_id: str = DEFAULT_TENANT,
    ) -> WorkflowHandle:
        """Start a run of `workflow` with `input` (JSON) under `id` (default: a new uuid),
        durably: once this returns, some instance runs it even if this one dies. Idempotent
        on the id: the same call again answers the same run; another workflow or input
        under that id is `WorkflowIdConflictError`. A name no worker's app registered is
        `UnknownWorkflowError`. Runs here at once when this engine works and knows it."""
        checked_name("a workflow name", workflow)
        checked_json(f"the input of workflow {workflow!r}", input)
        workflow_id = checked_identifier("id", id if id is not None else uuid.uuid4().hex)
        checked_identifier("tenant_id", tenant_id)
        if workflow not in self.workflows and not await self._someone_knows(workflow):
            raise UnknownWorkflowError(
                f"no worker has registered workflow {workflow!r} (this app has "
                f"{self.workflows.names}): register it in the app your workers load, or fix "
                "the name"
            )
        stored = {"workflow": workflow, "input": input}
        if not await self.tree.save_if_absent(tenant_id, workflow_id, INPUT_KEY, stored):
            found = await self.tree.get(tenant_id, workflow_id, INPUT_KEY)
            if found != stored:
                raise WorkflowIdConflictError(
                    f"run {workflow_id!r} was started with another workflow or input "
                    f"({str(found)[:200]}): start the new run under a new id",
                    workflow_id=workflow_id,
                )
        now = self.clock.now()
        record = ExecutionRecord(
            tenant_id=tenant_id,
            execution_id=workflow_id,
            root_execution_id=workflow_id,
            parent_execution_id=None,
            thread_id=None,
            workflow=workflow,
            owner=self.instance_id,
            status=ExecutionRecordStatus.RUNNING,
            created_at=now,
            updated_at=now,
        )
        try:
            await self.records.save(record)
        except DuplicateExecutionError:
            return WorkflowHandle(self, tenant_id, workflow_id)
        self.emit({"kind": "started", "tree": workflow_id, "workflow": workflow})
        if self.work and workflow in self.workflows and not self._stopping:
            await self._start_root(tenant_id, workflow_id, StepKind.ROOT, started=stored)
        return WorkflowHandle(self, tenant_id, workflow_id)

    def handle(self, workflow_id: str, *, tenant_id: str = DEFAULT_TENANT) -> WorkflowHandle:
        """A handle on a run started anywhere."""
        return WorkflowHandle(self, tenant_id, workflow_id)

    async def _someone_knows(self, workflow: str) -> bool:
        if workflow in self._known:
            return True
        if await self.tree.get(REGISTRY_TENANT, REGISTRY_ROOT, workflow) is None:
            return False
        self._known.add(workflow)
        return True

    async def status(self, workflow_id: str, *, tenant_id: str = DEFAULT_TENANT) -> WorkflowStatus:
        """The run as the database holds it now; `UnknownWorkflowRunError` for no such run."""
        record = await self.records.get(tenant_id, workflow_id)
        if record is None:
            raise UnknownWorkflowRunError(
                f"no run {workflow_id!r} in tenant {tenant_id!r}", workflow_id=workflow_id
            )
        stored = await self.tree.get(tenant_id, workflow_id, INPUT_KEY)
        pauses: list[PauseInfo] = []
        for value in (await self.tree.list(tenant_id, workflow_id, PAUSE_PREFIX)).values():
            if not isinstance(value, dict):
                continue
            pause = await self.pauses.get(tenant_id, str(value.get("pause_id")))
            if pause is not None:
                pauses.append(
                    PauseInfo(
                        str(value.get("name")), pause.request, pause.status.value, pause.decision
                    )
                )
        outcome = record.outcome if isinstance(record.outcome, dict) else {}
        state = WorkflowState(record.status.value)
        return WorkflowStatus(
            tenant_id=tenant_id,
            workflow_id=workflow_id,
            workflow=record.workflow,
            state=state,
            input=stored.get("input") if isinstance(stored, dict) else None,
            result=outcome.get("result") if state is WorkflowState.SUCCEEDED else None,
            error=outcome.get("error", outcome)
            if state.ended and state is not WorkflowState.SUCCEEDED
            else None,
            pauses=tuple(pauses),
            created_at=record.created_at,
            updated_at=record.updated_at,
        )

    async def result(
        self,
        workflow_id: str,
        *,
        tenant_id: str = DEFAULT_TENANT,
        timeout_s: float | None = None,
    ) -> JsonValue:
        """Wait for the run to end and answer its result: `WorkflowFailedError` when it
        failed, `WorkflowCancelledError` when it was cancelled, `WorkflowTimeoutError` past
        `timeout_s` (the run goes on). Reads the record every `poll_ms`, and at once when the
        run ends on this instance."""
        started = time.monotonic()
        key = (tenant_id, workflow_id)
        ended = self._ended.setdefault(key, asyncio.Event())
        self._result_waiters[key] += 1
        try:
            while True:
                record = await self.records.get(tenant_id, workflow_id)
                if record is None:
                    raise UnknownWorkflowRunError(
                        f"no run {workflow_id!r} in tenant {tenant_id!r}", workflow_id=workflow_id
                    )
                outcome = record.outcome if isinstance(record.outcome, dict) else {}
                if record.status is ExecutionRecordStatus.SUCCEEDED:
                    return outcome.get("result")
                if record.status is ExecutionRecordStatus.FAILED:
                    error = outcome.get("error", outcome)
                    raise WorkflowFailedError(f"run {workflow_id!r} failed: {error}", error=error)
                if record.status is ExecutionRecordStatus.CANCELLED:
                    raise WorkflowCancelledError(f"run {workflow_id!r} was cancelled")
                waited = time.monotonic() - started
                if timeout_s is not None and waited >= timeout_s:
                    raise WorkflowTimeoutError(
                        f"run {workflow_id!r} is still {record.status.value} after {timeout_s} s"
                    )
                nap = self.poll_ms / 1000
                if timeout_s is not None:
                    nap = min(nap, timeout_s - waited)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), nap)
        finally:
            self._result_waiters[key] -= 1
            if self._result_waiters[key] <= 0:
                # The last caller waiting on this run: forget it (a run that ended elsewhere
                # never sets the event, and would leave it behind).
                del self._result_waiters[key]
                self._ended.pop(key, None)

    async def resume(
        self,
        workflow_id: str,
        decision: JsonValue = None,
        *,
        pause: str | None = None,
        tenant_id: str = DEFAULT_TENANT,
    ) -> None:
        """Answer the run's pending pause (`pause=` its name when several wait) with
        `decision` (JSON), from any instance: two-phase — the pause is resolved (a second
        answer, here or anywhere, is `NotPausedError`), then the run is made runnable and
        its lease taken here, or by any worker's sweep."""
        checked_json("a decision", decision)
        named = await self.tree.list(tenant_id, workflow_id, PAUSE_PREFIX)
        candidates: list[str] = []
        for value in named.values():
            if not isinstance(value, dict):
                continue
            if pause is not None and value.get("name") != pause:
                continue
            found = await self.pauses.get(tenant_id, str(value.get("pause_id")))
            if found is not None and found.status is PauseStatus.PENDING:
                candidates.append(found.pause_id)
        if not candidates:
            raise NotPausedError(
                f"run {workflow_id!r} has no pending pause"
                + (f" named {pause!r}" if pause is not None else "")
                + ": it was answered already, or has not paused yet"
            )
        if len(candidates) > 1:
            raise AmbiguousPauseError(
                f"run {workflow_id!r} waits on {len(candidates)} pauses: name one with pause="
            )
        resolved = await self.pauses.resolve(tenant_id, candidates[0], decision)
        self.emit(
            {
                "kind": "resolved",
                "tree": workflow_id,
                "pause": resolved.pause_id,
                "decision": resolved.decision,
            }
        )
        await self._after_resolve(tenant_id, workflow_id)

    async def _after_resolve(self, tenant_id: str, workflow_id: str) -> None:
        if not await self.records.transition(
            tenant_id, workflow_id, ExecutionRecordStatus.PAUSED, ExecutionRecordStatus.RUNNING
        ):
            return  # still running (its runner sees the decision), or moved by another
        record = await self.records.get(tenant_id, workflow_id)
        if not self.work or record is None or record.workflow not in self.workflows:
            return  # a worker that knows it takes it at its next sweep
        for _ in range(3):
            if self._stopping or await self._start_root(tenant_id, workflow_id, StepKind.DEEPER):
                return
            # The pausing run may not have released the lease yet; past these tries the
            # record is running with a free lease, which a sweep runs.
            await self.clock.sleep(self.poll_ms)

    async def cancel(self, workflow_id: str, *, tenant_id: str = DEFAULT_TENANT) -> bool:
        """Cancel the run from any instance, wherever it runs. True when it will end
        cancelled — its children stop, and every finished step with an undo is undone, last
        first, once; False when it had already decided to close (too late: it ends
        succeeded). Calling it again is harmless."""
        decision = {"decision": "cancel", "by": self.instance_id, "at": self.clock.now()}
        if not await self.tree.save_if_absent(tenant_id, workflow_id, END_DECISION_KEY, decision):
            found = await self.tree.get(tenant_id, workflow_id, END_DECISION_KEY)
            if not isinstance(found, dict) or found.get("decision") != "cancel":
                self.emit({"kind": "cancel-too-late", "tree": workflow_id})
                return False
        await self.tree.save_if_absent(
            tenant_id,
            workflow_id,
            CANCEL_REQUEST_KEY,
            {"by": self.instance_id, "at": self.clock.now()},
        )
        self.emit({"kind": "cancel-requested", "tree": workflow_id})
        record = await self.records.get(tenant_id, workflow_id)
        if record is not None and record.status is ExecutionRecordStatus.PAUSED:
            for value in (await self.tree.list(tenant_id, workflow_id, PAUSE_PREFIX)).values():
                if isinstance(value, dict):
                    await self.pauses.cancel(tenant_id, str(value.get("pause_id")))
            await self.records.transition(
                tenant_id, workflow_id, ExecutionRecordStatus.PAUSED, ExecutionRecordStatus.RUNNING
            )
        return True

    def snapshot(self) -> dict[str, int]:
        """What this instance is doing now: steps running and waiting for a slot, the slots,
        leases held, children running here."""
        return {
            "busy": self.slots.busy,
            "max": self.slots.max_steps,
            "waiting": self.slots.waiting,
            "leases": sum(1 for keeper in self._keepers if keeper.held),
            "children": self._active_children,
        }

    # -- passes, for tests and tools -----------------------------------------------------

    async def sweep_once(self) -> list[ExecutionLease]:
        """One recovery pass now (the background sweep does this every `sweep_ms`)."""
        assert self._sweep is not None, "open a working engine first"
        return await self._sweep.run_once()


__all__ = ["DEFAULT_TENANT", "Engine", "WorkflowHandle"]
