"""Naive store sets the explorer must catch, each on the invariant it breaks.

Each is the in-memory reference set with one deliberate mistake, the kind a store
author makes: leases on the caller's clock, a lease live through its expiry
instant, a renewal whatever the time, a renewal from the old end, a finish that
only releases, a reclaim that keeps the epoch, a renewal that ignores a yield, a
release/finish that matches the holder but not the epoch, calls keyed by the step
only, a claim that does not compare, effects that trust the current token,
effects on the caller's clock, a queue finish without the attempt compare, ends of an
attempt that trust a finished lease; for the worlds of the other stores: a `lease_state_of`
that reads the lease's flags before it compares the token, a queue that wakes a waiting
parent at any of its children's finish, a pause's take that answers True to anyone's retry,
reservations that leave the recorded entries out of the budget, reservations checked,
then added in a second step.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agboss_sql.contracts.clocks import StoreClock, remaining_of
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import LeaseClosedReason, checked_budget_key
from agboss_sql.contracts.types import (
    AttemptRef,
    BudgetScope,
    ChildStatus,
    ClaimedChild,
    ExecutionLease,
    FencedEffectKey,
    FencedEffectResult,
    FinishResult,
    JsonValue,
    LeaseHolder,
    LeaseState,
    OutboundCall,
    OutboundCallSaved,
    OutboundCallStatus,
    PauseStatus,
)
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryChildExecutionQueueRepository,
    InMemoryCostLedgerRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryOutboundCallRepository,
    InMemoryPausedExecutionRepository,
    InMemoryTransaction,
)
from agboss_sql.memory._fencing import store_now
from agboss_sql.memory.backend import LeaseRow
from agboss_sql.testing._case import BusinessRows, Seam, StoreFactory

T = TypeVar("T")


class NaiveLeases(InMemoryExecutionLeaseRepository):
    """The reference lease store with one of its rules broken (class attributes say which)."""

    live_through_expiry = False
    """A lease is live while `expires_at >= now`: through its expiry instant."""
    renew_whatever_the_time = False
    """A renewal never checks that the lease is still live."""
    renew_from_old_end = False
    """A renewal extends from the old end: `expires_at + lease_ms`."""
    finish_only_releases = False
    """`finish` sets released, never finished."""
    reclaim_keeps_epoch = False
    """`reclaim` gives the lease back at the same epoch."""
    renew_ignores_yield = False
    """A renewal of a yielded lease succeeds (and the lease stays yielded)."""
    let_go_by_holder_only = False
    """`release` and `finish` match the holder instance, not the epoch."""

    def _holder_row(self, lease: ExecutionLease) -> LeaseRow | None:
        """The lease's row when this instance holds it, at any epoch."""
        row = self.memory.leases.get((lease.tenant_id, lease.execution_id))
        if row is None or row.holder_instance_id != self.instance_id:
            return None
        return row

    def _live(self, expires_at: int, now: int) -> bool:
        return expires_at >= now if self.live_through_expiry else expires_at > now

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        if not self.live_through_expiry:
            return await super().acquire(tenant_id, execution_id, lease_ms)
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            key = (tenant_id, execution_id)
            row = self.memory.leases.get(key)
            if row is None:
                row = LeaseRow(tenant_id, execution_id, self.instance_id, 1, now + lease_ms)
                self.memory.leases[key] = row
                return self._lease_of(row, now)
            free = row.released or row.yielded or not self._live(row.expires_at, now)
            if row.finished or not free:
                return None
            came = None
            if not row.released and not row.yielded:
                came = LeaseHolder(row.holder_instance_id, row.lease_epoch)
            row.holder_instance_id = self.instance_id
            row.lease_epoch += 1
            row.expires_at = now + lease_ms
            row.released = row.yielded = False
            row.closed_reason = None
            return self._lease_of(row, now, came)

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self._held(lease)
            yielded = row is not None and row.yielded and not self.renew_ignores_yield
            if row is None or row.released or yielded or row.finished:
                return None
            if not self.renew_whatever_the_time and not self._live(row.expires_at, now):
                return None
            if self.renew_from_old_end:
                row.expires_at = row.expires_at + lease_ms
            else:
                row.expires_at = max(row.expires_at, now + lease_ms)
            return remaining_of(row.expires_at, now)

    async def yield_lease(self, lease: ExecutionLease) -> bool:
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self._held(lease)
            if row is None or row.released or row.yielded or row.finished:
                return False
            if not self._live(row.expires_at, now):
                return False
            row.yielded = True
            return True

    async def reclaim(self, lease: ExecutionLease, lease_ms: int) -> ExecutionLease | None:
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self._held(lease)
            if row is None or not row.yielded or row.released or row.finished:
                return None
            if not self._live(row.expires_at, now):
                return None
            if not self.reclaim_keeps_epoch:
                row.lease_epoch += 1
            row.yielded = False
            row.expires_at = now + lease_ms
            return self._lease_of(row, now)

    async def release(self, lease: ExecutionLease) -> bool:
        if not self.let_go_by_holder_only:
            return await super().release(lease)
        async with self.memory.atomic():
            row = self._holder_row(lease)
            if row is None or row.released or row.finished:
                return False
            row.released = True
            row.closed_reason = LeaseClosedReason.RELEASED
            return True

    async def finish(self, lease: ExecutionLease) -> bool:
        if self.let_go_by_holder_only:
            async with self.memory.atomic():
                row = self._holder_row(lease)
                if row is None or row.released or row.finished:
                    return False
                row.finished = row.released = True
                row.closed_reason = LeaseClosedReason.FINISHED
                return True
        if not self.finish_only_releases:
            return await super().finish(lease)
        return await super().release(lease)


