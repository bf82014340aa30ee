"""`SqlOutboundCallRepository`: one send per key, moved by compare-and-set under the fence.

Every fenced method is one transaction on one pooled raw connection
(`SqlConnection.run`, `BEGIN IMMEDIATE` on SQLite) whose first statement is
the fence shared with the fenced effects (`_fence.FenceStatements.fence`: the
lease check and the mark raise in one conditional `UPDATE` that locks the lease
row), and whose second is the write:

- `save_if_absent`: PostgreSQL/SQLite insert the pending row with `ON CONFLICT
  DO NOTHING` (it waits for a concurrent inserter, so no unique violation) and
  read an existing row with a locking read only when nothing was inserted;
  MySQL/MariaDB read the row with a locking read first (which, absent, locks the
  gap: a concurrent inserter deadlocks and the transaction runs again) and
  insert when it is absent;
- `mark_pending`, `mark_completed`, `mark_failed`: a compare-and-set `UPDATE` on
  the attempt the caller read (status, attempt, owner); one row changed or not.

`lease_state_of` locks the other execution's lease row (`FOR UPDATE`; SQLite's
`BEGIN IMMEDIATE`), reading the store's time as a column of that same
statement, and closes an expired lease at the token in the same transaction.

Statements per call: `get` one. Fenced methods: BEGIN, fence, write, COMMIT = 4
(PostgreSQL/SQLite `save_if_absent` of an existing row: 5, with the read;
MySQL's: 5 when it inserts, with the read first). `lease_state_of`: BEGIN, locking
read, COMMIT = 3, or 4 when it closes the lease. A refusal sends the diagnosing
read and ends in ROLLBACK.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from agboss_sql.contracts.errors import CorruptStoredRowError
from agboss_sql.contracts.keys import (
    checked_identifier,
    fenced_key_identity_of,
    pending_outbound_call_of,
    replayed_from_of,
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
from agboss_sql.contracts.stores import ExecutionLeaseRepository, OutboundCallRepository
from agboss_sql.contracts.types import (
    AttemptRef,
    FencedEffectKey,
    JsonValue,
    LeaseState,
    OutboundCall,
    OutboundCallSaved,
    OutboundCallStatus,
    StepRef,
)
from agboss_sql.sql._base import FencedStore, dumps, identity_hash, loads
from agboss_sql.sql._fence import (
    fence_params,
    fenced,
    run_claiming,
    store_time_params,
)
from agboss_sql.sql.connection import Exec, SqlBuilder, Step
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import execution_leases, outbound_calls

C = outbound_calls
L = execution_leases
_ROW = (
    C.c.key_identity,
    C.c.business_identity,
    C.c.tenant_id,
    C.c.name,
    C.c.intent,
    C.c.status,
    C.c.attempt,
    C.c.attempt_owner,
    C.c.lease_execution_id,
    C.c.token,
    C.c.fingerprint,
    C.c.step_execution_id,
    C.c.step_idempotency_key,
    C.c.step_name,
    C.c.recorded_at,
    C.c.updated_at,
    C.c.response,
    C.c.error,
)
_INSERTED = (
    "identity_hash",
    "key_identity",
    "business_identity",
    "tenant_id",
    "name",
    "intent",
    "status",
    "attempt",
    "attempt_owner",
    "lease_execution_id",
    "token",
    "fingerprint",
    "step_execution_id",
    "step_idempotency_key",
    "step_name",
    "recorded_at",
    "updated_at",
)


class OutboundStatements:
    """The outbound call statements for one dialect and one kind of store time."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        _, now = b.now()
        this_call = C.c.identity_hash == sa.bindparam("identity_hash")
        self.insert_raises = b.capabilities.insert_if_absent_raises
        self.insert = ops.insert_if_absent(C, ["identity_hash"]).values(
            {name: sa.bindparam(name) for name in _INSERTED}
        )
        self.get = sa.select(*_ROW).where(this_call)
        self.get_locked = ops.for_update(self.get)
        expected = sa.and_(
            this_call,
            C.c.status == sa.bindparam("expected_status"),
            C.c.attempt == sa.bindparam("expected_attempt"),
            C.c.attempt_owner == sa.bindparam("expected_owner"),
        )
        self.mark_pending = (
            sa.update(C)
            .where(expected)
            .values(
                status=OutboundCallStatus.PENDING.value,
                attempt=C.c.attempt + 1,
                attempt_owner=sa.bindparam("owner"),
                response=sa.null(),
                error=sa.null(),
                updated_at=now,
            )
        )
        self.end = (
            sa.update(C)
            .where(expected, C.c.status == OutboundCallStatus.PENDING.value)
            .values(
                status=sa.bindparam("status"),
                response=sa.bindparam("response"),
                error=sa.bindparam("error"),
                updated_at=now,
            )
        )
        this_lease = sa.and_(
            L.c.tenant_id == sa.bindparam("tenant_id"),
            L.c.execution_id == sa.bindparam("execution_id"),
        )
        self.lock_lease = ops.for_update(
            sa.select(
                L.c.lease_epoch,
                L.c.released,
                L.c.finished,
                L.c.closed_reason,
                L.c.expires_at,
                now.label("now"),
            ).where(this_lease)
        )
        token = sa.bindparam("token", type_=sa.BigInteger)
        closed_at = sa.bindparam("closed_at", type_=sa.BigInteger)
        # Under the lock taken by `lock_lease`: the conditions restate what was read.
        self.close_lease = (
            sa.update(L)
            .where(
                this_lease,
                L.c.lease_epoch == token,
                L.c.released.is_(sa.false()),
                L.c.finished.is_(sa.false()),
                L.c.expires_at <= closed_at,
            )
            .values(
                released=sa.true(),
                closed_reason=LeaseClosedReason.SUPERSEDED.value,
                updated_at=closed_at,
            )
        )


