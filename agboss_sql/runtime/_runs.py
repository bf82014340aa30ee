"""How an `Engine` runs executions here: a root under its lease, a child claimed from the
queue, the wake of a parent, and the passes that pick up what another instance left."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any

from agboss_sql.contracts.errors import (
    ExecutionCancelledError,
    ExecutionLeaseLostError,
    StoreUnavailableError,
)
from agboss_sql.contracts.types import (
    ChildExecution,
    ClaimedChild,
    ExecutionLease,
    ExecutionRecord,
    ExecutionRecordStatus,
    JsonValue,
    PauseStatus,
)
from agboss_sql.runtime._collect import unwind
from agboss_sql.runtime._run import (
    HANDOVER,
    INPUT_KEY,
    PAUSE_PREFIX,
    REGISTRY_ROOT,
    REGISTRY_TENANT,
    Run,
    Suspended,
)
from agboss_sql.runtime.children import ChildYielded, error_outcome
from agboss_sql.runtime.context import WorkflowContext
from agboss_sql.runtime.keeper import LeaseKeeper, current_keeper
from agboss_sql.runtime.slots import StepKind
from agboss_sql.runtime.workflows import checked_json

if TYPE_CHECKING:
    import weakref
    from collections.abc import Callable, Coroutine

    from agboss_sql.contracts.clocks import Clock
    from agboss_sql.contracts.stores import (
        ExecutionLeaseEventRepository,
        ExecutionLeaseRepository,
        ExecutionRecordRepository,
        ExecutionTreeRepository,
        PausedExecutionRepository,
    )
    from agboss_sql.runtime._execution import Executor
    from agboss_sql.runtime.children import ChildWorker
    from agboss_sql.runtime.slots import StepSlots
    from agboss_sql.runtime.workflows import Workflows

logger = logging.getLogger("agboss_sql.runtime")


class Runs:
    """The part of `Engine` that runs executions (its methods run on the engine)."""

    if TYPE_CHECKING:
        # What these methods use of the engine (engine.py sets them).
        workflows: Workflows
        clock: Clock
        slots: StepSlots
        emit: Callable[[dict[str, Any]], None]
        lease_ms: int
        poll_ms: int
        sweep_ms: int
        trust_margin_ms: int
        _keepers: set[LeaseKeeper]
        _made: weakref.WeakSet[LeaseKeeper]
        _ended: dict[tuple[str, str], asyncio.Event]
        _children: ChildWorker | None
        _active_children: int
        _pending_children: set[str]
        _stopping: bool
        _pump_starved: bool
        _tasks: set[asyncio.Task[Any]]
        _changed: asyncio.Event | None
        _known: set[str]
        instance_id: str

        @property
        def executor(self) -> Executor: ...
        @property
        def records(self) -> ExecutionRecordRepository: ...
        @property
        def tree(self) -> ExecutionTreeRepository: ...
        @property
        def pauses(self) -> PausedExecutionRepository: ...
        @property
        def leases(self) -> ExecutionLeaseRepository: ...
        @property
        def events(self) -> ExecutionLeaseEventRepository: ...
        async def _after_resolve(self, tenant_id: str, workflow_id: str) -> None: ...

    # -- running roots -------------------------------------------------------------------

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _nap(self, ms: int) -> None:
        changed = self._changed
        if changed is None:
            await self.clock.sleep(ms)
            return
        changed.clear()
        loop = asyncio.get_running_loop()
        sleeper = loop.create_task(self.clock.sleep(ms))
        waiter = loop.create_task(changed.wait())
        try:
            await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiter.cancel()

    async def _register(self) -> None:
        """Write this app's workflow names where `start` anywhere looks them up; a store
        outage (another process opening the same SQLite file, a server restarting) is tried
        again for up to one lease."""
        began = self.clock.monotonic()
        for definition in self.workflows:
            while True:
                try:
                    await self.tree.save_if_absent(
                        REGISTRY_TENANT,
                        REGISTRY_ROOT,
                        definition.name,
                        {"first_by": self.instance_id, "at": self.clock.now()},
                    )
                    break
                except StoreUnavailableError:
                    if self.clock.monotonic() - began >= self.lease_ms:
                        raise
                    await self.clock.sleep(self.poll_ms)
            self._known.add(definition.name)

    def _keeper(self, root: str) -> LeaseKeeper:
        keeper = LeaseKeeper(
            self.leases,
            self.events,
            self.clock,
            lease_ms=self.lease_ms,
            tree=self.tree,
            root_execution_id=root,
            trust_margin_ms=self.trust_margin_ms,
        )
        self._made.add(keeper)
        return keeper

    async def _start_root(
        self,
        tenant_id: str,
        workflow_id: str,
        kind: StepKind,
        *,
        started: dict[str, JsonValue] | None = None,
    ) -> bool:
        """Take the run's lease and run it as a task here. False when its lease is held
        elsewhere (the holder runs it). `started`: the workflow and input this instance has
        just recorded (the run needs not read them back)."""
        keeper = self._keeper(workflow_id)
        self._keepers.add(keeper)
        try:
            lease = await keeper.take(tenant_id, workflow_id)
        finally:
            if not keeper.held:
                self._keepers.discard(keeper)
        if lease is None:
            return False
        self._spawn(self._run_root(tenant_id, workflow_id, keeper, started))
        return True

    async def _resume_claimed(self, record: ExecutionRecord, lease: ExecutionLease) -> None:
        """The sweep's resume: hold the lease it took and run the tree from its stored steps."""
        keeper = self._keeper(record.execution_id)
        self._keepers.add(keeper)
        if not await keeper.adopt(lease):
            raise ExecutionLeaseLostError(f"could not confirm the lease of {record.execution_id}")
        self.emit({"kind": "recovered", "tree": record.execution_id, "epoch": lease.lease_epoch})
        self._spawn(self._run_root(record.tenant_id, record.execution_id, keeper))

    async def _run_root(
        self,
        tenant_id: str,
        workflow_id: str,
        keeper: LeaseKeeper,
        started: dict[str, JsonValue] | None = None,
    ) -> None:
        executor = self.executor
        self._keepers.add(keeper)
        keeper.start()
        stored = (
            started
            if started is not None
            else await self.tree.get(tenant_id, workflow_id, INPUT_KEY)
        )
        name = stored.get("workflow") if isinstance(stored, dict) else None
        definition = self.workflows.get(name) if isinstance(name, str) else None
        if definition is None:
            # Not this app's workflow: let a worker whose app has it take the run now.
            await keeper.release()
            return
        assert isinstance(stored, dict)
        value = stored.get("input")
        run = Run(tenant_id, workflow_id, workflow_id, 0, keeper, definition.name)
        lease = keeper.lease
        assert lease is not None
        self.emit({"kind": "tree-run", "tree": workflow_id, "epoch": lease.lease_epoch})
        try:
            if started is None or not run.fresh:
                # A run recorded elsewhere, or earlier: read where it is. (A run this instance
                # has just recorded and taken at the first epoch is running; a cancel that
                # came meanwhile still wins the end decision at its close.)
                record = await executor.retrying(
                    run,
                    "read the record",
                    lambda: self.records.get(tenant_id, workflow_id),
                    guard=False,
                )
                if record is None or record.status is not ExecutionRecordStatus.RUNNING:
                    await keeper.release()  # paused, waiting or ended since: not this run's
                    return
                if await executor.cancel_requested(run):
                    raise ExecutionCancelledError(f"run {workflow_id} was cancelled")
            result = await executor.invoke(definition, WorkflowContext(executor, run), value)
            result = checked_json(f"the result of workflow {definition.name!r}", result)
            if not await executor.decide_close(run):
                raise ExecutionCancelledError(f"run {workflow_id} was cancelled")
            await self._end(run, ExecutionRecordStatus.SUCCEEDED, {"result": result})
        except Suspended:
            return
        except ExecutionCancelledError:
            await self._cancelled(run, definition, value)
        except HANDOVER as error:
            self.emit({"kind": "handover", "tree": workflow_id, "error": type(error).__name__})
            await keeper.stop()
        except asyncio.CancelledError:
            await keeper.stop()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await keeper.release()
            raise
        except Exception as error:
            task = asyncio.current_task()
            if self._stopping or (task is not None and task.cancelling()):
                await keeper.stop()
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2):
                        await keeper.release()
                return
            logger.info("run %s failed", workflow_id, exc_info=True)
            with contextlib.suppress(Exception):
                await self._end(run, ExecutionRecordStatus.FAILED, error_outcome(error))
        finally:
            if keeper.held and not self._stopping:
                with contextlib.suppress(Exception):
                    await keeper.release()
            if not keeper.held:
                self._keepers.discard(keeper)
            self._slot_freed()

    async def _cancelled(self, run: Run, definition: Any, value: JsonValue) -> None:
        try:
            undone = await unwind(self.executor, run, definition, value)
            # A pause the run saved as the cancel came is not left waiting.
            for named in (await self.tree.list(run.tenant_id, run.root, PAUSE_PREFIX)).values():
                if isinstance(named, dict):
                    await self.pauses.cancel(run.tenant_id, str(named.get("pause_id")))
            await self._end(
                run,
                ExecutionRecordStatus.CANCELLED,
                {
                    "error": {"code": "execution.cancelled", "message": "cancelled by request"},
                    "undone": undone,
                },
            )
        except HANDOVER as error:
            self.emit({"kind": "handover", "tree": run.root, "error": type(error).__name__})
            await run.keeper.stop()
        except Exception:
            # The undo could not go on here (a store outage, an undo that raised): the run
            # stays running with its lease released, and a sweep unwinds it again (each undo
            # already marked done is not run twice).
            logger.warning(
                "the undo of run %s stopped; it is left to a sweep", run.root, exc_info=True
            )
            await run.keeper.release()

    async def _end(self, run: Run, status: ExecutionRecordStatus, outcome: JsonValue) -> None:
        keeper = run.keeper
        keeper.check_lease()
        done = await self.executor.retrying(
            run,
            f"complete {run.root}",
            lambda: self.records.complete(
                run.tenant_id, run.root, ExecutionRecordStatus.RUNNING, status, outcome
            ),
            guard=False,
        )
        if done:
            # The lease is finished before a waiter hears of the end: a caller that closes
            # its engine on the result must not have the shutdown release a lease whose
            # finish is still under way (the store would refuse it: a false `lost`).
            try:
                await keeper.finish()
            finally:
                self.emit({"kind": "tree-end", "tree": run.root, "status": status.value})
                ended = self._ended.pop((run.tenant_id, run.root), None)
                if ended is not None:
                    ended.set()
        else:
            await keeper.release()

    # -- running children ----------------------------------------------------------------

    def _accepts_child(self, child: ChildExecution | ClaimedChild) -> bool:
        payload = child.payload if isinstance(child.payload, dict) else {}
        return payload.get("workflow") in self.workflows

    async def _run_child(self, child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
        executor = self.executor
        keeper = current_keeper()
        assert keeper is not None
        self._keepers.add(keeper)
        self._pending_children.discard(child.child_execution_id)
        payload = child.payload if isinstance(child.payload, dict) else {}
        definition = self.workflows.get(str(payload.get("workflow")))
        if definition is None:
            # Claimed by an instance whose app lacks it: the lease goes back at once and a
            # worker that knows the workflow rescues the child at its next pass.
            await keeper.release()
            raise ChildYielded(child.child_execution_id)
        self._active_children += 1
        run = Run(
            child.tenant_id,
            child.root_execution_id,
            child.child_execution_id,
            child.depth,
            keeper,
            definition.name,
            attempt=child.attempt,
        )
        self.emit(
            {"kind": "child-run", "child": child.child_execution_id, "attempt": child.attempt}
        )
        try:
            if await executor.cancel_requested(run):
                raise ExecutionCancelledError(f"tree {run.root} was cancelled")
            result = await executor.invoke(
                definition, WorkflowContext(executor, run), payload.get("input")
            )
            return {"result": checked_json(f"the result of workflow {definition.name!r}", result)}
        except Suspended:
            raise ChildYielded(child.child_execution_id) from None
        finally:
            self._active_children -= 1
            self._keepers.discard(keeper)  # the child worker finishes or releases it
            self._slot_freed()

    async def _wake_parent(self, tenant_id: str, parent_execution_id: str) -> None:
        """The last child's finisher wakes its parent: a waiting root's record goes back to
        `running` and its lease is taken here (a parent that is itself a child was made
        claimable by the finish, and the child pump claims it)."""
        moved = await self.records.transition(
            tenant_id,
            parent_execution_id,
            ExecutionRecordStatus.QUEUED,
            ExecutionRecordStatus.RUNNING,
        )
        self.emit({"kind": "woke", "tree": parent_execution_id, "moved": moved})
        self._poke()
        if moved and not self._stopping:
            record = await self.records.get(tenant_id, parent_execution_id)
            if record is not None and record.workflow in self.workflows:
                self._spawn(self._start_root(tenant_id, parent_execution_id, StepKind.CLOSE_BRANCH))

    async def _child_pump(self) -> None:
        """Claim queued children while a slot is free and fewer child runs are at work than
        there are slots (a child waiting for its own children has no run: it yielded)."""
        children = self._children
        assert children is not None
        # Told of children queued anywhere where the queue can tell (PostgreSQL); polled
        # adaptively besides: from poll_ms / 16 after a claim, doubling while none is queued.
        children.listen(self._poke)
        shortest = max(1, self.poll_ms // 16)
        nap = shortest
        while True:
            started: list[Any] = []
            try:
                at_work = self._active_children + len(self._pending_children)
                room = min(self.slots.free, self.slots.max_steps - at_work)
                self._pump_starved = room <= 0
                if not self._pump_starved:
                    # As many as there are free slots, in one claim.
                    started = await children.start_many(room)
                    for claimed, task in started:
                        if task is not None:
                            child_id = claimed.child_execution_id
                            self._pending_children.add(child_id)
                            task.add_done_callback(functools.partial(self._child_done, child_id))
            except Exception:
                logger.warning("the child pump failed a pass", exc_info=True)
            if started:
                nap = shortest
                continue
            await self._nap(nap)
            nap = min(self.poll_ms, nap * 2)

    def _child_done(self, child_id: str, _task: asyncio.Task[None]) -> None:
        self._pending_children.discard(child_id)
        self._slot_freed()

    def _slot_freed(self) -> None:
        """A run or a child ended here: wake the child pump if it left children queued
        because every slot was taken (else it claims at its next poll, as it would)."""
        if self._pump_starved:
            self._pump_starved = False
            self._poke()

    async def _housekeeping(self) -> None:
        """Every sweep period: rescue children whose runner died, wake parents whose wake
        was lost, and finish resumes whose resolver died between its two phases."""
        children = self._children
        assert children is not None
        while True:
            await self.clock.sleep(self.sweep_ms)
            try:
                free = self.slots.free
                if free > 0:
                    await children.rescue_once(max(free, 100), spawn=True, max_runs=free)
                await children.wake_once()
                await self._finish_resumes()
            except Exception:
                logger.warning("a housekeeping pass failed", exc_info=True)

    async def _finish_resumes(self) -> None:
        now = self.clock.now()
        for record in await self.records.find_by_status(ExecutionRecordStatus.PAUSED, 100):
            if record.workflow not in self.workflows:
                continue
            named = await self.tree.list(record.tenant_id, record.execution_id, PAUSE_PREFIX)
            for value in named.values():
                if not isinstance(value, dict):
                    continue
                pause = await self.pauses.get(record.tenant_id, str(value.get("pause_id")))
                if (
                    pause is not None
                    and pause.status is PauseStatus.RESOLVED
                    and (pause.resolved_at is None or now - pause.resolved_at > self.lease_ms)
                ):
                    await self._after_resolve(record.tenant_id, record.execution_id)
                    break


__all__ = ["Runs"]
