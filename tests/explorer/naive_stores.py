"""Naive store sets the explorer must catch, each on the invariant it breaks.

Each is the in-memory reference set with one deliberate mistake, the kind a store
author makes: leases on the caller's clock, a lease live through its expiry
instant, a renewal whatever the time, a renewal from the old end, a finish that
only releases, a reclaim that keeps the epoch, a renewal that ignores a yield, a
release/finish that matches the holder but not the epoch, calls keyed by the step
only, a claim that does not compare, effects that trust the current token,
effects on the caller's clock, a queue finish without the attempt compare, ends of an
attempt that trust a finished lease.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agboss_sql.contracts.clocks import StoreClock, remaining_of
from agboss_sql.contracts.rules import LeaseClosedReason
from agboss_sql.contracts.types import (
    AttemptRef,
    ChildStatus,
    ClaimedChild,
    ExecutionLease,
    FencedEffectKey,
    FencedEffectResult,
    FinishResult,
    JsonValue,
    LeaseHolder,
    OutboundCall,
    OutboundCallSaved,
    OutboundCallStatus,
)
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryChildExecutionQueueRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryOutboundCallRepository,
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
) -> MemorySet:
    """The in-memory reference set, with any of its fencing stores replaced."""
    backend = InMemoryBackend()

    def reference(cls: Any) -> Callable[[InMemoryBackend, Seam], Any]:
        return lambda memory, seam: cls(memory, seam.store_clock, seam.application)

    made = {
        "execution_lease": leases or reference(InMemoryExecutionLeaseRepository),
        "fenced_effect": effects or reference(InMemoryFencedEffectRepository),
        "outbound_call": calls or reference(InMemoryOutboundCallRepository),
        "child_queue": queue
        or (
            lambda memory, seam: InMemoryChildExecutionQueueRepository(
                memory, seam.clock, seam.application
            )
        ),
    }
    factories: dict[str, Any] = {
        key: StoreFactory(instance=(lambda seam, make=make: make(backend, seam)))
        for key, make in made.items()
    }
    return MemorySet(backend, factories)


def on_callers_clock(cls: Any) -> Callable[[InMemoryBackend, Seam], Any]:
    """A store deciding by its caller's own clock (`seam.clock`) instead of the store's."""
    return lambda memory, seam: cls(memory, StoreClock(seam.clock), seam.application)


def naive(cls: Any) -> Callable[[InMemoryBackend, Seam], Any]:
    if issubclass(cls, InMemoryChildExecutionQueueRepository):
        # The child queue is on the application's clock.
        return lambda memory, seam: cls(memory, seam.clock, seam.application)
    return lambda memory, seam: cls(memory, seam.store_clock, seam.application)


__all__ = [
    "BatchClaimTakesRunning",
    "CallsKeyedByStep",
    "EndsTrustAFinishedLease",
    "ClaimWithoutCompare",
    "EffectsTrustCurrentToken",
    "FinishOnlyReleases",
    "LetGoByHolderOnly",
    "LiveThroughExpiry",
    "MemorySet",
    "NaiveLeases",
    "ReclaimKeepsEpoch",
    "RenewFromOldEnd",
    "RenewIgnoresYield",
    "QueueFinishWithoutCompare",
    "RenewWhateverTheTime",
    "memory_set",
    "naive",
    "on_callers_clock",
]