def _call_of(row: Any) -> OutboundCall:
    (
        key_identity,
        business_identity,
        tenant_id,
        name,
        intent,
        status,
        attempt,
        attempt_owner,
        lease_execution_id,
        token,
        fingerprint,
        step_execution_id,
        step_key,
        step_name,
        recorded_at,
        updated_at,
        response,
        error,
    ) = row
    if not all(isinstance(part, str) and part for part in (step_execution_id, step_key, step_name)):
        raise CorruptStoredRowError(f"the outbound call {key_identity!r:.200} has no step")
    return OutboundCall(
        key_identity=key_identity,
        business_identity=business_identity,
        tenant_id=tenant_id,
        name=name,
        intent=loads(intent),
        status=OutboundCallStatus(status),
        attempt=int(attempt),
        attempt_owner=attempt_owner,
        lease_execution_id=lease_execution_id,
        token=int(token),
        fingerprint=fingerprint,
        step=StepRef(step_execution_id, step_key, step_name),
        recorded_at=int(recorded_at),
        updated_at=int(updated_at),
        response=loads(response),
        error=loads(error),
    )


def _facts_of(row: Any) -> dict[str, Any]:
    """What `replayed_from_of` reads of a stored row (`_ROW` order)."""
    return {
        "fingerprint": row[10],
        "step_execution_id": row[11],
        "step_idempotency_key": row[12],
        "step_name": row[13],
    }


