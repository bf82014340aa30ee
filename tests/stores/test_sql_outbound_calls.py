"""`SqlOutboundCallRepository` keeps every promise of its contract (docs/contracts.md) on the database under test.

Every fenced method is checked against every way a lease ends; the
compare-and-set moves and `lease_state_of` are raced from separate
`SqlConnection`s (separate instances).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from support.capabilities import insert_if_absent_raises

from agboss_sql.contracts import (
    ApplicationContext,
    AttemptRef,
    ExecutionContext,
    ExecutionFencedError,
    ExecutionLease,
    FencedEffectKey,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
    InvalidIdentifierError,
    LeaseHolder,
    LeaseState,
    OutboundCall,
    OutboundCallSaved,
    OutboundCallStatus,
    StepRef,
    StoreClock,
    VirtualClock,
    fenced_effect_key_of,
    pending_outbound_call_of,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository
from agboss_sql.sql.schema import execution_leases, outbound_calls

START = 1_700_000_000_000
LEASE_MS = 30_000
TENANT = "tenant-1"
INTENT = {"amount": 1250, "currency": "EUR", "to": "acct-7", "note": "ünïcödé"}
PENDING = OutboundCallStatus.PENDING


class Cluster:
    """Lease and outbound-call stores of several instances on the database under test."""

    def __init__(self, sql: SqlConnection, clock: VirtualClock) -> None:
        self.sql = sql
        self.clock = clock
        self.store_clock = StoreClock(clock)

    def leases(
        self,
        instance: int = 1,
        connection: SqlConnection | None = None,
        store_clock: StoreClock | None = None,
    ) -> SqlExecutionLeaseRepository:
        return SqlExecutionLeaseRepository(
            connection or self.sql,
            store_clock or self.store_clock,
            ApplicationContext(f"instance-{instance}"),
        )

    def calls(
        self,
        instance: int = 1,
        connection: SqlConnection | None = None,
        store_clock: StoreClock | None = None,
    ) -> SqlOutboundCallRepository:
        return SqlOutboundCallRepository(
            connection or self.sql,
            store_clock or self.store_clock,
            ApplicationContext(f"instance-{instance}"),
        )

    async def acquire(self, instance: int = 1, execution: str = "tree-1") -> ExecutionLease:
        lease = await self.leases(instance).acquire(TENANT, execution, LEASE_MS)
        assert lease is not None
        return lease

    async def lease_row(self, execution: str = "tree-1") -> tuple[Any, ...] | None:
        L = execution_leases
        row = (
            await self.sql.execute(
                sa.select(L.c.lease_epoch, L.c.released, L.c.closed_reason, L.c.fence_token).where(
                    L.c.tenant_id == TENANT, L.c.execution_id == execution
                )
            )
        ).first()
        if row is None:
            return None
        epoch, released, closed_reason, mark = row
        return int(epoch), bool(released), closed_reason, int(mark)

    async def mark(self, execution: str = "tree-1") -> int | None:
        row = await self.lease_row(execution)
        return None if row is None else row[3]

    async def call_count(self) -> int:
        result = await self.sql.execute(sa.select(sa.func.count()).select_from(outbound_calls))
        return int(result.scalar() or 0)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


@pytest.fixture
def cluster(sql: SqlConnection, clock: VirtualClock) -> Cluster:
    return Cluster(sql, clock)


def key_of(
    lease: ExecutionLease,
    name: str = "pay",
    *,
    step_key: str = "step-1",
    business_key: str | None = None,
    fingerprint: str | None = None,
) -> FencedEffectKey:
    ctx = ExecutionContext(
        tenant_id=lease.tenant_id,
        root_execution_id=lease.execution_id,
        execution_id=lease.execution_id,
        lease=lease,
        step=StepRef(lease.execution_id, step_key, "pay-step"),
    )
    return fenced_effect_key_of(ctx, name, business_key=business_key, fingerprint=fingerprint)


def statements_of(sql: SqlConnection) -> tuple[list[str], Callable[[], None]]:
    sent: list[str] = []

    def listen(statement: str, _params: Any) -> None:
        text = " ".join(statement.split()).upper()
        if text.startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            sent.append(text.split()[0])
        elif "UPDATE AGBOSS_EXECUTION_LEASES" in text:
            sent.append("fence" if "FENCE_TOKEN" in text.split(" WHERE ")[0] else "close")
        elif "FROM AGBOSS_EXECUTION_LEASES" in text:
            # The diagnosis reads the yielded flag; the locking read of lease_state_of does not.
            sent.append("diagnose" if "YIELDED" in text else "lock")
        elif "INSERT INTO AGBOSS_OUTBOUND_CALLS" in text:
            sent.append("insert")
        elif "UPDATE AGBOSS_OUTBOUND_CALLS" in text:
            sent.append("cas")
        elif "FROM AGBOSS_OUTBOUND_CALLS" in text:
            sent.append("read")
        else:
            sent.append(text[:40])

    return sent, sql.add_statement_listener(listen)


# save_if_absent and get


async def test_save_if_absent_records_the_pending_intent_once(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    calls = cluster.calls(1)
    saved = await calls.save_if_absent(key, INTENT, START + 5)
    expected = pending_outbound_call_of(key, INTENT, START + 5)
    assert saved == OutboundCallSaved(expected, True)
    assert await calls.get(key) == expected
    assert await cluster.mark() == 1
    again = await cluster.calls(2).save_if_absent(key, {"other": "intent"}, START + 9)
    # The first record stays: its intent, its time, its owner.
    assert again == OutboundCallSaved(expected, False)
    assert await cluster.call_count() == 1


@pytest.mark.parametrize(
    "intent", [None, 0, "", [], {}, "null", [1, "x", {"y": None}], {"deep": {"a": [1.5, True]}}]
)
async def test_json_values_are_read_back_exactly(cluster: Cluster, intent: Any) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    calls = cluster.calls(1)
    saved = await calls.save_if_absent(key, intent, START)
    assert saved.call.intent == intent
    call = await calls.get(key)
    assert call is not None and call.intent == intent
    ref = call.attempt_ref
    assert await calls.mark_pending(key, ref, "owner-2")
    claimed = AttemptRef(PENDING, 1, "owner-2")
    assert await calls.mark_failed(key, claimed, intent)
    failed = await calls.get(key)
    assert failed is not None
    assert (failed.status, failed.error, failed.response) == (
        OutboundCallStatus.FAILED,
        intent,
        None,
    )


async def test_get_of_an_unknown_key_is_none_and_needs_no_lease(cluster: Cluster) -> None:
    ghost = ExecutionLease(TENANT, "tree-9", "instance-1", 1, LEASE_MS)
    sent, remove = statements_of(cluster.sql)
    assert await cluster.calls(1).get(key_of(ghost)) is None
    remove()
    assert sent == ["read"]


async def test_a_business_key_is_one_call_across_executions(cluster: Cluster) -> None:
    first = await cluster.acquire(1, "tree-1")
    second = await cluster.acquire(2, "tree-2")
    key_1 = key_of(first, business_key="order-7", fingerprint="f")
    key_2 = key_of(second, business_key="order-7", fingerprint="f", step_key="other")
    saved = await cluster.calls(1).save_if_absent(key_1, INTENT, START)
    again = await cluster.calls(2).save_if_absent(key_2, {"x": 1}, START + 1)
    assert again == OutboundCallSaved(saved.call, False)
    assert again.call.step == key_1.step and again.call.lease_execution_id == "tree-1"
    assert await cluster.calls(2).get(key_2) == saved.call
    assert (await cluster.mark("tree-1"), await cluster.mark("tree-2")) == (1, 1)


async def test_another_fingerprint_under_a_business_key_is_a_conflict(cluster: Cluster) -> None:
    first = await cluster.acquire(1, "tree-1")
    second = await cluster.acquire(2, "tree-2")
    await cluster.calls(1).save_if_absent(
        key_of(first, business_key="order-7", fingerprint="f1"), INTENT, START
    )
    with pytest.raises(IdempotencyKeyConflictError):
        await cluster.calls(2).save_if_absent(
            key_of(second, business_key="order-7", fingerprint="f2"), INTENT, START
        )
    # Refused in the same transaction as the mark raise: rolled back with it.
    assert await cluster.mark("tree-2") == 0
    assert await cluster.call_count() == 1


async def test_ten_executions_recording_one_business_key_create_it_once(
    cluster: Cluster, new_connection: Callable[[], SqlConnection]
) -> None:
    leases = [await cluster.acquire(i, f"tree-{i}") for i in range(10)]
    keys = [key_of(lease, business_key="order-1", fingerprint="f") for lease in leases]
    stores = [cluster.calls(i, new_connection()) for i in range(10)]
    saved = await asyncio.gather(
        *(
            s.save_if_absent(k, {"by": i}, START)
            for i, (s, k) in enumerate(zip(stores, keys, strict=True))
        )
    )
    created = [s for s in saved if s.created]
    assert len(created) == 1
    assert all(s.call == created[0].call for s in saved)
    assert await cluster.call_count() == 1


async def test_ten_concurrent_records_of_one_step_create_it_once(
    cluster: Cluster, new_connection: Callable[[], SqlConnection]
) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    stores = [cluster.calls(i, new_connection()) for i in range(10)]
    saved = await asyncio.gather(*(s.save_if_absent(key, INTENT, START) for s in stores))
    assert [s.created for s in saved].count(True) == 1
    assert await cluster.call_count() == 1


# compare-and-set moves


async def test_an_attempt_is_claimed_once_and_ended_once(
    cluster: Cluster, clock: VirtualClock
) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    calls = cluster.calls(1)
    saved = await calls.save_if_absent(key, INTENT, START)
    first_ref = saved.call.attempt_ref
    assert first_ref == AttemptRef(PENDING, 0, saved.call.attempt_owner)
    await clock.advance(10)
    assert await calls.mark_pending(key, first_ref, "sender-1") is True
    assert await calls.mark_pending(key, first_ref, "sender-2") is False
    claimed = await calls.get(key)
    assert claimed is not None
    assert claimed.attempt_ref == AttemptRef(PENDING, 1, "sender-1")
    assert claimed.updated_at == START + 10 and claimed.recorded_at == START
    await clock.advance(10)
    assert await calls.mark_completed(key, claimed.attempt_ref, {"id": "pay_1"}) is True
    assert await calls.mark_completed(key, claimed.attempt_ref, {"id": "pay_2"}) is False
    assert await calls.mark_failed(key, claimed.attempt_ref, {"e": 1}) is False
    done = await calls.get(key)
    assert done == dataclasses.replace(
        claimed,
        status=OutboundCallStatus.COMPLETED,
        response={"id": "pay_1"},
        updated_at=START + 20,
    )


async def test_a_failed_attempt_is_claimed_again_and_its_error_cleared(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    calls = cluster.calls(1)
    saved = await calls.save_if_absent(key, INTENT, START)
    assert await calls.mark_pending(key, saved.call.attempt_ref, "a")
    assert await calls.mark_failed(key, AttemptRef(PENDING, 1, "a"), {"status": 503})
    failed = await calls.get(key)
    assert failed is not None and failed.error == {"status": 503}
    assert failed.attempt_ref == AttemptRef(OutboundCallStatus.FAILED, 1, "a")
    assert await calls.mark_pending(key, failed.attempt_ref, "b")
    again = await calls.get(key)
    assert again is not None
    assert (again.attempt_ref, again.error, again.response) == (
        AttemptRef(PENDING, 2, "b"),
        None,
        None,
    )


@pytest.mark.parametrize(
    "wrong",
    [
        AttemptRef(PENDING, 2, "a"),
        AttemptRef(PENDING, 0, "a"),
        AttemptRef(PENDING, 1, "b"),
        AttemptRef(OutboundCallStatus.COMPLETED, 1, "a"),
        AttemptRef(OutboundCallStatus.FAILED, 1, "a"),
    ],
)
async def test_an_end_compares_the_attempt_its_owner_and_pending(
    cluster: Cluster, wrong: AttemptRef
) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    calls = cluster.calls(1)
    saved = await calls.save_if_absent(key, INTENT, START)
    assert await calls.mark_pending(key, saved.call.attempt_ref, "a")
    before = await calls.get(key)
    assert await calls.mark_completed(key, wrong, {"ok": True}) is False
    assert await calls.mark_failed(key, wrong, {"ok": False}) is False
    assert await calls.mark_pending(key, wrong, "c") is False
    assert await calls.get(key) == before


async def test_moves_of_an_unknown_call_change_nothing(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    calls = cluster.calls(1)
    ref = AttemptRef(PENDING, 0, "a")
    assert await calls.mark_pending(key, ref, "b") is False
    assert await calls.mark_completed(key, ref, None) is False
    assert await calls.mark_failed(key, ref, None) is False
    assert await cluster.call_count() == 0


async def test_two_instances_claiming_one_attempt_one_wins(
    cluster: Cluster, new_connection: Callable[[], SqlConnection]
) -> None:
    for round_ in range(10):
        one = await cluster.acquire(1, f"a-{round_}")
        two = await cluster.acquire(2, f"b-{round_}")
        key_1 = key_of(one, business_key=f"order-{round_}", fingerprint="f")
        key_2 = key_of(two, business_key=f"order-{round_}", fingerprint="f")
        saved = await cluster.calls(1).save_if_absent(key_1, INTENT, START)
        expected = saved.call.attempt_ref
        won = await asyncio.gather(
            cluster.calls(1, new_connection()).mark_pending(key_1, expected, "sender-1"),
            cluster.calls(2, new_connection()).mark_pending(key_2, expected, "sender-2"),
        )
        assert sorted(won) == [False, True]
        call = await cluster.calls(1).get(key_1)
        assert call is not None and call.attempt == 1
        assert call.attempt_owner == ("sender-1" if won[0] else "sender-2")


async def test_ten_claims_of_one_attempt_under_one_lease_one_wins(
    cluster: Cluster, new_connection: Callable[[], SqlConnection]
) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    saved = await cluster.calls(1).save_if_absent(key, INTENT, START)
    stores = [cluster.calls(i, new_connection()) for i in range(10)]
    won = await asyncio.gather(
        *(s.mark_pending(key, saved.call.attempt_ref, f"sender-{i}") for i, s in enumerate(stores))
    )
    assert won.count(True) == 1
    call = await cluster.calls(1).get(key)
    assert call is not None and call.attempt == 1
    assert call.attempt_owner == f"sender-{won.index(True)}"


async def test_an_ending_racing_a_newer_claim_one_wins(
    cluster: Cluster, new_connection: Callable[[], SqlConnection]
) -> None:
    for round_ in range(10):
        one = await cluster.acquire(1, f"a-{round_}")
        two = await cluster.acquire(2, f"b-{round_}")
        key_1 = key_of(one, business_key=f"order-{round_}", fingerprint="f")
        key_2 = key_of(two, business_key=f"order-{round_}", fingerprint="f")
        saved = await cluster.calls(1).save_if_absent(key_1, INTENT, START)
        assert await cluster.calls(1).mark_pending(key_1, saved.call.attempt_ref, "sender-1")
        sending = AttemptRef(PENDING, 1, "sender-1")
        ended, reclaimed = await asyncio.gather(
            cluster.calls(1, new_connection()).mark_completed(key_1, sending, {"id": 1}),
            cluster.calls(2, new_connection()).mark_pending(key_2, sending, "sender-2"),
        )
        assert ended != reclaimed
        call = await cluster.calls(1).get(key_1)
        assert call is not None
        if ended:
            assert (call.status, call.attempt) == (OutboundCallStatus.COMPLETED, 1)
        else:
            assert call.attempt_ref == AttemptRef(PENDING, 2, "sender-2")


# the fence on every fenced method


async def _saved(cluster: Cluster, lease: ExecutionLease) -> OutboundCall:
    return (await cluster.calls(1).save_if_absent(key_of(lease), INTENT, START)).call


FENCED: dict[
    str, Callable[[SqlOutboundCallRepository, FencedEffectKey, OutboundCall], Awaitable[Any]]
] = {
    "save_if_absent": lambda calls, key, call: calls.save_if_absent(key, INTENT, START),
    "mark_pending": lambda calls, key, call: calls.mark_pending(key, call.attempt_ref, "late"),
    "mark_completed": lambda calls, key, call: calls.mark_completed(
        key, call.attempt_ref, {"late": 1}
    ),
    "mark_failed": lambda calls, key, call: calls.mark_failed(key, call.attempt_ref, {"late": 1}),
}


async def _end_lease(
    cluster: Cluster, clock: VirtualClock, lease: ExecutionLease, how: str
) -> None:
    leases = cluster.leases(1)
    if how == "superseded":
        await clock.advance(LEASE_MS)
        await cluster.acquire(2)
    elif how == "expired":
        await clock.advance(LEASE_MS)
    elif how == "closed":
        await clock.advance(LEASE_MS)
        assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    elif how == "yielded":
        assert await leases.yield_lease(lease)
    else:
        end = {"released": leases.release, "finished": leases.finish}[how]
        assert await end(lease)


@pytest.mark.parametrize("method", list(FENCED))
@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("superseded", "superseded"),
        ("expired", "expired"),
        ("closed", "superseded"),
        ("released", "released"),
        ("yielded", "yielded"),
        ("finished", "finished"),
    ],
)
async def test_every_fenced_method_refuses_an_ended_lease_and_writes_nothing(
    cluster: Cluster, clock: VirtualClock, method: str, how: str, reason: str
) -> None:
    lease = await cluster.acquire()
    saved = await _saved(cluster, lease)
    assert await cluster.calls(1).mark_pending(key_of(lease), saved.attempt_ref, "sender")
    # The moves below would succeed on this row but for the fence.
    call = await cluster.calls(1).get(key_of(lease))
    assert call is not None
    await _end_lease(cluster, clock, lease, how)
    # A new step's record (save) or the recorded one (moves): none may land.
    key = key_of(lease, step_key="step-2") if method == "save_if_absent" else key_of(lease)
    mark_before = await cluster.mark()
    with pytest.raises(ExecutionFencedError) as refused:
        await FENCED[method](cluster.calls(1), key, call)
    assert (refused.value.reason, refused.value.token, refused.value.scope_key) == (
        reason,
        1,
        key.scope_key,
    )
    assert await cluster.calls(1).get(key_of(lease)) == call
    assert await cluster.calls(1).get(key_of(lease, step_key="step-2")) is None
    assert await cluster.mark() == mark_before


@pytest.mark.parametrize("method", list(FENCED))
async def test_every_fenced_method_refuses_an_absent_or_ungranted_lease(
    cluster: Cluster, method: str
) -> None:
    ghost = ExecutionLease(TENANT, "tree-9", "instance-1", 1, LEASE_MS)
    call = pending_outbound_call_of(key_of(ghost), INTENT, START)
    with pytest.raises(ExecutionFencedError) as refused:
        await FENCED[method](cluster.calls(1), key_of(ghost), call)
    assert refused.value.reason == "lease-absent"
    lease = await cluster.acquire()
    ahead = dataclasses.replace(lease, lease_epoch=3)
    with pytest.raises(ExecutionFencedError) as refused:
        await FENCED[method](cluster.calls(1), key_of(ahead), call)
    assert refused.value.reason == "token-not-granted"
    assert await cluster.call_count() == 0


@pytest.mark.parametrize("method", list(FENCED))
@pytest.mark.parametrize(("offset", "allowed"), [(-1, True), (0, False), (1, False)])
async def test_every_fenced_method_at_the_expiry_boundary(
    cluster: Cluster, clock: VirtualClock, method: str, offset: int, allowed: bool
) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    if method == "save_if_absent":
        call = pending_outbound_call_of(key, INTENT, START)
    else:
        call = await _saved(cluster, lease)
        if method != "mark_pending":
            assert await cluster.calls(1).mark_pending(key, call.attempt_ref, "s")
            call = dataclasses.replace(call, attempt=1, attempt_owner="s")
    before = await cluster.calls(1).get(key)
    await clock.advance(LEASE_MS + offset)
    if allowed:
        answer = await FENCED[method](cluster.calls(1), key, call)
        assert answer == OutboundCallSaved(call, True) if method == "save_if_absent" else answer
        assert await cluster.calls(1).get(key) != before
    else:
        with pytest.raises(ExecutionFencedError) as refused:
            await FENCED[method](cluster.calls(1), key, call)
        assert refused.value.reason == "expired"
        assert await cluster.calls(1).get(key) == before


async def test_a_mark_above_the_token_refuses_every_fenced_method(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    call = await _saved(cluster, lease)
    await cluster.sql.execute(sa.update(execution_leases).values(fence_token=5))
    for method in FENCED:
        with pytest.raises(ExecutionFencedError) as refused:
            await FENCED[method](cluster.calls(1), key_of(lease, step_key="s2"), call)
        assert refused.value.reason == "mark-above-token"
    assert await cluster.mark() == 5


# the key's rules, before any statement


@pytest.mark.parametrize(
    "change",
    [
        {"name": "has space"},
        {"name": ""},
        {"business_key": " "},
        {"business_key": "a\tb"},
        {"tenant_id": ""},
        {"token": 1.0},
    ],
)
async def test_a_bad_key_is_refused_before_any_statement(
    cluster: Cluster, change: dict[str, Any]
) -> None:
    lease = await cluster.acquire()
    key = dataclasses.replace(key_of(lease), **change)
    call = pending_outbound_call_of(key_of(lease), INTENT, START)
    calls = cluster.calls(1)
    sent, remove = statements_of(cluster.sql)
    errors = (
        InvalidFencedEffectNameError,
        InvalidBusinessKeyError,
        InvalidIdentifierError,
        ValueError,
    )
    for method in FENCED:
        with pytest.raises(errors):
            await FENCED[method](calls, key, call)
    with pytest.raises(errors):
        await calls.get(key)
    remove()
    assert sent == []


@pytest.mark.parametrize("bad", [{1, 2}, math.nan, object()])
async def test_a_value_json_cannot_store_is_refused_before_any_statement(
    cluster: Cluster, bad: Any
) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    call = await _saved(cluster, lease)
    calls = cluster.calls(1)
    sent, remove = statements_of(cluster.sql)
    with pytest.raises((TypeError, ValueError)):
        await calls.save_if_absent(key_of(lease, step_key="s2"), bad, START)
    with pytest.raises((TypeError, ValueError)):
        await calls.mark_completed(key, call.attempt_ref, bad)
    with pytest.raises((TypeError, ValueError)):
        await calls.mark_failed(key, call.attempt_ref, bad)
    with pytest.raises(ValueError):
        await calls.mark_pending(key, call.attempt_ref, "")
    with pytest.raises(TypeError):
        await calls.mark_pending(key, (PENDING, 0, "x"), "y")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await calls.save_if_absent(key, INTENT, "now")  # type: ignore[arg-type]
    remove()
    assert sent == []


# lease_state_of


async def test_lease_state_of_every_state(cluster: Cluster, clock: VirtualClock) -> None:
    calls = cluster.calls(2)
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.ABSENT
    lease = await cluster.acquire(1, "tree-1")
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.LIVE
    # A token above the lease's epoch was never granted: nothing to supersede.
    assert await calls.lease_state_of(TENANT, "tree-1", 2) is LeaseState.ABSENT
    assert await cluster.leases(1).release(lease)
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.RELEASED
    lease = await cluster.acquire(1, "tree-1")
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    assert await cluster.leases(1).finish(lease)
    assert await calls.lease_state_of(TENANT, "tree-1", 2) is LeaseState.FINISHED
    yielded = await cluster.acquire(1, "tree-y")
    assert await cluster.leases(1).yield_lease(yielded)
    assert await calls.lease_state_of(TENANT, "tree-y", 1) is LeaseState.LIVE
    # Other tenants' leases are other leases.
    assert await calls.lease_state_of("tenant-2", "tree-1", 1) is LeaseState.ABSENT


@pytest.mark.parametrize(
    ("offset", "state"),
    [(-1, LeaseState.LIVE), (0, LeaseState.SUPERSEDED), (1, LeaseState.SUPERSEDED)],
)
async def test_lease_state_of_closes_a_lease_expired_at_the_token(
    cluster: Cluster, clock: VirtualClock, offset: int, state: LeaseState
) -> None:
    lease = await cluster.acquire(1)
    await clock.advance(LEASE_MS + offset)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1) is state
    leases = cluster.leases(1)
    if state is LeaseState.LIVE:
        assert await cluster.lease_row() == (1, False, None, 0)
        assert await leases.renew(lease, LEASE_MS) == LEASE_MS
        return
    assert await cluster.lease_row() == (1, True, "superseded", 0)
    # Closed for good at that token: answered again as superseded, and nothing revives it.
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    assert await leases.renew(lease, LEASE_MS) is None
    assert await leases.yield_lease(lease) is False
    assert await leases.release(lease) is False
    assert await leases.finish(lease) is False
    taken = await cluster.acquire(2)
    assert taken.lease_epoch == 2 and taken.taken_over_from == LeaseHolder("instance-1", 1)


async def test_lease_state_of_a_yielded_lease_past_its_expiry_closes_it(
    cluster: Cluster, clock: VirtualClock
) -> None:
    lease = await cluster.acquire(1)
    assert await cluster.leases(1).yield_lease(lease)
    await clock.advance(LEASE_MS)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    assert await cluster.leases(1).reclaim(lease, LEASE_MS) is None


@pytest.mark.parametrize("order", ["renewal-first", "state-first", "concurrent"])
async def test_lease_state_of_racing_a_late_renewal_never_gives_both(
    cluster: Cluster, new_connection: Callable[[], SqlConnection], order: str
) -> None:
    # The renewal's statement reads the store time 1 ms before the expiry, lease_state_of's
    # the expiry itself: only the row lock keeps "superseded" and a renewal apart.
    seen = set()
    for round_ in range(12 if order == "concurrent" else 2):
        execution = f"tree-{round_}"
        holder_time = VirtualClock(START)
        holder = cluster.leases(1, new_connection(), StoreClock(holder_time))
        lease = await holder.acquire(TENANT, execution, LEASE_MS)
        assert lease is not None
        holder_time.set(START + LEASE_MS - 1)
        asker = cluster.calls(2, new_connection(), StoreClock(VirtualClock(START + LEASE_MS)))
        if order == "renewal-first":
            renewed = await holder.renew(lease, LEASE_MS)
            state = await asker.lease_state_of(TENANT, execution, 1)
        elif order == "state-first":
            state = await asker.lease_state_of(TENANT, execution, 1)
            renewed = await holder.renew(lease, LEASE_MS)
        else:
            renewed, state = await asyncio.gather(
                holder.renew(lease, LEASE_MS), asker.lease_state_of(TENANT, execution, 1)
            )
        assert not (state is LeaseState.SUPERSEDED and renewed is not None)
        assert (state, renewed is not None) in {
            (LeaseState.LIVE, True),
            (LeaseState.SUPERSEDED, False),
        }
        seen.add(state)
        if order == "renewal-first":
            assert state is LeaseState.LIVE
        if order == "state-first":
            assert state is LeaseState.SUPERSEDED
    assert seen


async def test_lease_state_of_racing_a_take_is_superseded_either_way(
    cluster: Cluster, clock: VirtualClock, new_connection: Callable[[], SqlConnection]
) -> None:
    for round_ in range(10):
        execution = f"tree-{round_}"
        await cluster.acquire(1, execution)
        await clock.advance(LEASE_MS)
        taken, state = await asyncio.gather(
            cluster.leases(2, new_connection()).acquire(TENANT, execution, LEASE_MS),
            cluster.calls(3, new_connection()).lease_state_of(TENANT, execution, 1),
        )
        assert state is LeaseState.SUPERSEDED
        assert taken is not None and taken.lease_epoch == 2
        assert taken.taken_over_from == LeaseHolder("instance-1", 1)


async def test_lease_state_of_on_database_time(sql: SqlConnection) -> None:
    leases = SqlExecutionLeaseRepository(sql, StoreClock(), ApplicationContext("i-1"))
    calls = SqlOutboundCallRepository(sql, StoreClock(), ApplicationContext("i-2"))
    live = await leases.acquire(TENANT, "tree-1", 60_000)
    short = await leases.acquire(TENANT, "tree-2", 150)
    assert live is not None and short is not None
    await asyncio.sleep(0.25)
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.LIVE
    assert await calls.lease_state_of(TENANT, "tree-2", 1) is LeaseState.SUPERSEDED
    assert await leases.renew(short, 60_000) is None


async def test_lease_state_of_checks_its_arguments(cluster: Cluster) -> None:
    calls = cluster.calls(1)
    sent, remove = statements_of(cluster.sql)
    with pytest.raises(InvalidIdentifierError):
        await calls.lease_state_of("", "tree-1", 1)
    with pytest.raises(InvalidIdentifierError):
        await calls.lease_state_of(TENANT, "x" * 256, 1)
    with pytest.raises(ValueError):
        await calls.lease_state_of(TENANT, "tree-1", "1")  # type: ignore[arg-type]
    remove()
    assert sent == []


# statements


async def test_statements_per_call(cluster: Cluster, clock: VirtualClock) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    calls = cluster.calls(1)
    begin = "BEGIN"  # BEGIN IMMEDIATE on SQLite
    sent, remove = statements_of(cluster.sql)
    counted: dict[str, list[str]] = {}

    async def count(name: str, call: Awaitable[Any]) -> Any:
        sent.clear()
        answer = await call
        counted[name] = list(sent)
        return answer

    saved = await count("save (new)", calls.save_if_absent(key, INTENT, START))
    await count("save (existing)", calls.save_if_absent(key, INTENT, START))
    await count("get", calls.get(key))
    assert await count("mark_pending", calls.mark_pending(key, saved.call.attempt_ref, "s"))
    ref = AttemptRef(PENDING, 1, "s")
    assert await count("mark_completed", calls.mark_completed(key, ref, {"ok": 1}))
    assert not await count("mark_failed (lost)", calls.mark_failed(key, ref, {"no": 1}))
    await count("lease_state_of (live)", calls.lease_state_of(TENANT, "tree-1", 1))
    await clock.advance(LEASE_MS)
    await count("lease_state_of (closes)", calls.lease_state_of(TENANT, "tree-1", 1))
    try:
        await count("refused", calls.mark_pending(key, ref, "t"))
    except ExecutionFencedError:
        counted["refused"] = list(sent)
    remove()
    if insert_if_absent_raises(cluster.sql):
        # A duplicate insert would fail: the row is read first.
        save_new = [begin, "fence", "read", "insert", "COMMIT"]
        save_existing = [begin, "fence", "read", "COMMIT"]
    else:
        save_new = [begin, "fence", "insert", "COMMIT"]
        save_existing = [begin, "fence", "insert", "read", "COMMIT"]
    assert counted == {
        "save (new)": save_new,
        "save (existing)": save_existing,
        "get": ["read"],
        "mark_pending": [begin, "fence", "cas", "COMMIT"],
        "mark_completed": [begin, "fence", "cas", "COMMIT"],
        "mark_failed (lost)": [begin, "fence", "cas", "COMMIT"],
        "lease_state_of (live)": [begin, "lock", "COMMIT"],
        "lease_state_of (closes)": [begin, "lock", "close", "COMMIT"],
        # The refusal ends in a ROLLBACK, which the connection sends without telling its
        # listeners.
        "refused": [begin, "fence", "diagnose", "ROLLBACK"],
    }


# the store


def test_the_store_needs_the_stores_clock_and_an_application(sql: SqlConnection) -> None:
    with pytest.raises(TypeError, match="StoreClock"):
        SqlOutboundCallRepository(sql, VirtualClock(), ApplicationContext("a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ApplicationContext"):
        SqlOutboundCallRepository(sql, StoreClock(), "a")  # type: ignore[arg-type]


async def test_the_store_declares_its_backend_and_its_lease_store(sql: SqlConnection) -> None:
    store = SqlOutboundCallRepository(sql, StoreClock(), ApplicationContext("a"))
    assert store.backend == sql.backend
    assert SqlOutboundCallRepository.lease_repository is SqlExecutionLeaseRepository
    await store.ping()
