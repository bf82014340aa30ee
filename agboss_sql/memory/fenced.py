"""In-memory fenced effects and outbound calls, fenced by the leases of the same backend."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import ClassVar, TypeVar

from agboss_sql.contracts.keys import (
    checked_identifier,
    fenced_key_identity_of,
    pending_outbound_call_of,
    replayed_from_of,
    stored_key_facts_of,
)
from agboss_sql.contracts.rules import (
    LeaseClosedReason,
    checked_attempt,
    checked_attempt_owner,
    checked_fenced_key,
    checked_time,
    checked_token,
    lease_state_at,
)
from agboss_sql.contracts.stores import FencedEffectRepository, OutboundCallRepository
from agboss_sql.contracts.types import (
    AttemptRef,
    FencedEffectKey,
    FencedEffectResult,
    JsonValue,
    LeaseState,
    OutboundCall,
    OutboundCallSaved,
    OutboundCallStatus,
    StoredKeyFacts,
)
from agboss_sql.memory._fencing import StoreClockStore, fence, raise_mark, store_now
from agboss_sql.memory.backend import (
    FencedResultRow,
    InMemoryTransaction,
    json_copy,
    json_text,
)
from agboss_sql.memory.leases import InMemoryExecutionLeaseRepository

T = TypeVar("T")


class InMemoryFencedEffectRepository(StoreClockStore, FencedEffectRepository[InMemoryTransaction]):
    """Fenced effects in an `InMemoryBackend`: the lease check, the mark, the stored result
    and the work's business rows (staged on an `InMemoryTransaction`) in one atomic step."""

    lease_repository: ClassVar[type[InMemoryExecutionLeaseRepository] | None] = (
        InMemoryExecutionLeaseRepository
    )

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Callable[[InMemoryTransaction], Awaitable[T]]
    ) -> FencedEffectResult[T]:
        checked_fenced_key(key)
        identity = fenced_key_identity_of(key)
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            must_raise_mark = fence(self.memory, key, now)
            stored = self.memory.fenced_results.get(identity)
            if stored is not None:
                replayed_from = replayed_from_of(key, stored.facts)
                if must_raise_mark:
                    raise_mark(self.memory, key)
                replayed: T = json.loads(stored.value_json)
                return FencedEffectResult(replayed, True, replayed_from)
            tx = InMemoryTransaction(self.memory)
            try:
                # Stored as a JSON column would store it: a value JSON refuses fails the effect.
                text = json_text(await work(tx))
                row = FencedResultRow(text, stored_key_facts_of(key), key.token, now)
                if must_raise_mark:
                    tx._stage(lambda: raise_mark(self.memory, key))
                tx._stage(lambda: self.memory.fenced_results.__setitem__(identity, row))
                tx._commit()
            except BaseException:
                tx._rollback()
                raise
            # The stored form, so the first answer equals every replay's.
            stored_value: T = json.loads(text)
            return FencedEffectResult(stored_value, False, None)

    async def get_result(self, key: FencedEffectKey) -> FencedEffectResult[JsonValue] | None:
        checked_fenced_key(key)
        # No `atomic()`: a read waits for no write, and one read of a committed row is
        # atomic on its own (a write in flight has staged its row, not stored it).
        stored = self.memory.fenced_results.get(fenced_key_identity_of(key))
        if stored is None:
            return None
        replayed_from = replayed_from_of(key, stored.facts)
        return FencedEffectResult(json.loads(stored.value_json), True, replayed_from)


def _call_out(call: OutboundCall) -> OutboundCall:
    """A copy the caller may change without changing the stored row."""
    return dataclasses.replace(
        call,
        intent=json_copy(call.intent),
        response=json_copy(call.response),
        error=json_copy(call.error),
    )


