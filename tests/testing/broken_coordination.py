"""Deliberately broken coordination stores, each the in-memory store with one condition
wrong (the kind a store author copying our SQL gets wrong). The coordination matrix fails
every one of them; some pass every hand-picked case of their contract and fail only the
matrix's family they break (test_matrix_coordination.py says which)."""

from __future__ import annotations

import dataclasses
from typing import Any

from agboss_sql.contracts import (
    BudgetScope,
    ChildStatus,
    CostEntry,
    ExecutionRecordStatus,
    MeshRequestSaved,
    PauseStatus,
)
from agboss_sql.memory import (
    InMemoryChildExecutionQueueRepository,
    InMemoryCostLedgerRepository,
    InMemoryExecutionHistoryRepository,
    InMemoryExecutionLeaseEventRepository,
    InMemoryExecutionRecordRepository,
    InMemoryExecutionTreeRepository,
    InMemoryMeshRequestRepository,
    InMemoryPausedExecutionRepository,
    InMemoryRateLimitRepository,
)

# --- row states ---------------------------------------------------------------------------


class CancelledRunsRequeue(InMemoryExecutionRecordRepository):
    """A cancelled run moves again when the caller expects `cancelled` (terminal checked
    only for succeeded and failed)."""

    async def transition(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        new: ExecutionRecordStatus,
    ) -> bool:
        row = self.memory.records.get((tenant_id, execution_id))
        if row is not None and row.record.status == expected == ExecutionRecordStatus.CANCELLED:
            row.record = dataclasses.replace(row.record, status=new)
            return True
        return await super().transition(tenant_id, execution_id, expected, new)


# --- tenants ------------------------------------------------------------------------------


class CancelOfAnyTenant(InMemoryPausedExecutionRepository):
    """Cancels the pending pause of that id in whichever tenant has one."""

    async def cancel(self, tenant_id: str, pause_id: str) -> bool:
        for tenant, pid in list(self.memory.pauses):
            if pid == pause_id and await super().cancel(tenant, pause_id):
                return True
        return False


class CompleteOfAnyTenant(InMemoryExecutionRecordRepository):
    """Completes the run of that execution id in whichever tenant has one."""

    async def complete(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        final: ExecutionRecordStatus,
        outcome: Any,
    ) -> bool:
        for tenant, eid in list(self.memory.records):
            if eid == execution_id and await super().complete(
                tenant, execution_id, expected, final, outcome
            ):
                return True
        return False


class WakesWaitingEntryOfAnyTenant(InMemoryChildExecutionQueueRepository):
    """The last finish makes the waiting entry of the parent id claimable in any tenant."""

    def _wake_waiting(self, tenant_id: str, parent_execution_id: str) -> None:
        parent = self.memory.children.get(parent_execution_id)
        if parent is not None and parent.status is ChildStatus.WAITING:
            parent.status = ChildStatus.QUEUED


class TakesACancelledPause(InMemoryPausedExecutionRepository):
    """Takes a pause that is resolved or cancelled (`status != pending` for `resolved`)."""

    async def take(self, tenant_id: str, pause_id: str, *, taker: str | None = None) -> bool:
        row = self.memory.pauses.get((tenant_id, pause_id))
        if row is not None and row.pause.status is PauseStatus.CANCELLED:
            row.pause = dataclasses.replace(row.pause, status=PauseStatus.TAKEN)
            row.taken_by = taker
            return True
        return await super().take(tenant_id, pause_id, taker=taker)


class ConflictOnlyWhileOpen(InMemoryMeshRequestRepository):
    """Answers a completed request to a save with another fingerprint."""

    async def save_if_absent(
        self, idempotency_key: str, tenant_id: str, fingerprint: str, received_at: int
    ) -> Any:
        found = await self.get(tenant_id, idempotency_key)
        if found is not None and found.completed:
            return MeshRequestSaved(found, False)
        return await super().save_if_absent(idempotency_key, tenant_id, fingerprint, received_at)


class TreeKeyOnceAcrossTenants(InMemoryExecutionTreeRepository):
    """Refuses a key a root of that id has in any tenant."""

    async def save_if_absent(
        self, tenant_id: str, root_execution_id: str, key: str, value: Any
    ) -> bool:
        for (_, root), tree in self.memory.trees.items():
            if root == root_execution_id and key in tree:
                return False
        return await super().save_if_absent(tenant_id, root_execution_id, key, value)


class EntryIdAcrossTenants(InMemoryCostLedgerRepository):
    """Records an entry id once whatever the tenant."""

    async def record(self, entry: CostEntry) -> bool:
        if any(entry_id == entry.entry_id for _, entry_id in self.memory.cost_entries):
            return False
        return await super().record(entry)


class TotalsCountEveryTenantsReservations(InMemoryCostLedgerRepository):
    """A tenant's total counts the reservations of the scope's key in every tenant."""

    async def total(
        self,
        scope: BudgetScope,
        key: str,
        since: int | None = None,
        *,
        tenant_id: str | None = None,
    ) -> Any:
        found = await super().total(scope, key, since, tenant_id=tenant_id)
        others = sum(
            amount
            for (s, tenant, k), amount in self.memory.reservations.items()
            if s == BudgetScope(scope) and k == key and tenant not in (tenant_id, "")
        )
        return dataclasses.replace(found, cost_micros=found.cost_micros + others)


class RenewsARunOutSlot(InMemoryRateLimitRepository):
    """Renews the holder's slot without looking at its end."""

    async def renew_slot(self, key: str, holder: str, ttl_ms: int) -> bool:
        slots = self.memory.slots.get(key, {})
        if holder not in slots:
            return False
        slots[holder] = max(slots[holder], self._now() + ttl_ms)
        return True


