"""`SqlExecutionRecordRepository` on the database under test (docs/contracts.md).

Several `SqlConnection`s stand for several instances; concurrent completions of one
run race for real, and exactly one wins each time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.sql import statements

from agboss_sql.contracts import (
    ApplicationContext,
    DuplicateExecutionError,
    ExecutionRecord,
    ExecutionRecordStatus,
    InvalidIdentifierError,
    VirtualClock,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.records import SqlExecutionRecordRepository

START = 1_000_000
TENANT = "tenant-1"
Status = ExecutionRecordStatus

NewConnection = Callable[[], SqlConnection]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


def store(
    connection: SqlConnection, clock: VirtualClock, instance: str = "instance-1"
) -> SqlExecutionRecordRepository:
    return SqlExecutionRecordRepository(connection, clock, ApplicationContext(instance))


def record(
    execution_id: str,
    status: ExecutionRecordStatus = Status.RUNNING,
    *,
    tenant: str = TENANT,
    thread: str | None = "thread-1",
    created_at: int = START,
    updated_at: int = START,
    outcome: Any = None,
) -> ExecutionRecord:
    return ExecutionRecord(
        tenant_id=tenant,
        execution_id=execution_id,
        root_execution_id="root-1",
        parent_execution_id="parent-1",
        thread_id=thread,
        workflow="support",
        owner="owner-1",
        status=status,
        created_at=created_at,
        updated_at=updated_at,
        outcome=outcome,
    )


async def test_a_saved_record_reads_back_whole_on_another_instance(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    saved = record("run-1", outcome={"draft": ["grüße ✓", 1.5, None, True]})
    await store(sql, clock).save(saved)
    assert await store(new_connection(), clock, "instance-2").get(TENANT, "run-1") == saved
    assert await store(sql, clock).get(TENANT, "run-2") is None
    bare = ExecutionRecord(TENANT, "run-3", "run-3", None, None, "wf", None, Status.QUEUED, 1, 2)
    await store(sql, clock).save(bare)
    assert await store(sql, clock).get(TENANT, "run-3") == bare


async def test_another_tenants_record_is_none(sql: SqlConnection, clock: VirtualClock) -> None:
    records = store(sql, clock)
    await records.save(record("run-1"))
    assert await records.get("tenant-2", "run-1") is None
    await records.save(record("run-1", Status.PAUSED, tenant="tenant-2"))
    other = await records.get("tenant-2", "run-1")
    assert other is not None and other.status is Status.PAUSED
    mine = await records.get(TENANT, "run-1")
    assert mine is not None and mine.status is Status.RUNNING


async def test_a_duplicate_record_is_refused_and_the_first_kept(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    await store(sql, clock).save(record("run-1"))
    with pytest.raises(DuplicateExecutionError):
        await store(new_connection(), clock).save(record("run-1", Status.QUEUED))
    stored = await store(sql, clock).get(TENANT, "run-1")
    assert stored is not None and stored.status is Status.RUNNING


async def test_concurrent_saves_of_one_record_insert_it_once(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    records = [store(sql, clock), store(new_connection(), clock)]
    results = await asyncio.gather(
        *(records[i % 2].save(record("run-1", outcome=i)) for i in range(10)),
        return_exceptions=True,
    )
    assert results.count(None) == 1
    assert all(r is None or isinstance(r, DuplicateExecutionError) for r in results)


async def test_find_by_thread_is_the_tenants_records_oldest_first(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    records = store(sql, clock)
    await records.save(record("run-b", created_at=START + 2))
    await records.save(record("run-a", created_at=START + 1))
    await records.save(record("run-c", created_at=START + 2))
    await records.save(record("run-x", thread="thread-2"))
    await records.save(record("run-y", tenant="tenant-2"))
    await records.save(record("run-z", thread=None))
    found = await records.find_by_thread(TENANT, "thread-1")
    assert [r.execution_id for r in found] == ["run-a", "run-b", "run-c"]
    assert await records.find_by_thread(TENANT, "thread-9") == []


async def test_find_by_status_is_oldest_update_first_up_to_limit(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    records = store(sql, clock)
    await records.save(record("run-1", updated_at=START + 5))
    await records.save(record("run-2", updated_at=START + 1))
    await records.save(record("run-3", Status.PAUSED))
    await records.save(record("run-4", tenant="tenant-2", updated_at=START + 3))
    found = await records.find_by_status(Status.RUNNING, 10)
    assert [r.execution_id for r in found] == ["run-2", "run-4", "run-1"]
    assert [r.execution_id for r in await records.find_by_status(Status.RUNNING, 1)] == ["run-2"]
    assert await records.find_by_status(Status.RUNNING, 0) == []
    with pytest.raises(ValueError):
        await records.find_by_status(Status.RUNNING, -1)


async def test_transition_is_a_compare_and_set_on_the_applications_clock(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    records = store(sql, clock)
    await records.save(record("run-1", Status.QUEUED))
    await clock.advance(10)
    assert await records.transition(TENANT, "run-1", Status.RUNNING, Status.PAUSED) is False
    assert await records.transition(TENANT, "run-1", Status.QUEUED, Status.RUNNING) is True
    assert await records.transition(TENANT, "run-1", Status.QUEUED, Status.RUNNING) is False
    assert await records.transition(TENANT, "nobody", Status.QUEUED, Status.RUNNING) is False
    assert await records.transition("tenant-2", "run-1", Status.RUNNING, Status.PAUSED) is False
    stored = await records.get(TENANT, "run-1")
    assert stored is not None
    assert (stored.status, stored.updated_at) == (Status.RUNNING, START + 10)
    assert [r.execution_id for r in await records.find_by_status(Status.RUNNING, 5)] == ["run-1"]
    assert await records.find_by_status(Status.QUEUED, 5) == []


async def test_complete_stores_the_outcome_and_a_finished_run_never_moves_again(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    records = store(sql, clock)
    await records.save(record("run-1"))
    await clock.advance(7)
    outcome = {"answer": "grüße", "items": [1, {"nested": None}]}
    assert await records.complete(TENANT, "run-1", Status.RUNNING, Status.SUCCEEDED, outcome)
    for expected in (Status.RUNNING, Status.SUCCEEDED):
        assert await records.complete(TENANT, "run-1", expected, Status.FAILED, "x") is False
        assert await records.transition(TENANT, "run-1", expected, Status.RUNNING) is False
    stored = await records.get(TENANT, "run-1")
    assert stored is not None
    assert (stored.status, stored.outcome, stored.updated_at) == (
        Status.SUCCEEDED,
        outcome,
        START + 7,
    )
    await records.save(record("run-2"))
    assert await records.complete(TENANT, "run-2", Status.RUNNING, Status.CANCELLED, None)
    stored = await records.get(TENANT, "run-2")
    assert stored is not None and (stored.status, stored.outcome) == (Status.CANCELLED, None)


async def test_complete_needs_a_final_status(sql: SqlConnection, clock: VirtualClock) -> None:
    records = store(sql, clock)
    await records.save(record("run-1"))
    with pytest.raises(ValueError):
        await records.complete(TENANT, "run-1", Status.RUNNING, Status.PAUSED, None)
    with pytest.raises(TypeError):
        await records.complete(TENANT, "run-1", Status.RUNNING, Status.FAILED, {"bad": {1, 2}})
    stored = await records.get(TENANT, "run-1")
    assert stored is not None and stored.status is Status.RUNNING


async def test_two_concurrent_completions_of_one_run_give_exactly_one_true(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = store(sql, clock, "instance-1"), store(new_connection(), clock, "instance-2")
    for round_ in range(20):
        run = f"run-{round_}"
        await a.save(record(run))
        done = await asyncio.gather(
            a.complete(TENANT, run, Status.RUNNING, Status.SUCCEEDED, {"by": "a"}),
            b.complete(TENANT, run, Status.RUNNING, Status.FAILED, {"by": "b"}),
        )
        assert sorted(done) == [False, True]
        stored = await a.get(TENANT, run)
        assert stored is not None
        winner = ("a", Status.SUCCEEDED) if done[0] else ("b", Status.FAILED)
        assert (stored.outcome["by"], stored.status) == winner


async def test_each_operation_sends_one_statement(sql: SqlConnection, clock: VirtualClock) -> None:
    records = store(sql, clock)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: records.save(record("run-1")),
        lambda: records.get(TENANT, "run-1"),
        lambda: records.find_by_thread(TENANT, "thread-1"),
        lambda: records.find_by_status(Status.RUNNING, 5),
        lambda: records.transition(TENANT, "run-1", Status.RUNNING, Status.PAUSED),
        lambda: records.complete(TENANT, "run-1", Status.PAUSED, Status.SUCCEEDED, 1),
    ]
    for call in calls:
        with statements(sql, transaction_control=False) as sent:
            await call()
        assert len(sent) == 1
    with statements(
        sql, transaction_control=False
    ) as sent:  # refused: a read tells a retry of the same outcome
        assert await records.complete(TENANT, "run-1", Status.PAUSED, Status.SUCCEEDED, 1)
    assert len(sent) == 2
    with statements(sql, transaction_control=False) as sent:
        assert await records.transition(TENANT, "run-1", Status.SUCCEEDED, Status.RUNNING) is False
    assert sent == []  # a final status never moves: nothing to ask


async def test_arguments_are_checked_before_any_statement(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    records = store(sql, clock)
    with statements(sql, transaction_control=False) as sent:
        with pytest.raises(InvalidIdentifierError):
            await records.save(record(""))
        with pytest.raises(InvalidIdentifierError):
            await records.save(record("run-1", tenant="t" * 256))
        with pytest.raises(InvalidIdentifierError):
            await records.save(record("run-1", thread=""))
        with pytest.raises(ValueError):
            await records.save(record("run-1", status="lost"))  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await records.save(record("run-1", created_at="now"))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await records.save(record("run-1", outcome=object()))
        with pytest.raises(InvalidIdentifierError):
            await records.get("", "run-1")
        with pytest.raises(ValueError):
            await records.transition(TENANT, "run-1", "lost", Status.RUNNING)  # type: ignore[arg-type]
    assert sent == []
