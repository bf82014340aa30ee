"""`ChildWorker`: runs queued children on any instance, each under its own lease."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.clocks import Clock
from agboss_sql.contracts.errors import ExecutionFencedError, ExecutionLeaseLostError
from agboss_sql.contracts.stores import (
    ChildExecutionQueueRepository,
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    ExecutionTreeRepository,
)
from agboss_sql.contracts.types import ClaimedChild, ExecutionLease, JsonValue
from agboss_sql.runtime.keeper import DEFAULT_LEASE_MS, LeaseKeeper, bind_keeper, unbind_keeper

logger = logging.getLogger("agboss_sql.runtime")

RunChild = Callable[[ClaimedChild, ExecutionLease], Awaitable[JsonValue]]
WakeParent = Callable[[str, str], Awaitable[None]]

_MESSAGE_LIMIT = 1_000


def error_outcome(error: BaseException) -> JsonValue:
    """The outcome a child that raised finishes with: its error's type, code and message."""
    return {
        "error": {
            "type": type(error).__name__,
            "code": getattr(error, "code", None),
            "message": str(error)[:_MESSAGE_LIMIT],
        }
    }


def _instance_id_of(queue: ChildExecutionQueueRepository) -> str:
    application = getattr(queue, "application", None)
    instance_id = getattr(application, "instance_id", None)
    if not isinstance(instance_id, str):
        raise TypeError(
            f"{type(queue).__name__} has no application.instance_id: pass instance_id= "
            "(the instance that claims children)"
        )
    return instance_id


