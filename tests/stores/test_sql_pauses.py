"""`SqlPausedExecutionRepository` on the database under test: pauses answered once."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from support.capabilities import update_returning
from support.sql import plan_of, statements

from agboss_sql.contracts.clocks import VirtualClock
from agboss_sql.contracts.errors import (
    DuplicatePauseError,
    InvalidIdentifierError,
    NotPausedError,
)
from agboss_sql.contracts.types import (
    ApplicationContext,
    JsonValue,
    PausedExecution,
    PauseStatus,
)
from agboss_sql.sql._base import dumps
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.pauses import SqlPausedExecutionRepository
from agboss_sql.sql.schema import paused_executions

START = 1_700_000_000_000
TENANT = "tenant-a"


def store_on(
    connection: SqlConnection, clock: VirtualClock | None = None, instance: str = "instance-1"
) -> SqlPausedExecutionRepository:
    return SqlPausedExecutionRepository(
        connection, clock or VirtualClock(START), ApplicationContext(instance)
    )


def pause_of(
    pause_id: str,
    *,
    tenant_id: str = TENANT,
    root: str = "root-1",
    created_at: int = START,
    request: JsonValue = None,
) -> PausedExecution:
    return PausedExecution(
        tenant_id=tenant_id,
        pause_id=pause_id,
        execution_id=f"exec-of-{pause_id}",
        root_execution_id=root,
        thread_id="thread-1",
        status=PauseStatus.PENDING,
        request=request if request is not None else {"question": f"approve {pause_id}?"},
        decision=None,
        created_at=created_at,
    )


def one_answer(outcomes: Sequence[object]) -> PausedExecution:
    """The invariant of concurrent answers: exactly one resolved the pause, every other one
    was told `NotPausedError`. Returns the winner."""
    won = [o for o in outcomes if isinstance(o, PausedExecution)]
    refused = [o for o in outcomes if isinstance(o, NotPausedError)]
    assert len(won) + len(refused) == len(outcomes), f"unexpected outcomes: {outcomes}"
    assert len(won) == 1, f"{len(won)} answers resolved one pause: {won}"
    return won[0]


# --- the promises, one instance --------------------------------------------------------


async def test_save_and_get_round_trip(sql: SqlConnection) -> None:
    store = store_on(sql)
    pause = pause_of("p-1", request={"question": "ship it?", "options": ["yes", "no"], "n": 2.5})
    await store.save(pause)
    assert await store.get(TENANT, "p-1") == pause
    assert await store.get("tenant-b", "p-1") is None
    assert await store.get(TENANT, "p-2") is None


async def test_a_pause_without_thread_round_trips(sql: SqlConnection) -> None:
    store = store_on(sql)
    pause = dataclasses.replace(pause_of("p-1"), thread_id=None, request=None)
    await store.save(pause)
    assert await store.get(TENANT, "p-1") == pause


async def test_a_duplicate_save_is_refused_and_keeps_the_first(sql: SqlConnection) -> None:
    store = store_on(sql)
    first = pause_of("p-1")
    await store.save(first)
    with pytest.raises(DuplicatePauseError) as raised:
        await store.save(dataclasses.replace(first, request={"other": True}))
    assert raised.value.code == "pause.duplicate"
    assert await store.get(TENANT, "p-1") == first


async def test_pause_ids_are_per_tenant(sql: SqlConnection) -> None:
    store = store_on(sql)
    await store.save(pause_of("p-1", tenant_id="tenant-a"))
    await store.save(pause_of("p-1", tenant_id="tenant-b"))
    await store.resolve("tenant-a", "p-1", {"approved": True})
    other = await store.get("tenant-b", "p-1")
    assert other is not None and other.status is PauseStatus.PENDING


async def test_resolve_answers_once(sql: SqlConnection) -> None:
    clock = VirtualClock(START)
    store = store_on(sql, clock)
    await store.save(pause_of("p-1"))
    await clock.advance(1_234)
    decision = {"approved": True, "by": "alice", "notes": ["é", None, 3]}
    resolved = await store.resolve(TENANT, "p-1", decision)
    expected = dataclasses.replace(
        pause_of("p-1"), status=PauseStatus.RESOLVED, decision=decision, resolved_at=START + 1_234
    )
    assert resolved == expected
    assert await store.get(TENANT, "p-1") == expected

    with pytest.raises(NotPausedError) as raised:
        await store.resolve(TENANT, "p-1", {"approved": False})
    assert raised.value.code == "pause.not-paused"
    assert await store.get(TENANT, "p-1") == expected


async def test_resolve_of_an_unknown_or_other_tenants_pause_is_not_paused(
    sql: SqlConnection,
) -> None:
    store = store_on(sql)
    with pytest.raises(NotPausedError):
        await store.resolve(TENANT, "missing", {"approved": True})
    await store.save(pause_of("p-1", tenant_id="tenant-b"))
    with pytest.raises(NotPausedError):
        await store.resolve(TENANT, "p-1", {"approved": True})
    still = await store.get("tenant-b", "p-1")
    assert still is not None and still.status is PauseStatus.PENDING


async def test_a_null_decision_resolves(sql: SqlConnection) -> None:
    store = store_on(sql)
    await store.save(pause_of("p-1"))
    resolved = await store.resolve(TENANT, "p-1", None)
    assert resolved.status is PauseStatus.RESOLVED and resolved.decision is None
    with pytest.raises(NotPausedError):
        await store.resolve(TENANT, "p-1", None)


async def test_take_moves_a_resolved_pause_once(sql: SqlConnection) -> None:
    store = store_on(sql)
    await store.save(pause_of("p-1"))
    assert await store.take(TENANT, "p-1") is False  # pending: nothing to take
    await store.resolve(TENANT, "p-1", {"approved": True})
    assert await store.take("tenant-b", "p-1") is False
    assert await store.take(TENANT, "p-1") is True
    assert await store.take(TENANT, "p-1") is False
    taken = await store.get(TENANT, "p-1")
    assert taken is not None
    assert taken.status is PauseStatus.TAKEN
    assert taken.decision == {"approved": True}
    with pytest.raises(NotPausedError):
        await store.resolve(TENANT, "p-1", {"approved": False})


async def test_cancel_moves_a_pending_pause_only(sql: SqlConnection) -> None:
    clock = VirtualClock(START)
    store = store_on(sql, clock)
    await store.save(pause_of("p-1"))
    await store.save(pause_of("p-2"))
    await clock.advance(10)
    assert await store.cancel(TENANT, "p-1") is True
    assert await store.cancel(TENANT, "p-1") is False
    cancelled = await store.get(TENANT, "p-1")
    assert cancelled is not None
    assert cancelled.status is PauseStatus.CANCELLED and cancelled.resolved_at == START + 10
    with pytest.raises(NotPausedError):
        await store.resolve(TENANT, "p-1", {"approved": True})

    await store.resolve(TENANT, "p-2", {"approved": True})
    assert await store.cancel(TENANT, "p-2") is False
    assert await store.cancel(TENANT, "missing") is False
    answered = await store.get(TENANT, "p-2")
    assert answered is not None and answered.status is PauseStatus.RESOLVED


async def test_resolved_lists_the_trees_answered_pauses_oldest_first(sql: SqlConnection) -> None:
    store = store_on(sql)
    await store.save(pause_of("p-c", created_at=START + 30))
    await store.save(pause_of("p-a", created_at=START + 10))
    await store.save(pause_of("p-b2", created_at=START + 20))
    await store.save(pause_of("p-b1", created_at=START + 20))
    await store.save(pause_of("p-pending", created_at=START))
    await store.save(pause_of("p-taken", created_at=START))
    await store.save(pause_of("p-other-tree", root="root-2"))
    await store.save(pause_of("p-other-tenant", tenant_id="tenant-b"))
    for pause_id in ("p-c", "p-a", "p-b2", "p-b1", "p-taken", "p-other-tree"):
        await store.resolve(TENANT, pause_id, {"answer": pause_id})
    await store.resolve("tenant-b", "p-other-tenant", {"answer": "b"})
    await store.take(TENANT, "p-taken")

    found = await store.resolved(TENANT, "root-1")
    assert [p.pause_id for p in found] == ["p-a", "p-b1", "p-b2", "p-c"]
    assert all(p.status is PauseStatus.RESOLVED for p in found)
    assert [p.decision for p in found] == [{"answer": i} for i in ("p-a", "p-b1", "p-b2", "p-c")]
    assert await store.resolved(TENANT, "root-3") == []


async def test_purge_deletes_only_taken_and_cancelled_pauses_past_retention(
    sql: SqlConnection,
) -> None:
    clock = VirtualClock(START)
    store = store_on(sql, clock)
    ids = [
        "pending-old",
        "resolved-old",
        "taken-old",
        "cancelled-old",
        "resolved-old-taken-new",
        "cancelled-at-boundary",
        "taken-new",
    ]
    for pause_id in ids:
        await store.save(pause_of(pause_id))
    clock.set(START + 100)
    await store.resolve(TENANT, "resolved-old", {"ok": 1})
    await store.resolve(TENANT, "taken-old", {"ok": 1})
    await store.take(TENANT, "taken-old")
    await store.cancel(TENANT, "cancelled-old")
    await store.resolve(TENANT, "resolved-old-taken-new", {"ok": 1})
    await store.resolve(TENANT, "taken-new", {"ok": 1})
    clock.set(START + 500)
    await store.cancel(TENANT, "cancelled-at-boundary")
    await store.take(TENANT, "resolved-old-taken-new")
    await store.take(TENANT, "taken-new")

    assert await store.purge(START + 100) == 0  # nothing moved strictly before it
    assert await store.purge(START + 500) == 2
    remaining = {pid for pid in ids if await store.get(TENANT, pid) is not None}
    assert remaining == set(ids) - {"taken-old", "cancelled-old"}
    assert await store.purge(START + 500) == 0
    assert await store.purge(START + 501) == 3
    remaining = {pid for pid in ids if await store.get(TENANT, pid) is not None}
    assert remaining == {"pending-old", "resolved-old"}


async def test_purge_reaches_every_tenant(sql: SqlConnection) -> None:
    store = store_on(sql)
    for tenant in ("tenant-a", "tenant-b"):
        await store.save(pause_of("p-1", tenant_id=tenant))
        await store.cancel(tenant, "p-1")
    assert await store.purge(START + 1) == 2


async def test_purge_is_served_by_the_status_and_update_time_index(sql: SqlConnection) -> None:
    # Its cost follows the rows it deletes: a range of the (status, updated_at) index per
    # purgeable status, never a scan of every pause.
    store = store_on(sql)
    plan = await plan_of(sql, store._sql.purge, {"older_than": START})
    assert "ix_agboss_paused_executions_status_updated_at" in plan, plan


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.save(pause_of("")),
        lambda s: s.save(pause_of("p", tenant_id="")),
        lambda s: s.save(dataclasses.replace(pause_of("p"), execution_id="x" * 256)),
        lambda s: s.save(dataclasses.replace(pause_of("p"), root_execution_id="")),
        lambda s: s.get("", "p"),
        lambda s: s.resolve(TENANT, "", None),
        lambda s: s.resolved(TENANT, ""),
        lambda s: s.take("", "p"),
        lambda s: s.cancel(TENANT, "x" * 256),
    ],
)
async def test_identifiers_are_checked_before_any_statement(
    sql: SqlConnection, call: Callable[[SqlPausedExecutionRepository], Any]
) -> None:
    store = store_on(sql)
    with statements(sql) as sent:
        with pytest.raises(InvalidIdentifierError):
            await call(store)
    assert sent == []


async def test_each_operation_sends_the_fewest_statements(sql: SqlConnection) -> None:
    store = store_on(sql)
    returning = update_returning(sql)
    with statements(sql) as sent:
        await store.save(pause_of("p-1"))
    assert len(sent) == 1, sent
    with statements(sql) as sent:
        await store.resolve(TENANT, "p-1", {"ok": True})
    # One conditional update; MySQL has no UPDATE … RETURNING, so it reads the row after.
    assert len(sent) == (1 if returning else 2), sent
    with statements(sql) as sent:
        with pytest.raises(NotPausedError):
            await store.resolve(TENANT, "p-1", {"ok": True})
    assert len(sent) == 1, sent
    for operation in (
        lambda: store.get(TENANT, "p-1"),
        lambda: store.resolved(TENANT, "root-1"),
        lambda: store.take(TENANT, "p-1"),
        lambda: store.cancel(TENANT, "p-1"),
        lambda: store.purge(START),
    ):
        with statements(sql) as sent:
            await operation()
        assert len(sent) == 1, sent
    assert not any("BEGIN" in s for s in sent)


# --- real concurrency: several connections are several instances -----------------------


async def test_two_concurrent_answers_resolve_once(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    first, second = (
        store_on(sql, instance="instance-1"),
        store_on(new_connection(), instance="instance-2"),
    )
    for round_number in range(60):
        pause_id = f"p-{round_number}"
        await first.save(pause_of(pause_id))
        # Alternate who is sent first, so both orders race.
        pair = (first, second) if round_number % 2 == 0 else (second, first)
        outcomes = await asyncio.gather(
            pair[0].resolve(TENANT, pause_id, {"by": "a"}),
            pair[1].resolve(TENANT, pause_id, {"by": "b"}),
            return_exceptions=True,
        )
        winner = one_answer(outcomes)
        assert await first.get(TENANT, pause_id) == winner


async def test_many_concurrent_answers_resolve_once(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    stores = [store_on(sql)] + [store_on(new_connection(), instance=f"i-{i}") for i in range(3)]
    for round_number in range(10):
        pause_id = f"p-{round_number}"
        await stores[0].save(pause_of(pause_id))
        outcomes = await asyncio.gather(
            *(stores[i % 4].resolve(TENANT, pause_id, {"by": i}) for i in range(8)),
            return_exceptions=True,
        )
        winner = one_answer(outcomes)
        assert winner.decision == {"by": outcomes.index(winner)}
        assert await stores[0].get(TENANT, pause_id) == winner


async def test_an_answer_racing_a_cancel_gives_one_outcome(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    first, second = store_on(sql), store_on(new_connection(), instance="instance-2")
    for round_number in range(30):
        pause_id = f"p-{round_number}"
        await first.save(pause_of(pause_id))
        answered, cancelled = await asyncio.gather(
            first.resolve(TENANT, pause_id, {"ok": True}),
            second.cancel(TENANT, pause_id),
            return_exceptions=True,
        )
        stored = await first.get(TENANT, pause_id)
        assert stored is not None
        if isinstance(answered, PausedExecution):
            assert cancelled is False and stored.status is PauseStatus.RESOLVED
        else:
            assert isinstance(answered, NotPausedError)
            assert cancelled is True and stored.status is PauseStatus.CANCELLED


async def test_two_concurrent_takers_take_once(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    first, second = store_on(sql), store_on(new_connection(), instance="instance-2")
    for round_number in range(30):
        pause_id = f"p-{round_number}"
        await first.save(pause_of(pause_id))
        await first.resolve(TENANT, pause_id, {"ok": True})
        taken = await asyncio.gather(first.take(TENANT, pause_id), second.take(TENANT, pause_id))
        assert sorted(taken) == [False, True]


# --- the tests bite: a read-then-write resolve answers twice -----------------------------

P = paused_executions
_UNCONDITIONAL_RESOLVE = (
    sa.update(P)
    .where(P.c.tenant_id == sa.bindparam("tenant_id"), P.c.pause_id == sa.bindparam("pause_id"))
    .values(
        status=PauseStatus.RESOLVED.value,
        decision=sa.bindparam("decision"),
        resolved_at=sa.bindparam("now"),
        updated_at=sa.bindparam("now"),
    )
)


class ReadThenWriteResolve(SqlPausedExecutionRepository):
    """Broken on purpose: decides from a read, then writes without the status condition."""

    def __init__(self, *args: Any, between: Callable[[], Any]) -> None:
        super().__init__(*args)
        self.between = between

    async def resolve(self, tenant_id: str, pause_id: str, decision: JsonValue) -> PausedExecution:
        pause = await self.get(tenant_id, pause_id)
        if pause is None or pause.status is not PauseStatus.PENDING:
            raise NotPausedError()
        await self.between()
        now = self.clock.now()
        await self.connection.execute(
            _UNCONDITIONAL_RESOLVE,
            {"tenant_id": tenant_id, "pause_id": pause_id, "decision": dumps(decision), "now": now},
        )
        return dataclasses.replace(
            pause, status=PauseStatus.RESOLVED, decision=decision, resolved_at=now
        )


async def test_a_read_then_write_resolve_answers_twice(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    # Forced order on two connections: both reads, then both writes.
    both_read = asyncio.Barrier(2)
    clock = VirtualClock(START)
    broken = [
        ReadThenWriteResolve(
            connection, clock, ApplicationContext(f"i-{i}"), between=both_read.wait
        )
        for i, connection in enumerate((sql, new_connection()))
    ]
    await broken[0].save(pause_of("p-1"))
    outcomes = await asyncio.gather(
        broken[0].resolve(TENANT, "p-1", {"by": "a"}),
        broken[1].resolve(TENANT, "p-1", {"by": "b"}),
        return_exceptions=True,
    )
    assert [type(o) for o in outcomes] == [PausedExecution, PausedExecution]
    with pytest.raises(AssertionError, match="2 answers resolved one pause"):
        one_answer(outcomes)

    # The same order cannot be forced on the real store: its check is its write. Sent at
    # once from two connections, one answer wins.
    real = [store_on(sql), store_on(new_connection(), instance="instance-2")]
    await real[0].save(pause_of("p-2"))
    outcomes = await asyncio.gather(
        real[0].resolve(TENANT, "p-2", {"by": "a"}),
        real[1].resolve(TENANT, "p-2", {"by": "b"}),
        return_exceptions=True,
    )
    one_answer(outcomes)


async def test_backend_and_ping(sql: SqlConnection) -> None:
    store = store_on(sql)
    assert store.backend == sql.backend
    await store.ping()
