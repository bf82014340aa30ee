"""`RecoverySweep`: claims running trees whose holder died, and purges old pauses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.clocks import Clock
from agboss_sql.contracts.stores import (
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    ExecutionRecordRepository,
    PausedExecutionRepository,
)
from agboss_sql.contracts.types import (
    ExecutionLease,
    ExecutionRecord,
    ExecutionRecordStatus,
    LeaseEventKind,
)
from agboss_sql.runtime._log import log_lease_event, log_take
from agboss_sql.runtime._tasks import wait_cancelled
from agboss_sql.runtime.keeper import DEFAULT_LEASE_MS

logger = logging.getLogger("agboss_sql.runtime")

DAY_MS = 24 * 60 * 60 * 1000
DEFAULT_SWEEP_MS = 30_000
DEFAULT_SCAN_LIMIT = 100

Resume = Callable[[ExecutionRecord, ExecutionLease], Awaitable[None]]


class RecoverySweep:
    """At start and every `every_ms`: find running trees, take the lease of each one whose
    holder died or let go, and resume it from its last checkpoint.

    - Only roots are claimed (`execution_id == root_execution_id`): a child run on its
      parent's instance is under the root's lease, and a child on any instance is the
      `ChildWorker`'s to rescue.
    - A lease live elsewhere is refused by the store and skipped; a finished one is never
      granted again.
    - No more trees are claimed than `free_slots()` said at the start of the pass.
    - Each claimed tree is handed to `resume(record, lease)` right after its take (the take
      is logged first, `taken-over` naming the dead holder). `resume` should start the run
      and return; it holds the lease with `LeaseKeeper.adopt(lease)`, which confirms it at
      once so its trust window is measured from a request it sent. A `resume` that raises
      gets its lease released, so another pass (here or elsewhere) can try again.
    - `accepts(record)`, when given, says which trees this instance can run: the others
      are never taken here (an instance whose app lacks a workflow leaves its runs alone).
    - Taken and cancelled pauses older than `pause_retention_ms` are purged.

    `find_by_status` has no cursor, so each pass reads up to `max(free_slots(),
    scan_limit)` running records: reading only `free_slots()` would let live trees held
    elsewhere hide every orphan behind them.
    """

    def __init__(
        self,
        records: ExecutionRecordRepository,
        leases: ExecutionLeaseRepository,
        events: ExecutionLeaseEventRepository | None,
        pauses: PausedExecutionRepository | None,
        clock: Clock,
        *,
        resume: Resume,
        free_slots: Callable[[], int],
        lease_ms: int = DEFAULT_LEASE_MS,
        every_ms: int = DEFAULT_SWEEP_MS,
        pause_retention_ms: int = DAY_MS,
        scan_limit: int = DEFAULT_SCAN_LIMIT,
        accepts: Callable[[ExecutionRecord], bool] | None = None,
    ) -> None:
        for what, value in (
            ("lease_ms", lease_ms),
            ("every_ms", every_ms),
            ("pause_retention_ms", pause_retention_ms),
            ("scan_limit", scan_limit),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{what} must be a positive int, got {value!r}")
        self.records = records
        self.leases = leases
        self.events = events
        self.pauses = pauses
        self.clock = clock
        self.resume = resume
        self.free_slots = free_slots
        self.lease_ms = lease_ms
        self.every_ms = every_ms
        self.pause_retention_ms = pause_retention_ms
        self.scan_limit = scan_limit
        self.accepts = accepts
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> list[ExecutionLease]:
        """One pass: claim and resume up to `free_slots()` orphaned trees, then purge old
        pauses. The leases handed to `resume` (and not released after it failed)."""
        claimed: list[ExecutionLease] = []
        budget = max(0, self.free_slots())
        if budget > 0:
            records = await self.records.find_by_status(
                ExecutionRecordStatus.RUNNING, max(budget, self.scan_limit)
            )
            for record in records:
                if len(claimed) >= budget:
                    break
                if record.execution_id != record.root_execution_id:
                    continue
                if self.accepts is not None and not self.accepts(record):
                    continue  # another instance's app runs it
                lease = await self._claim(record)
                if lease is not None:
                    claimed.append(lease)
        if self.pauses is not None:
            try:
                purged = await self.pauses.purge(self.clock.now() - self.pause_retention_ms)
                if purged:
                    logger.info("purged %d old pauses", purged)
            except Exception:
                logger.warning("could not purge old pauses", exc_info=True)
        return claimed

    async def _claim(self, record: ExecutionRecord) -> ExecutionLease | None:
        try:
            lease = await self.leases.acquire(record.tenant_id, record.execution_id, self.lease_ms)
        except Exception:
            logger.warning(
                "could not try the lease of %s/%s",
                record.tenant_id,
                record.execution_id,
                exc_info=True,
            )
            return None
        if lease is None:
            return None
        try:
            await log_take(self.events, self.clock, lease)
            await self.resume(record, lease)
        except asyncio.CancelledError:
            # The sweep is stopped between the take and the hand-over: let the tree go now
            # rather than when the lease runs out.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    if await self.leases.release(lease):
                        await log_lease_event(
                            self.events,
                            self.clock,
                            lease,
                            LeaseEventKind.RELEASED,
                            reason="the sweep was stopped",
                        )
            raise
        except Exception as error:
            logger.warning(
                "resuming %s/%s failed; releasing its lease",
                record.tenant_id,
                record.execution_id,
                exc_info=True,
            )
            with contextlib.suppress(Exception):
                if await self.leases.release(lease):
                    await log_lease_event(
                        self.events,
                        self.clock,
                        lease,
                        LeaseEventKind.RELEASED,
                        reason=f"resume failed: {error!r}",
                    )
            return None
        return lease

    def start(self) -> None:
        """Run a pass now and then every `every_ms` on the application clock, until
        `stop()`. A failing pass is reported and the next one runs on time."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop the sweep (a pass in progress is cancelled)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await wait_cancelled(task)

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:
                logger.warning("a recovery sweep pass failed", exc_info=True)
            await self.clock.sleep(self.every_ms)


__all__ = ["DAY_MS", "DEFAULT_SCAN_LIMIT", "DEFAULT_SWEEP_MS", "RecoverySweep", "Resume"]