class LiveThroughExpiry(NaiveLeases):
    live_through_expiry = True


class RenewWhateverTheTime(NaiveLeases):
    renew_whatever_the_time = True


class RenewFromOldEnd(NaiveLeases):
    renew_from_old_end = True


class FinishOnlyReleases(NaiveLeases):
    finish_only_releases = True


class ReclaimKeepsEpoch(NaiveLeases):
    reclaim_keeps_epoch = True


class RenewIgnoresYield(NaiveLeases):
    renew_ignores_yield = True


class LetGoByHolderOnly(NaiveLeases):
    let_go_by_holder_only = True


class QueueFinishWithoutCompare(InMemoryChildExecutionQueueRepository):
    """A child's finish that never compares the attempt: any attempt finishes it."""

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> FinishResult:
        return await super().finish(child_execution_id, outcome)


class BatchClaimTakesRunning(InMemoryChildExecutionQueueRepository):
    """A batch claim that takes running children too, not only queued ones."""

    async def claim_many(self, instance_id: str, n: int) -> Any:
        rows = sorted(
            (r for r in self.memory.children.values() if r.status is not ChildStatus.FINISHED),
            key=lambda r: (-r.depth, r.queued_at, r.sequence),
        )[:n]
        claimed = []
        for row in rows:
            row.status = ChildStatus.RUNNING
            row.claimed_by = instance_id
            row.attempt += 1
            claimed.append(
                ClaimedChild(
                    row.tenant_id,
                    row.root_execution_id,
                    row.parent_execution_id,
                    row.child_execution_id,
                    row.depth,
                    row.payload,
                    row.attempt,
                    instance_id,
                )
            )
        return claimed


class CallsKeyedByStep(InMemoryOutboundCallRepository):
    """Outbound calls whose row is the step's, whatever the business key: two trees under
    one business key each get a row of their own."""

    @staticmethod
    def _step_key(key: FencedEffectKey) -> FencedEffectKey:
        return dataclasses.replace(key, business_key=None, fingerprint=None)

    async def get(self, key: FencedEffectKey) -> OutboundCall | None:
        return await super().get(self._step_key(key))

    async def save_if_absent(
        self, key: FencedEffectKey, intent: JsonValue, recorded_at: int
    ) -> OutboundCallSaved:
        return await super().save_if_absent(self._step_key(key), intent, recorded_at)

    async def mark_pending(self, key: FencedEffectKey, expected: AttemptRef, owner: str) -> bool:
        return await super().mark_pending(self._step_key(key), expected, owner)

    async def mark_completed(
        self, key: FencedEffectKey, attempt: AttemptRef, response: JsonValue
    ) -> bool:
        return await super().mark_completed(self._step_key(key), attempt, response)

    async def mark_failed(
        self, key: FencedEffectKey, attempt: AttemptRef, error: JsonValue
    ) -> bool:
        return await super().mark_failed(self._step_key(key), attempt, error)


