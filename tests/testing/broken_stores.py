"""Deliberately broken stores, each the in-memory store with one mistake a store author makes.

The suite must fail each of them on the rule it breaks (test_broken_sets.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from agboss_sql.contracts import (
    ExecutionLease,
    ExecutionLeaseEvent,
    FencedEffectKey,
    FencedEffectResult,
    LeaseCheck,
    LeaseHolder,
    LeaseState,
    checked_identifier,
    fenced_key_identity_of,
    remaining_of,
    replayed_from_of,
    stored_key_facts_of,
)
from agboss_sql.contracts.rules import LeaseClosedReason, checked_positive_ms
from agboss_sql.contracts.rules import checked_fenced_key as checked_key
from agboss_sql.memory import (
    InMemoryExecutionLeaseEventRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryOutboundCallRepository,
    InMemoryTransaction,
)
from agboss_sql.memory._fencing import fence, raise_mark, store_now
from agboss_sql.memory.backend import FencedResultRow, LeaseRow, json_text


def _taken_over_from(row: LeaseRow) -> LeaseHolder | None:
    if (not row.released and not row.yielded) or row.closed_reason == LeaseClosedReason.SUPERSEDED:
        return LeaseHolder(row.holder_instance_id, row.lease_epoch)
    return None


class CheckThenWriteLeases(InMemoryExecutionLeaseRepository):
    """Reads the lease, decides it is free, then writes the take in a second step (an await
    between them, without the lock): two instances can both take a free lease."""

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        checked_positive_ms("lease_ms", lease_ms)
        now = store_now(self.store_clock)
        key = (tenant_id, execution_id)
        row = self.memory.leases.get(key)
        if row is not None and (
            row.finished or not (row.released or row.yielded or row.expires_at <= now)
        ):
            return None
        await asyncio.sleep(0)  # the gap: a round trip between the check and the write
        epoch = 1 if row is None else row.lease_epoch + 1
        before = None if row is None else _taken_over_from(row)
        self.memory.leases[key] = LeaseRow(
            tenant_id, execution_id, self.instance_id, epoch, now + lease_ms
        )
        return ExecutionLease(tenant_id, execution_id, self.instance_id, epoch, lease_ms, before)


class LiveAtExpiryLeases(InMemoryExecutionLeaseRepository):
    """Treats a lease as live at its expiry instant (`expires_at >= now`): at that instant a
    takeover is refused and the holder's renewal accepted."""

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            key = (tenant_id, execution_id)
            row = self.memory.leases.get(key)
            if row is None:
                row = LeaseRow(tenant_id, execution_id, self.instance_id, 1, now + lease_ms)
                self.memory.leases[key] = row
                return self._lease_of(row, now)
            if row.finished or not (row.released or row.yielded or row.expires_at < now):
                return None
            before = _taken_over_from(row)
            row.holder_instance_id = self.instance_id
            row.lease_epoch += 1
            row.expires_at = now + lease_ms
            row.released = row.yielded = False
            row.closed_reason = None
            return self._lease_of(row, now, before)

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self._held(lease)
            if row is None or row.released or row.yielded or row.finished or row.expires_at < now:
                return None
            row.expires_at = max(row.expires_at, now + lease_ms)
            return remaining_of(row.expires_at, now)


class OldEndRenewalLeases(InMemoryExecutionLeaseRepository):
    """Renews from the old expiry (`expires_at + lease_ms`) instead of from now."""

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self._held(lease)
            if row is None or row.released or row.yielded or row.finished or row.expires_at <= now:
                return None
            row.expires_at = row.expires_at + lease_ms
            return remaining_of(row.expires_at, now)


class CallerClockLeases(InMemoryExecutionLeaseRepository):
    """Decides expiry by the calling instance's own clock (its seam.clock), not the store's."""

    def __init__(self, backend: Any, clock: Any, application: Any, own_clock: Any) -> None:
        super().__init__(backend, clock, application)
        self.own_clock = own_clock

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        async with self.memory.atomic():
            now = self.own_clock.now()
            key = (tenant_id, execution_id)
            row = self.memory.leases.get(key)
            if row is None:
                row = LeaseRow(tenant_id, execution_id, self.instance_id, 1, now + lease_ms)
                self.memory.leases[key] = row
                return self._lease_of(row, now)
            if row.finished or not (row.released or row.yielded or row.expires_at <= now):
                return None
            before = _taken_over_from(row)
            row.holder_instance_id = self.instance_id
            row.lease_epoch += 1
            row.expires_at = now + lease_ms
            row.released = row.yielded = False
            row.closed_reason = None
            return self._lease_of(row, now, before)


class _Autocommit:
    """A "transaction" whose rows are committed the moment they are written."""

    def __init__(self, store: InMemoryFencedEffectRepository) -> None:
        self.backend = store.memory

    def insert(self, row: Any) -> None:
        self.backend.business_rows.append(row)


class RowsOutsideTransactionEffects(InMemoryFencedEffectRepository):
    """Hands the work a connection of its own instead of the effect's transaction: the
    business rows commit whether or not the effect does."""

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Callable[[Any], Awaitable[Any]]
    ) -> FencedEffectResult[Any]:
        outside = _Autocommit(self)
        return await super().save_result_if_absent(key, lambda _tx: work(outside))


