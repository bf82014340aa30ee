"""In-memory execution leases and the lease log."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agboss_sql.contracts.clocks import Clock, StoreClock, remaining_of
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import (
    LeaseClosedReason,
    checked_count,
    checked_dependencies,
    checked_lease,
    checked_lease_event,
    checked_positive_ms,
)
from agboss_sql.contracts.stores import ExecutionLeaseEventRepository, ExecutionLeaseRepository
from agboss_sql.contracts.types import (
    ApplicationContext,
    ExecutionLease,
    ExecutionLeaseEvent,
    LeaseEventKind,
    LeaseHolder,
)
from agboss_sql.memory._fencing import InMemoryStore, StoreClockStore, store_now
from agboss_sql.memory.backend import InMemoryBackend, LeaseRow


class InMemoryExecutionLeaseRepository(StoreClockStore, ExecutionLeaseRepository):
    """Leases in an `InMemoryBackend`, decided by the store's time.

    Every move is one step under the backend's lock, so it is ordered with the fenced
    effects and outbound calls that check the same lease rows. A lease is moved only by the
    instance holding it (`application.instance_id`) at its epoch. A lease lasts a positive
    whole number of ms.
    """

    @property
    def instance_id(self) -> str:
        return self.application.instance_id

    def _held(self, lease: ExecutionLease) -> LeaseRow | None:
        """The lease's row when this instance holds it at the lease's epoch (and the lease
        names this instance: one built by hand under another's name moves nothing)."""
        checked_lease(lease)
        row = self.memory.leases.get((lease.tenant_id, lease.execution_id))
        if (
            row is None
            or lease.holder_instance_id != self.instance_id
            or row.holder_instance_id != self.instance_id
            or row.lease_epoch != lease.lease_epoch
        ):
            return None
        return row

    @staticmethod
    def _lease_of(
        row: LeaseRow, now: int, taken_over_from: LeaseHolder | None = None
    ) -> ExecutionLease:
        return ExecutionLease(
            tenant_id=row.tenant_id,
            execution_id=row.execution_id,
            holder_instance_id=row.holder_instance_id,
            lease_epoch=row.lease_epoch,
            remaining_ms=remaining_of(row.expires_at, now),
            taken_over_from=taken_over_from,
        )

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        checked_positive_ms("lease_ms", lease_ms)
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            key = (tenant_id, execution_id)
            row = self.memory.leases.get(key)
            if row is None:
                row = LeaseRow(tenant_id, execution_id, self.instance_id, 1, now + lease_ms)
                self.memory.leases[key] = row
                return self._lease_of(row, now)
            if row.finished:
                return None
            if not (row.released or row.yielded or row.expires_at <= now):
                return None
            taken_over_from = None
            if (
                not row.released and not row.yielded
            ) or row.closed_reason == LeaseClosedReason.SUPERSEDED:
                # The epoch ran out without its holder letting go: a takeover (also from
                # this instance itself, and also when `lease_state_of` closed it).
                taken_over_from = LeaseHolder(row.holder_instance_id, row.lease_epoch)
            row.holder_instance_id = self.instance_id
            row.lease_epoch += 1
            row.expires_at = now + lease_ms
            row.released = False
            row.yielded = False
            row.closed_reason = None
            return self._lease_of(row, now, taken_over_from)

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        checked_positive_ms("lease_ms", lease_ms)
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self._held(lease)
            if (
                row is None
                or row.released
                or row.yielded
                or row.finished
                or not row.expires_at > now
            ):
                return None
            row.expires_at = max(row.expires_at, now + lease_ms)
            return remaining_of(row.expires_at, now)

    async def release(self, lease: ExecutionLease) -> bool:
        async with self.memory.atomic():
            row = self._held(lease)
            if row is None or row.released or row.finished:
                return False
            row.released = True
            row.closed_reason = LeaseClosedReason.RELEASED
            return True

    async def yield_lease(self, lease: ExecutionLease) -> bool:
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self._held(lease)
            if (
                row is None
                or row.released
                or row.yielded
                or row.finished
                or not row.expires_at > now
            ):
                return False
            row.yielded = True
            return True

    async def reclaim(self, lease: ExecutionLease, lease_ms: int) -> ExecutionLease | None:
        checked_positive_ms("lease_ms", lease_ms)
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self._held(lease)
            if (
                row is None
                or not row.yielded
                or row.released
                or row.finished
                or not row.expires_at > now
            ):
                return None
            row.lease_epoch += 1
            row.yielded = False
            row.expires_at = now + lease_ms
            return self._lease_of(row, now)

    async def finish(self, lease: ExecutionLease) -> bool:
        async with self.memory.atomic():
            row = self._held(lease)
            if row is None or row.released or row.finished:
                return False
            row.finished = True
            row.released = True
            row.closed_reason = LeaseClosedReason.FINISHED
            return True

    async def save_execution_id_if_absent(self, tenant_id: str, execution_id: str) -> bool:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        if execution_id in self.memory.execution_ids:
            return False
        self.memory.execution_ids.add(execution_id)
        return True


class InMemoryExecutionLeaseEventRepository(InMemoryStore, ExecutionLeaseEventRepository):
    """The lease log in an `InMemoryBackend`: events kept as saved, in save order."""

    def __init__(
        self,
        backend: InMemoryBackend,
        clock: StoreClock | Clock | None = None,
        application: ApplicationContext | None = None,
    ) -> None:
        # The clock is accepted for the uniform constructor only: events carry their time.
        self.memory, self.clock, self.application = checked_dependencies(
            self, backend, InMemoryBackend, clock, application, clock_kind="unused"
        )

    async def save(self, event: ExecutionLeaseEvent) -> None:
        checked_lease_event(event)
        kind = LeaseEventKind(event.kind)
        self.memory.lease_events.append(dataclasses.replace(event, kind=kind))

    async def list(self, tenant_id: str, execution_id: str) -> Sequence[ExecutionLeaseEvent]:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        return [
            event
            for event in self.memory.lease_events
            if event.tenant_id == tenant_id and event.execution_id == execution_id
        ]

    async def recent(self, limit: int) -> Sequence[ExecutionLeaseEvent]:
        checked_count("limit", limit)
        if limit == 0:
            return []
        return self.memory.lease_events[::-1][:limit]