class ClaimWithoutCompare(InMemoryOutboundCallRepository):
    """A claim that takes the next attempt whatever attempt the caller read."""

    async def mark_pending(self, key: FencedEffectKey, expected: AttemptRef, owner: str) -> bool:
        current = await self.get(key)
        if current is None:
            return False
        return await super().mark_pending(key, current.attempt_ref, owner)


class EndsTrustAFinishedLease(InMemoryOutboundCallRepository):
    """Ends of an attempt (`mark_completed`, `mark_failed`) whose fence lets a finished
    lease through for its holder at its token, whatever its time: "the run finished, but
    how its call ended must still be recorded". A finished lease is over: the attempt is
    someone else's to reconcile."""

    async def _end(
        self,
        key: FencedEffectKey,
        attempt: AttemptRef,
        status: OutboundCallStatus,
        response: JsonValue,
        error: JsonValue,
    ) -> bool:
        row = self.memory.leases.get((key.tenant_id, key.lease_execution_id))
        if (
            row is None
            or not row.finished
            or row.lease_epoch != key.token
            or row.holder_instance_id != key.holder_instance_id
        ):
            return await super()._end(key, attempt, status, response, error)
        kept = (row.finished, row.released, row.closed_reason, row.expires_at)
        row.finished = row.released = False
        row.closed_reason = None
        row.expires_at = store_now(self.store_clock) + 1
        try:
            return await super()._end(key, attempt, status, response, error)
        finally:
            row.finished, row.released, row.closed_reason, row.expires_at = kept


class EffectsTrustCurrentToken(InMemoryFencedEffectRepository):
    """Fenced effects checked against whatever token the lease is at now, not the key's."""

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Callable[[InMemoryTransaction], Awaitable[T]]
    ) -> FencedEffectResult[T]:
        row = self.memory.leases.get((key.tenant_id, key.lease_execution_id))
        if row is not None:
            key = dataclasses.replace(key, token=row.lease_epoch)
        return await super().save_result_if_absent(key, work)


class LeaseStateOfFlagsFirst(InMemoryOutboundCallRepository):
    """A `lease_state_of` that reads the lease row's flags before it compares the token:
    an older epoch is answered finished or released when the latest one is, where the
    contract answers superseded (and it closes an expired epoch as the contract does)."""

    async def lease_state_of(self, tenant_id: str, execution_id: str, token: int) -> LeaseState:
        row = self.memory.leases.get((tenant_id, execution_id))
        if row is None or row.lease_epoch < token:
            return LeaseState.ABSENT
        if row.finished:
            return LeaseState.FINISHED
        if row.released:
            if row.closed_reason == LeaseClosedReason.SUPERSEDED:
                return LeaseState.SUPERSEDED
            return LeaseState.RELEASED
        return await super().lease_state_of(tenant_id, execution_id, token)


class WakesAWaitingParentEarly(InMemoryChildExecutionQueueRepository):
    """A queue whose every finish of a child makes its waiting parent claimable, not only
    the finish of its last child."""

    def _finish_one(self, child_execution_id: str, outcome: JsonValue, attempt: int | None) -> Any:
        result = super()._finish_one(child_execution_id, outcome, attempt)
        row = self.memory.children.get(child_execution_id)
        if result.finished and row is not None:
            self._wake_waiting(row.tenant_id, row.parent_execution_id)
        return result


class TakeRetriesForAnyone(InMemoryPausedExecutionRepository):
    """A pause's take whose "retry after a lost reply answers True" forgets to compare the
    taker: every taker of a taken pause is told it took it."""

    async def take(self, tenant_id: str, pause_id: str, *, taker: str | None = None) -> bool:
        checked_identifier("tenant_id", tenant_id)
        row = self.memory.pauses.get((tenant_id, pause_id))
        if row is not None and row.pause.status is PauseStatus.TAKEN:
            return True
        return await super().take(tenant_id, pause_id, taker=taker)


class ReservationsIgnoreEntries(InMemoryCostLedgerRepository):
    """Reservations checked against the reservations alone: the recorded entries are left
    out of the budget."""

    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        _, tenant = checked_budget_key(scope, key, tenant_id)
        slot = (BudgetScope(scope), tenant, key)
        reserved = self.memory.reservations.get(slot, 0)
        if reserved + amount_micros > limit_micros:
            return False
        self.memory.reservations[slot] = reserved + amount_micros
        return True


