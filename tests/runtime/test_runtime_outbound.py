"""`outbound_call`: each attempt of an outbound call is sent at most once, also when a reply
of the store was lost and the caller tries again — in memory and on the database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from agboss_sql.contracts import (
    ApplicationContext,
    AttemptRef,
    ExecutionContext,
    ExecutionLease,
    ExecutionLeaseRepository,
    FencedEffectKey,
    JsonValue,
    LeaseState,
    OutboundCall,
    OutboundCallRepository,
    OutboundCallSaved,
    OutboundCallStatus,
    StepRef,
    StoreClock,
    StoreUnavailableError,
    VirtualClock,
    fenced_effect_key_of,
)
from agboss_sql.lab.database import truncate_all
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryExecutionLeaseRepository,
    InMemoryOutboundCallRepository,
)
from agboss_sql.runtime.outbound import outbound_call
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository

TENANT = "tenant-1"
LEASE_MS = 30_000
INTENT = {"order": "order-1"}


class LostReplies(OutboundCallRepository):
    """The store, except that the named moves commit and then raise as if their reply was
    lost on the way back (`lose` counts how many more replies to lose)."""

    def __init__(self, inner: OutboundCallRepository) -> None:
        self.inner = inner
        self.lose: dict[str, int] = {}

    def _lost(self, move: str) -> None:
        if self.lose.get(move, 0) > 0:
            self.lose[move] -= 1
            raise StoreUnavailableError(f"injected: the reply of {move} was lost")

    async def ping(self) -> None:
        await self.inner.ping()

    async def get(self, key: FencedEffectKey) -> OutboundCall | None:
        return await self.inner.get(key)

    async def save_if_absent(
        self, key: FencedEffectKey, intent: JsonValue, recorded_at: int
    ) -> OutboundCallSaved:
        return await self.inner.save_if_absent(key, intent, recorded_at)

    async def mark_pending(self, key: FencedEffectKey, expected: AttemptRef, owner: str) -> bool:
        done = await self.inner.mark_pending(key, expected, owner)
        self._lost("mark_pending")
        return done

    async def mark_completed(
        self, key: FencedEffectKey, attempt: AttemptRef, response: JsonValue
    ) -> bool:
        done = await self.inner.mark_completed(key, attempt, response)
        self._lost("mark_completed")
        return done

    async def mark_failed(
        self, key: FencedEffectKey, attempt: AttemptRef, error: JsonValue
    ) -> bool:
        return await self.inner.mark_failed(key, attempt, error)

    async def lease_state_of(self, tenant_id: str, execution_id: str, token: int) -> LeaseState:
        return await self.inner.lease_state_of(tenant_id, execution_id, token)


@dataclass
class Instance:
    leases: ExecutionLeaseRepository
    calls: LostReplies


@pytest.fixture(params=["memory", pytest.param("sql", marks=pytest.mark.database)])
async def instance(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[str], Instance]]:
    """A factory of instances on one backend: in memory, or each with its own connection
    to the database under test."""
    if request.param == "memory":
        backend = InMemoryBackend()
        clock = StoreClock(VirtualClock(1_000_000))

        def memory_instance(name: str) -> Instance:
            app = ApplicationContext(instance_id=name)
            return Instance(
                InMemoryExecutionLeaseRepository(backend, clock, app),
                LostReplies(InMemoryOutboundCallRepository(backend, clock, app)),
            )

        yield memory_instance
        return
    url: str = request.getfixturevalue("sql_url")
    connections: list[SqlConnection] = []

    def sql_instance(name: str) -> Instance:
        connection = SqlConnection(url)
        connections.append(connection)
        app = ApplicationContext(instance_id=name)
        return Instance(
            SqlExecutionLeaseRepository(connection, StoreClock(), app),
            LostReplies(SqlOutboundCallRepository(connection, StoreClock(), app)),
        )

    cleaner = SqlConnection(url)
    try:
        await truncate_all(cleaner)
    finally:
        await cleaner.close()
    try:
        yield sql_instance
    finally:
        for connection in connections:
            await connection.close()


def key_of(lease: ExecutionLease) -> FencedEffectKey:
    context = ExecutionContext(
        tenant_id=lease.tenant_id,
        root_execution_id=lease.execution_id,
        execution_id=lease.execution_id,
        lease=lease,
        step=StepRef(lease.execution_id, "leaf", "notify-step"),
    )
    return fenced_effect_key_of(context, "notify")


class Sends:
    """The attempts sent, in order."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    async def send(self, attempt: int) -> JsonValue:
        self.sent.append(attempt)
        return {"attempt": attempt}