class InMemoryOutboundCallRepository(StoreClockStore, OutboundCallRepository):
    """Outbound calls in an `InMemoryBackend`: every fenced method checks the lease and the
    scope's mark in the same step as its read or write of the intent.

    Under a business key, a row recorded with another fingerprint is
    `IdempotencyKeyConflictError`, never the other intent. A claimed attempt starts with no
    response and no error. `lease_state_of` answers `ABSENT` for a token never granted
    (above the lease's epoch) and `LIVE` for a yielded lease that has not expired (its
    holder gave it up, but nobody has taken it and it has not run out).
    """

    lease_repository: ClassVar[type[InMemoryExecutionLeaseRepository] | None] = (
        InMemoryExecutionLeaseRepository
    )

    def _fenced(self, key: FencedEffectKey) -> int:
        """The lease and mark check, the mark raised; the store's time of the step."""
        now = store_now(self.store_clock)
        if fence(self.memory, key, now):
            raise_mark(self.memory, key)
        return now

    async def get(self, key: FencedEffectKey) -> OutboundCall | None:
        checked_fenced_key(key)
        call = self.memory.outbound_calls.get(fenced_key_identity_of(key))
        return None if call is None else _call_out(call)

    async def save_if_absent(
        self, key: FencedEffectKey, intent: JsonValue, recorded_at: int
    ) -> OutboundCallSaved:
        checked_fenced_key(key)
        checked_time("recorded_at", recorded_at)
        identity = fenced_key_identity_of(key)
        intent = json_copy(intent)
        async with self.memory.atomic():
            self._fenced(key)
            existing = self.memory.outbound_calls.get(identity)
            if existing is not None:
                # Under a business key, other content is a conflict, never the old intent.
                replayed_from_of(key, StoredKeyFacts(existing.fingerprint, existing.step))
                return OutboundCallSaved(_call_out(existing), False)
            call = pending_outbound_call_of(key, intent, recorded_at)
            self.memory.outbound_calls[identity] = call
            return OutboundCallSaved(_call_out(call), True)

    async def mark_pending(self, key: FencedEffectKey, expected: AttemptRef, owner: str) -> bool:
        checked_fenced_key(key)
        checked_attempt(expected)
        checked_attempt_owner(owner)
        identity = fenced_key_identity_of(key)
        async with self.memory.atomic():
            now = self._fenced(key)
            call = self.memory.outbound_calls.get(identity)
            if call is None or call.attempt_ref != expected:
                return False
            self.memory.outbound_calls[identity] = dataclasses.replace(
                call,
                status=OutboundCallStatus.PENDING,
                attempt=call.attempt + 1,
                attempt_owner=owner,
                updated_at=now,
                response=None,
                error=None,
            )
            return True

    async def _end(
        self,
        key: FencedEffectKey,
        attempt: AttemptRef,
        status: OutboundCallStatus,
        response: JsonValue,
        error: JsonValue,
    ) -> bool:
        checked_fenced_key(key)
        checked_attempt(attempt)
        identity = fenced_key_identity_of(key)
        response = json_copy(response)
        error = json_copy(error)
        async with self.memory.atomic():
            now = self._fenced(key)
            call = self.memory.outbound_calls.get(identity)
            if (
                call is None
                or call.status is not OutboundCallStatus.PENDING
                or call.attempt_ref != attempt
            ):
                return False
            self.memory.outbound_calls[identity] = dataclasses.replace(
                call, status=status, updated_at=now, response=response, error=error
            )
            return True

    async def mark_completed(
        self, key: FencedEffectKey, attempt: AttemptRef, response: JsonValue
    ) -> bool:
        return await self._end(key, attempt, OutboundCallStatus.COMPLETED, response, None)

    async def mark_failed(
        self, key: FencedEffectKey, attempt: AttemptRef, error: JsonValue
    ) -> bool:
        return await self._end(key, attempt, OutboundCallStatus.FAILED, None, error)

    async def lease_state_of(self, tenant_id: str, execution_id: str, token: int) -> LeaseState:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        checked_token(token)
        async with self.memory.atomic():
            now = store_now(self.store_clock)
            row = self.memory.leases.get((tenant_id, execution_id))
            if row is None:
                return LeaseState.ABSENT
            found = lease_state_at(
                token,
                epoch=row.lease_epoch,
                released=row.released,
                finished=row.finished,
                closed_reason=row.closed_reason,
                expires_at=row.expires_at,
                now=now,
            )
            if found.close:
                # Closed in the same step, so a late renewal can no longer revive it.
                row.released = True
                row.closed_reason = LeaseClosedReason.SUPERSEDED
            return found.state