class ReservationsCheckThenAdd(InMemoryCostLedgerRepository):
    """Reservations that read the total, then add in a second step (a round trip between,
    as two statements outside one transaction would): reservations made at once all see
    the total before any of them is added."""

    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        spent = (await self.total(scope, key, tenant_id=tenant_id)).cost_micros
        if spent + amount_micros > limit_micros:
            return False
        await asyncio.sleep(0)  # the round trip between the read and the write
        _, tenant = checked_budget_key(scope, key, tenant_id)
        slot = (BudgetScope(scope), tenant, key)
        self.memory.reservations[slot] = self.memory.reservations.get(slot, 0) + amount_micros
        return True


@dataclass
class MemorySet:
    """An in-memory store set on one backend, as `explore` takes it."""

    backend: InMemoryBackend
    factories: dict[str, Any]

    async def reset(self) -> None:
        self.backend.reset()

    @property
    def business_rows(self) -> BusinessRows:
        backend = self.backend

        async def insert(tx: Any, row: str) -> None:
            tx.insert(row)

        async def committed() -> list[str]:
            return list(backend.business_rows)

        return BusinessRows(insert, committed)


def memory_set(
    *,
    leases: Callable[[InMemoryBackend, Seam], Any] | None = None,
    effects: Callable[[InMemoryBackend, Seam], Any] | None = None,
    calls: Callable[[InMemoryBackend, Seam], Any] | None = None,
    queue: Callable[[InMemoryBackend, Seam], Any] | None = None,
    pauses: Callable[[InMemoryBackend, Seam], Any] | None = None,
    costs: Callable[[InMemoryBackend, Seam], Any] | None = None,
) -> MemorySet:
    """The in-memory reference set, with any of its fencing stores replaced."""
    backend = InMemoryBackend()

    def reference(cls: Any) -> Callable[[InMemoryBackend, Seam], Any]:
        return lambda memory, seam: cls(memory, seam.store_clock, seam.application)

    made = {
        "execution_lease": leases or reference(InMemoryExecutionLeaseRepository),
        "fenced_effect": effects or reference(InMemoryFencedEffectRepository),
        "outbound_call": calls or reference(InMemoryOutboundCallRepository),
        "child_queue": queue or on_application_clock(InMemoryChildExecutionQueueRepository),
        "paused_execution": pauses or on_application_clock(InMemoryPausedExecutionRepository),
        "cost_ledger": costs or on_application_clock(InMemoryCostLedgerRepository),
    }
    factories: dict[str, Any] = {
        key: StoreFactory(instance=(lambda seam, make=make: make(backend, seam)))
        for key, make in made.items()
    }
    return MemorySet(backend, factories)


def on_callers_clock(cls: Any) -> Callable[[InMemoryBackend, Seam], Any]:
    """A store deciding by its caller's own clock (`seam.clock`) instead of the store's."""
    return lambda memory, seam: cls(memory, StoreClock(seam.clock), seam.application)


def on_application_clock(cls: Any) -> Callable[[InMemoryBackend, Seam], Any]:
    """A store on the application's clock (`seam.clock`), as the queue, pauses and ledger are."""
    return lambda memory, seam: cls(memory, seam.clock, seam.application)


def naive(cls: Any) -> Callable[[InMemoryBackend, Seam], Any]:
    if issubclass(
        cls,
        (
            InMemoryChildExecutionQueueRepository,
            InMemoryPausedExecutionRepository,
            InMemoryCostLedgerRepository,
        ),
    ):
        # The child queue, the pauses and the ledger are on the application's clock.
        return on_application_clock(cls)
    return lambda memory, seam: cls(memory, seam.store_clock, seam.application)


__all__ = [
    "BatchClaimTakesRunning",
    "CallsKeyedByStep",
    "EndsTrustAFinishedLease",
    "ClaimWithoutCompare",
    "EffectsTrustCurrentToken",
    "FinishOnlyReleases",
    "LeaseStateOfFlagsFirst",
    "LetGoByHolderOnly",
    "LiveThroughExpiry",
    "MemorySet",
    "NaiveLeases",
    "ReclaimKeepsEpoch",
    "RenewFromOldEnd",
    "RenewIgnoresYield",
    "QueueFinishWithoutCompare",
    "RenewWhateverTheTime",
    "ReservationsCheckThenAdd",
    "ReservationsIgnoreEntries",
    "TakeRetriesForAnyone",
    "WakesAWaitingParentEarly",
    "memory_set",
    "naive",
    "on_callers_clock",
]