class UnlockedEffects(InMemoryFencedEffectRepository):
    """Looks the result up, runs the work, then stores the result, without holding anything
    across them; it declares the opt-out honestly."""

    lease_check: ClassVar[LeaseCheck] = LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Callable[[Any], Awaitable[Any]]
    ) -> FencedEffectResult[Any]:
        checked_key(key)
        identity = fenced_key_identity_of(key)
        async with self.memory.atomic():
            fence(self.memory, key, store_now(self.store_clock))
            stored = self.memory.fenced_results.get(identity)
        if stored is not None:
            return FencedEffectResult(
                json.loads(stored.value_json), True, replayed_from_of(key, stored.facts)
            )
        tx = InMemoryTransaction(self.memory)
        try:
            text = json_text(await work(tx))
        except BaseException:
            tx._rollback()
            raise
        row = FencedResultRow(text, stored_key_facts_of(key), key.token, 0)
        tx._stage(lambda: raise_mark(self.memory, key))
        tx._stage(lambda: self.memory.fenced_results.__setitem__(identity, row))
        tx._commit()
        return FencedEffectResult(json.loads(text), False, None)


class ReadThenCloseCalls(InMemoryOutboundCallRepository):
    """`lease_state_of` reads the lease, then closes it in a second step: a take in between
    has its new lease closed by a question about the old one."""

    async def lease_state_of(self, tenant_id: str, execution_id: str, token: int) -> LeaseState:
        now = store_now(self.store_clock)
        row = self.memory.leases.get((tenant_id, execution_id))
        if row is None or row.lease_epoch < token:
            return LeaseState.ABSENT
        if row.lease_epoch > token:
            return LeaseState.SUPERSEDED
        if row.finished:
            return LeaseState.FINISHED
        if row.released:
            return (
                LeaseState.SUPERSEDED
                if row.closed_reason == LeaseClosedReason.SUPERSEDED
                else LeaseState.RELEASED
            )
        if row.expires_at > now:
            return LeaseState.LIVE
        await asyncio.sleep(0)  # the gap: a round trip between the read and the close
        async with self.memory.atomic():
            row.released = True
            row.closed_reason = LeaseClosedReason.SUPERSEDED
        return LeaseState.SUPERSEDED


class LossyLeaseLog(InMemoryExecutionLeaseEventRepository):
    """Keeps the old row schema: no previous holder, no reason."""

    async def save(self, event: ExecutionLeaseEvent) -> None:
        await super().save(dataclasses.replace(event, taken_over_from=None, reason=None))


class StringKindLeaseLog(InMemoryExecutionLeaseEventRepository):
    """Reads the kind back as a plain text and the time as a float (what a careless row
    mapping returns)."""

    async def list(self, tenant_id: str, execution_id: str) -> Sequence[ExecutionLeaseEvent]:
        found = await super().list(tenant_id, execution_id)
        return [
            dataclasses.replace(e, kind=str(e.kind.value), at=float(e.at))  # type: ignore[arg-type]
            for e in found
        ]


class NoBackendEffects(InMemoryFencedEffectRepository):
    """Declares no backend."""

    backend: str | None = None


class OtherBackendCalls(InMemoryOutboundCallRepository):
    """Declares another backend than its leases'."""

    backend: str | None = "in-memory:billing"


class OptedOutEffects(InMemoryFencedEffectRepository):
    """A sound store that nevertheless declares the opt-out."""

    lease_check: ClassVar[LeaseCheck] = LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION


class OptedOutByParentEffects(OptedOutEffects):
    """Opted out through its parent class."""


class AtomicAgainEffects(OptedOutEffects):
    """Restates the atomic lease check under an opted-out parent."""

    lease_check: ClassVar[LeaseCheck] = LeaseCheck.ATOMIC


BROKEN: dict[str, dict[str, type[Any]]] = {
    "check-then-write leases": {"execution_lease": CheckThenWriteLeases},
    "live at expiry leases": {"execution_lease": LiveAtExpiryLeases},
    "old-end renewal leases": {"execution_lease": OldEndRenewalLeases},
    "rows outside the transaction": {"fenced_effect": RowsOutsideTransactionEffects},
    "read-then-close lease_state_of": {"outbound_call": ReadThenCloseCalls},
    "lossy lease log": {"execution_lease_event": LossyLeaseLog},
    "string-kind lease log": {"execution_lease_event": StringKindLeaseLog},
    "no-backend fenced effects": {"fenced_effect": NoBackendEffects},
    "other-backend outbound calls": {"outbound_call": OtherBackendCalls},
}
"""Each broken set, by what is wrong with it: the stores replacing the sound ones."""


class AnyHolderLeases(InMemoryExecutionLeaseRepository):
    """Finds the lease to move by its tenant and execution alone: any instance, at any
    epoch, moves whatever lease is there."""

    def _held(self, lease: ExecutionLease) -> LeaseRow | None:
        return self.memory.leases.get((lease.tenant_id, lease.execution_id))


class ReclaimAnyLiveLeases(InMemoryExecutionLeaseRepository):
    """Reclaims a live lease of its holder whether or not it was yielded."""

    async def reclaim(self, lease: ExecutionLease, lease_ms: int) -> ExecutionLease | None:
        row = self._held(lease)
        if row is not None and not row.released and not row.finished:
            row.yielded = True
        return await super().reclaim(lease, lease_ms)


class AnyLeaseMsLeases(InMemoryExecutionLeaseRepository):
    """Takes whatever `lease_ms` it is given (a bool, a float, zero) as a duration."""

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        return await super().acquire(tenant_id, execution_id, max(1, int(lease_ms)))