class ChildWorker:
    """Claims queued children and runs each under the child's own lease.

    `run_once`: claim the next child, take its lease `(tenant_id, child_execution_id)`,
    run `run_child(child, lease)` with the lease renewed in the background (the run finds
    its keeper with `current_keeper()`), then finish the child at its attempt and finish
    its lease. The one finisher the queue answers `remaining == 0` (and `finished`) calls
    `wake_parent(tenant_id, parent_execution_id)`: exactly once across all workers.

    - A lease lost during the run cancels the run and finishes nothing: the next holder
      owns the child. So does a run that raised `ExecutionLeaseLostError` or
      `ExecutionFencedError`.
    - A run that raised anything else, or was cancelled through the tree's cancel request,
      finishes the child with `error_outcome(error)`: the parent decides what a failed
      child means.
    - A child whose lease is held elsewhere is left running for `rescue_once`.

    `rescue_once` (the child part of the recovery sweep): for each running child whose
    lease is over, take it at the next epoch, `restart` the child at the attempt read (one
    rescuer wins), and run it again from its checkpoint. A superseded worker's late finish
    changes nothing: the queue compares the attempt.
    """

    def __init__(
        self,
        queue: ChildExecutionQueueRepository,
        leases: ExecutionLeaseRepository,
        events: ExecutionLeaseEventRepository | None,
        clock: Clock,
        *,
        run_child: RunChild,
        wake_parent: WakeParent,
        lease_ms: int = DEFAULT_LEASE_MS,
        tree: ExecutionTreeRepository | None = None,
        instance_id: str | None = None,
        trust_margin_ms: int | None = None,
    ) -> None:
        self.queue = queue
        self.leases = leases
        self.events = events
        self.clock = clock
        self.run_child = run_child
        self.wake_parent = wake_parent
        self.lease_ms = lease_ms
        self.tree = tree
        self.instance_id = instance_id if instance_id is not None else _instance_id_of(queue)
        self.trust_margin_ms = trust_margin_ms
        self._task: asyncio.Task[None] | None = None
        self._keeper()  # the lease settings are checked now, not at the first child

    def _keeper(self, root_execution_id: str | None = None) -> LeaseKeeper:
        if self.trust_margin_ms is None:
            return LeaseKeeper(
                self.leases,
                self.events,
                self.clock,
                lease_ms=self.lease_ms,
                tree=self.tree,
                root_execution_id=root_execution_id,
            )
        return LeaseKeeper(
            self.leases,
            self.events,
            self.clock,
            lease_ms=self.lease_ms,
            tree=self.tree,
            root_execution_id=root_execution_id,
            trust_margin_ms=self.trust_margin_ms,
        )

    async def run_once(self) -> bool:
        """Claim one queued child and run it (see the class). False when none was queued."""
        claimed = await self.queue.claim(self.instance_id)
        if claimed is None:
            return False
        keeper = self._keeper(claimed.root_execution_id)
        lease = await keeper.take(claimed.tenant_id, claimed.child_execution_id)
        if lease is None:
            logger.warning(
                "child %s is claimed but its lease is held elsewhere; leaving it to the rescue",
                claimed.child_execution_id,
            )
            return True
        await self._run(claimed, keeper, lease)
        return True

    async def rescue_once(self, limit: int = 100) -> int:
        """Take over running children whose lease is over, and run each again. How many
        were run."""
        rescued = 0
        for child in await self.queue.running(limit):
            keeper = self._keeper(child.root_execution_id)
            lease = await keeper.take(child.tenant_id, child.child_execution_id)
            if lease is None:
                continue
            restarted = await self.queue.restart(child.child_execution_id, child.attempt)
            if restarted is None:
                # Finished or restarted by another rescuer since it was listed.
                await keeper.release()
                continue
            await self._run(restarted, keeper, lease)
            rescued += 1
        return rescued

    async def _run(self, child: ClaimedChild, keeper: LeaseKeeper, lease: ExecutionLease) -> None:
        async def call() -> JsonValue:
            return await self.run_child(child, lease)

        keeper.start()
        token = bind_keeper(keeper)
        try:
            run = asyncio.get_running_loop().create_task(call())
        finally:
            unbind_keeper(token)
        aborted = asyncio.get_running_loop().create_task(keeper.signal.wait())
        try:
            await asyncio.wait({run, aborted}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # This worker is being cancelled (its instance stops or dies): stop the run and
            # the renewals; the lease is left to run out for the rescue.
            run.cancel()
            aborted.cancel()
            await keeper.stop()
            raise
        aborted.cancel()
        if not run.done():
            # The signal was aborted (lease lost, or the tree cancelled): the run starts
            # nothing more.
            run.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await run
        if keeper.lost:
            return
        if not run.cancelled() and run.exception() is None:
            outcome = run.result()
        else:
            error: BaseException | None = (
                keeper.signal.reason if run.cancelled() else run.exception()
            )
            if error is None:
                error = asyncio.CancelledError("the child's run was cancelled")
            if isinstance(error, (ExecutionLeaseLostError, ExecutionFencedError)):
                logger.warning(
                    "child %s lost its lease while running: %s", child.child_execution_id, error
                )
                await keeper.stop()
                return
            outcome = error_outcome(error)
        result = await self.queue.finish(child.child_execution_id, outcome, attempt=child.attempt)
        if not result.finished:
            # Superseded by a rescue: the new attempt finishes the child and holds its lease.
            await keeper.stop()
            return
        await keeper.finish()
        if result.remaining == 0:
            await self.wake_parent(child.tenant_id, child.parent_execution_id)

    def start(self, *, poll_ms: int = 1_000, rescue_every_ms: int = 30_000) -> None:
        """Run children until `stop()`: claim and run one after another, sleeping `poll_ms`
        on the application clock when none is queued, and rescue every `rescue_every_ms`."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._loop(poll_ms, rescue_every_ms)
            )

    async def stop(self) -> None:
        """Stop the loop; a child being run is cancelled and its lease left to run out."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self, poll_ms: int, rescue_every_ms: int) -> None:
        next_rescue = self.clock.monotonic()
        while True:
            try:
                if self.clock.monotonic() >= next_rescue:
                    next_rescue = self.clock.monotonic() + rescue_every_ms
                    await self.rescue_once()
                if await self.run_once():
                    continue
            except Exception:
                logger.warning("the child worker failed a pass", exc_info=True)
            await self.clock.sleep(poll_ms)


__all__ = ["ChildWorker", "RunChild", "WakeParent", "error_outcome"]