async def take(instance: Instance) -> ExecutionLease:
    lease = await instance.leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    return lease


async def test_a_call_is_sent_once_and_completed(instance: Callable[[str], Instance]) -> None:
    a = instance("a")
    key, sends = key_of(await take(a)), Sends()
    call = await outbound_call(a.calls, key, INTENT, 1, sends.send)
    assert (call.status, call.attempt, call.response) == (
        OutboundCallStatus.COMPLETED,
        1,
        {"attempt": 1},
    )
    assert sends.sent == [1]
    # Called again (a replayed step): the completed call is answered, nothing is sent.
    assert await outbound_call(a.calls, key, INTENT, 2, sends.send) == call
    assert sends.sent == [1]


async def test_an_end_whose_reply_was_lost_sends_nothing_more(
    instance: Callable[[str], Instance],
) -> None:
    a = instance("a")
    key, sends = key_of(await take(a)), Sends()
    a.calls.lose["mark_completed"] = 1
    # Sent, ended in the store, but the end's reply is lost: the caller cannot tell.
    with pytest.raises(StoreUnavailableError):
        await outbound_call(a.calls, key, INTENT, 1, sends.send)
    # Tried again: the end of attempt 1 did commit, so the call is found completed.
    call = await outbound_call(a.calls, key, INTENT, 2, sends.send)
    assert call.status is OutboundCallStatus.COMPLETED
    assert sends.sent == [1]


async def test_an_attempt_claimed_but_not_seen_ended_is_not_sent_twice(
    instance: Callable[[str], Instance],
) -> None:
    a = instance("a")
    key, sends = key_of(await take(a)), Sends()

    async def fail_after_sending(attempt: int) -> JsonValue:
        await sends.send(attempt)
        raise StoreUnavailableError("injected: the end could not reach the store")

    # Claimed and sent; the caller failed before the end reached the store.
    with pytest.raises(StoreUnavailableError):
        await outbound_call(a.calls, key, INTENT, 1, fail_after_sending)
    pending = await a.calls.get(key)
    assert pending is not None
    assert (pending.status, pending.attempt) == (OutboundCallStatus.PENDING, 1)
    call = await outbound_call(a.calls, key, INTENT, 2, sends.send)
    assert (call.status, call.attempt) == (OutboundCallStatus.COMPLETED, 2)
    assert sends.sent == [1, 2]  # each attempt once: attempt 1 is never sent again


async def test_a_claim_whose_reply_was_lost_is_not_sent_its_successor_is(
    instance: Callable[[str], Instance],
) -> None:
    a = instance("a")
    key, sends = key_of(await take(a)), Sends()
    a.calls.lose["mark_pending"] = 1
    with pytest.raises(StoreUnavailableError):
        await outbound_call(a.calls, key, INTENT, 1, sends.send)
    assert sends.sent == []
    call = await outbound_call(a.calls, key, INTENT, 2, sends.send)
    assert (call.status, call.attempt) == (OutboundCallStatus.COMPLETED, 2)
    assert sends.sent == [2]


async def test_a_takeover_claims_the_next_attempt_over_the_old_holders_pending_one(
    instance: Callable[[str], Instance],
) -> None:
    a, b = instance("a"), instance("b")
    lease = await take(a)
    key, sends = key_of(lease), Sends()

    async def frozen_after_sending(attempt: int) -> JsonValue:
        await sends.send(attempt)
        raise StoreUnavailableError("injected: a froze after sending")

    with pytest.raises(StoreUnavailableError):
        await outbound_call(a.calls, key, INTENT, 1, frozen_after_sending)
    assert await a.leases.release(lease)
    taken = await take(b)
    assert taken.lease_epoch == lease.lease_epoch + 1
    call = await outbound_call(b.calls, key_of(taken), INTENT, 2, sends.send)
    assert (call.status, call.attempt) == (OutboundCallStatus.COMPLETED, 2)
    assert sends.sent == [1, 2]