class SqlOutboundCallRepository(FencedStore[OutboundStatements], OutboundCallRepository):
    """Outbound calls on SQL: every fenced method is one transaction whose first statement
    checks the lease and raises the scope's mark (locking the lease row), then writes the
    intent by insert-if-absent or compare-and-set."""

    lease_repository: ClassVar[type[ExecutionLeaseRepository] | None] = SqlExecutionLeaseRepository

    statements = OutboundStatements

    async def get(self, key: FencedEffectKey) -> OutboundCall | None:
        """The stored intent for the key, or `None` (one statement, no fence)."""
        checked_fenced_key(key)
        result = await self.connection.execute(
            self._sql.get, {"identity_hash": identity_hash(fenced_key_identity_of(key))}
        )
        row = result.first()
        return None if row is None else _call_of(row)

    async def save_if_absent(
        self, key: FencedEffectKey, intent: JsonValue, recorded_at: int
    ) -> OutboundCallSaved:
        """In one transaction, after the lease and mark check: insert the pending intent
        (`pending_outbound_call_of`) if no row has the key. The stored row and whether this
        call created it; under a business key, a row of another fingerprint is
        `IdempotencyKeyConflictError`."""
        checked_fenced_key(key)
        checked_time("recorded_at", recorded_at)
        intent_text = dumps(intent)
        call = pending_outbound_call_of(key, loads(intent_text), recorded_at)
        row_params = {
            "identity_hash": identity_hash(call.key_identity),
            "key_identity": call.key_identity,
            "business_identity": call.business_identity,
            "tenant_id": call.tenant_id,
            "name": call.name,
            "intent": intent_text,
            "status": call.status.value,
            "attempt": call.attempt,
            "attempt_owner": call.attempt_owner,
            "lease_execution_id": call.lease_execution_id,
            "token": call.token,
            "fingerprint": call.fingerprint,
            "step_execution_id": call.step.execution_id,
            "step_idempotency_key": call.step.idempotency_key,
            "step_name": call.step.name,
            "recorded_at": call.recorded_at,
            "updated_at": call.updated_at,
        }
        fence = self._fence
        sql = self._sql

        def step() -> Step[OutboundCallSaved]:
            params = fence_params(key, self.store_clock)
            yield from fenced(fence, key, params)
            if sql.insert_raises:
                row = (yield Exec(sql.get_locked, row_params)).first()
                if row is None:
                    yield Exec(sql.insert, row_params)
                    return OutboundCallSaved(call, True)
            else:
                if (yield Exec(sql.insert, row_params)).rowcount == 1:
                    return OutboundCallSaved(call, True)
                row = (yield Exec(sql.get_locked, row_params)).first()
                if row is None:
                    raise CorruptStoredRowError(
                        f"the outbound call {call.key_identity!r:.200} vanished"
                    )
            # Under a business key, other content is a conflict, never the old intent.
            replayed_from_of(key, _facts_of(row))
            return OutboundCallSaved(_call_of(row), False)

        return await run_claiming(self.connection, step)

    async def mark_pending(self, key: FencedEffectKey, expected: AttemptRef, owner: str) -> bool:
        """In one transaction, after the lease and mark check: when the row is still at
        `expected` (status, attempt, owner), claim the next attempt for `owner`, status
        pending, response and error cleared. True when one row changed."""
        checked_fenced_key(key)
        checked_attempt(expected)
        params = {
            "identity_hash": identity_hash(fenced_key_identity_of(key)),
            "expected_status": OutboundCallStatus(expected.status).value,
            "expected_attempt": expected.attempt,
            "expected_owner": expected.attempt_owner,
            "owner": checked_attempt_owner(owner),
        }
        return await self._fenced_update(key, self._sql.mark_pending, params)

    async def mark_completed(
        self, key: FencedEffectKey, attempt: AttemptRef, response: JsonValue
    ) -> bool:
        """In one transaction, after the lease and mark check: complete the pending
        `attempt` with `response` while it is still the row's attempt and owner. True when
        one row changed."""
        return await self._end(key, attempt, OutboundCallStatus.COMPLETED, dumps(response), None)

    async def mark_failed(
        self, key: FencedEffectKey, attempt: AttemptRef, error: JsonValue
    ) -> bool:
        """As `mark_completed`, ending the attempt as failed with `error`."""
        return await self._end(key, attempt, OutboundCallStatus.FAILED, None, dumps(error))

    async def _end(
        self,
        key: FencedEffectKey,
        attempt: AttemptRef,
        status: OutboundCallStatus,
        response: str | None,
        error: str | None,
    ) -> bool:
        checked_fenced_key(key)
        checked_attempt(attempt)
        params = {
            "identity_hash": identity_hash(fenced_key_identity_of(key)),
            "expected_status": OutboundCallStatus(attempt.status).value,
            "expected_attempt": attempt.attempt,
            "expected_owner": attempt.attempt_owner,
            "status": status.value,
            "response": response,
            "error": error,
        }
        return await self._fenced_update(key, self._sql.end, params)

    async def _fenced_update(
        self, key: FencedEffectKey, statement: Any, params: dict[str, Any]
    ) -> bool:
        fence = self._fence

        def step() -> Step[bool]:
            fenced_params = fence_params(key, self.store_clock)
            yield from fenced(fence, key, fenced_params)
            return (yield Exec(statement, {**params, **fenced_params})).rowcount == 1

        return await self.connection.run(step, transaction=True)

    async def lease_state_of(self, tenant_id: str, execution_id: str, token: int) -> LeaseState:
        """In one transaction: lock the execution's lease row and, if it expired at `token`
        (not released or finished), close it (released, superseded). The lease's state at
        that token: ABSENT when there is no lease or `token` was never granted (the epoch is
        below it), SUPERSEDED when a later epoch was granted or the lease at `token` was
        closed after its expiry (now or before), FINISHED, RELEASED (by its holder), LIVE."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        checked_token(token)
        sql = self._sql

        def step() -> Step[LeaseState]:
            params = store_time_params(
                self.store_clock, tenant_id=tenant_id, execution_id=execution_id, token=token
            )
            row = (yield Exec(sql.lock_lease, params)).first()
            if row is None:
                return LeaseState.ABSENT
            epoch, released, finished, closed_reason, expires_at, now = row
            found = lease_state_at(
                token,
                epoch=int(epoch),
                released=bool(released),
                finished=bool(finished),
                closed_reason=closed_reason,
                expires_at=expires_at,
                now=now,
            )
            if found.close:
                # Closed in the same transaction, under the lock: a late renewal waits for
                # the commit and then finds the lease released.
                closed = yield Exec(sql.close_lease, {**params, "closed_at": int(now)})
                if closed.rowcount != 1:
                    raise CorruptStoredRowError(
                        f"the lease of {execution_id!r} moved under its lock"
                    )
            return found.state

        return await self.connection.run(step, transaction=True)