class RefusesAWindowFilledExactly(InMemoryRateLimitRepository):
    """Refuses an amount that fills the window exactly (`<` for `<=`)."""

    async def add_to_window(self, key: str, window_ms: int, amount: int, limit: int) -> Any:
        return await super().add_to_window(key, window_ms, amount, max(0, limit - 1))


class ClaimsAWokenWake(InMemoryChildExecutionQueueRepository):
    """A retried claim of a wake already done answers True (the `woken` condition left out
    for the claimer's own retry)."""

    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        row = self.memory.children.get(child_execution_id)
        if row is not None and row.parent_woken_at is not None and row.wake_claimed_by == claimer:
            return True
        return await super().claim_wake(child_execution_id, claimer, claim_ms)


class SaveOverAClosedPause(InMemoryPausedExecutionRepository):
    """Saves over a taken or cancelled pause of the same id (a closed pause taken for gone,
    as if purged)."""

    async def save(self, pause: Any) -> None:
        row = self.memory.pauses.get((pause.tenant_id, pause.pause_id))
        if row is not None and row.pause.status in (PauseStatus.TAKEN, PauseStatus.CANCELLED):
            del self.memory.pauses[(pause.tenant_id, pause.pause_id)]
        await super().save(pause)


class DeletedKeysStayTaken(InMemoryExecutionTreeRepository):
    """Keeps a deleted tree's keys as taken: a later write of one is refused."""

    async def delete_tree(self, tenant_id: str, root_execution_id: str) -> int:
        gone: set[tuple[str, str, str]] = vars(self.memory).setdefault("tombstones", set())
        for key in self.memory.trees.get((tenant_id, root_execution_id), {}):
            gone.add((tenant_id, root_execution_id, key))
        return await super().delete_tree(tenant_id, root_execution_id)

    async def save_if_absent(
        self, tenant_id: str, root_execution_id: str, key: str, value: Any
    ) -> bool:
        gone: set[tuple[str, str, str]] = vars(self.memory).get("tombstones", set())
        if (tenant_id, root_execution_id, key) in gone:
            return False
        return await super().save_if_absent(tenant_id, root_execution_id, key, value)


class ApplicationReserveAgainstEveryTenant(InMemoryCostLedgerRepository):
    """Holds a tenant's reservation by application or tenant against every tenant's spend
    (the tenant condition kept for the execution scope only)."""

    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        if tenant_id is not None and BudgetScope(scope) is not BudgetScope.EXECUTION:
            every = (await self.total(scope, key)).cost_micros
            mine = (await self.total(scope, key, tenant_id=tenant_id)).cost_micros
            limit_micros = max(0, limit_micros - (every - mine))
        return await super().try_reserve(
            scope, key, amount_micros, limit_micros, tenant_id=tenant_id
        )


class HistoryByExecutionOnly(InMemoryExecutionHistoryRepository):
    """Replaces the snapshot of that execution id whatever its tenant."""

    async def save(self, snapshot: Any) -> None:
        for tenant, eid in list(self.memory.history):
            if eid == snapshot.execution_id:
                del self.memory.history[(tenant, eid)]
        await super().save(snapshot)


class PauseLastWins(InMemoryRateLimitRepository):
    """A key's last pause wins, shorter or not."""

    async def pause_until(self, key: str, until: int) -> None:
        self.memory.rate_pauses[key] = until


class LogOfEveryTenant(InMemoryExecutionLeaseEventRepository):
    """Lists an execution id's events of every tenant."""

    async def list(self, tenant_id: str, execution_id: str) -> Any:
        return [e for e in self.memory.lease_events if e.execution_id == execution_id]


class CancelChecksItsTenantCancelsEvery(InMemoryPausedExecutionRepository):
    """Checks its tenant's pause is pending, then cancels the pending pause of that id in
    every tenant (the tenant kept in the read, left out of the write)."""

    async def cancel(self, tenant_id: str, pause_id: str) -> bool:
        if not await super().cancel(tenant_id, pause_id):
            return False
        for tenant, pid in list(self.memory.pauses):
            if pid == pause_id and tenant != tenant_id:
                await super().cancel(tenant, pid)
        return True


class TransitionChecksItsTenantMovesEvery(InMemoryExecutionRecordRepository):
    """Compares its tenant's status, then moves the run of that id in every tenant whose
    status is the one expected."""

    async def transition(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        new: ExecutionRecordStatus,
    ) -> bool:
        if not await super().transition(tenant_id, execution_id, expected, new):
            return False
        for tenant, eid in list(self.memory.records):
            if eid == execution_id and tenant != tenant_id:
                await super().transition(tenant, eid, expected, new)
        return True


class FinishesAWaitingChild(InMemoryChildExecutionQueueRepository):
    """Finishes a child waiting for its own children as if it ran (`status in (running,
    waiting)` for `running`)."""

    async def finish(
        self, child_execution_id: str, outcome: Any, *, attempt: int | None = None
    ) -> Any:
        row = self.memory.children.get(child_execution_id)
        if row is not None and row.status is ChildStatus.WAITING:
            row.status = ChildStatus.RUNNING
        return await super().finish(child_execution_id, outcome, attempt=attempt)


class RestartsAWaitingChild(InMemoryChildExecutionQueueRepository):
    """Restarts a child waiting for its own children (a rescue of a waiting child)."""

    async def restart(self, child_execution_id: str, attempt: int) -> Any:
        row = self.memory.children.get(child_execution_id)
        if row is not None and row.status is ChildStatus.WAITING:
            row.status = ChildStatus.RUNNING
        return await super().restart(child_execution_id, attempt)
