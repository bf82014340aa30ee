"""`SqlExecutionHistoryRepository` on the database under test: finished runs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from support.sql import plan_of, statements

from agboss_sql.contracts.clocks import VirtualClock
from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.types import ApplicationContext, ExecutionSnapshot, HistoryCursor
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.history import SqlExecutionHistoryRepository

START = 1_700_000_000_000
TENANT = "tenant-a"

RECORD: dict[str, Any] = {
    "steps": [
        {
            "name": "triage",
            "decision": {"route": "refund", "confidence": 0.875, "alternatives": ["escalate"]},
            "input_hash": "sha256:" + "ab" * 32,
            "tool_calls": [
                {"tool": "lookup_order", "args": {"order_id": 12345678901234}, "result": None},
                {"tool": "refund", "args": {"amount": 19.99, "currency": "EUR"}, "result": True},
            ],
        },
        {"name": "reply", "decision": None, "input_hash": "", "tool_calls": []},
    ],
    "input_hash": "sha256:" + "cd" * 32,
    "tool_calls": 2,
    "origin": {"kind": "mesh", "step": {"idempotency_key": "k-1"}, "via": ["a2a", "mcp"]},
    "text": 'naïve café — 日本語 — 🙂 — "quoted" \\ back\\slash\nnew line\ttab',
    "empty": {},
    "zero": 0,
    "negative": -1.5e-7,
}


def store_on(
    connection: SqlConnection, instance: str = "instance-1"
) -> SqlExecutionHistoryRepository:
    return SqlExecutionHistoryRepository(
        connection, VirtualClock(START), ApplicationContext(instance)
    )


def snapshot(
    execution_id: str,
    finished_at: int,
    *,
    tenant_id: str = TENANT,
    record: Any = None,
    status: str = "succeeded",
) -> ExecutionSnapshot:
    return ExecutionSnapshot(
        tenant_id=tenant_id,
        execution_id=execution_id,
        workflow="support",
        status=status,
        started_at=finished_at - 500,
        finished_at=finished_at,
        record=record if record is not None else {"execution": execution_id},
    )


def cursor_of(last: ExecutionSnapshot) -> HistoryCursor:
    return HistoryCursor(last.finished_at, last.execution_id)


def newest_first(snapshots: list[ExecutionSnapshot]) -> list[str]:
    return [
        s.execution_id
        for s in sorted(snapshots, key=lambda s: (s.finished_at, s.execution_id), reverse=True)
    ]


async def test_the_record_round_trips_exactly(sql: SqlConnection) -> None:
    store = store_on(sql)
    saved = snapshot("exec-1", START, record=RECORD)
    await store.save(saved)
    found = await store.get(TENANT, "exec-1")
    assert found == saved
    assert found is not None
    # Exactly: key order, int/float kinds and text are what was saved.
    assert json.dumps(found.record) == json.dumps(RECORD)
    assert found.record["steps"][0]["decision"] == RECORD["steps"][0]["decision"]
    assert isinstance(found.record["steps"][0]["tool_calls"][0]["args"]["order_id"], int)
    assert isinstance(found.record["tool_calls"], int)


@pytest.mark.parametrize("record", [{}, [], None, "text", 0, [1, {"a": None}]])
async def test_any_json_record_round_trips(sql: SqlConnection, record: Any) -> None:
    store = store_on(sql)
    saved = dataclasses.replace(snapshot("exec-1", START), record=record)
    await store.save(saved)
    assert await store.get(TENANT, "exec-1") == saved


async def test_save_replaces_the_stored_snapshot(sql: SqlConnection) -> None:
    store = store_on(sql)
    await store.save(snapshot("exec-1", START, status="running", record={"v": 1}))
    replaced = dataclasses.replace(
        snapshot("exec-1", START + 10, status="failed", record={"v": 2}),
        workflow="billing",
        started_at=START - 99,
    )
    await store.save(replaced)
    assert await store.get(TENANT, "exec-1") == replaced
    assert [s.execution_id for s in await store.list(TENANT)] == ["exec-1"]


async def test_snapshots_are_per_tenant(sql: SqlConnection) -> None:
    store = store_on(sql)
    a = snapshot("exec-1", START, tenant_id="tenant-a")
    b = snapshot("exec-1", START + 1, tenant_id="tenant-b", record={"b": True})
    await store.save(a)
    await store.save(b)
    assert await store.get("tenant-a", "exec-1") == a
    assert await store.get("tenant-b", "exec-1") == b
    assert await store.get("tenant-c", "exec-1") is None
    assert await store.list("tenant-a") == [a]


async def test_list_is_newest_first_within_since_and_until(sql: SqlConnection) -> None:
    store = store_on(sql)
    for i, at in enumerate([START - 1, START, START + 5, START + 5, START + 9, START + 10]):
        await store.save(snapshot(f"exec-{i}", at))
    await store.save(snapshot("exec-other", START + 5, tenant_id="tenant-b"))

    assert [s.execution_id for s in await store.list(TENANT)] == [
        "exec-5",
        "exec-4",
        "exec-3",
        "exec-2",
        "exec-1",
        "exec-0",
    ]
    # since is inclusive, until exclusive.
    window = await store.list(TENANT, since=START, until=START + 10)
    assert [s.execution_id for s in window] == ["exec-4", "exec-3", "exec-2", "exec-1"]
    assert [s.execution_id for s in await store.list(TENANT, since=START + 10)] == ["exec-5"]
    assert [s.execution_id for s in await store.list(TENANT, until=START)] == ["exec-0"]
    assert [s.execution_id for s in await store.list(TENANT, limit=2)] == ["exec-5", "exec-4"]
    assert await store.list(TENANT, limit=0) == []
    assert await store.list("tenant-c") == []


async def test_keyset_pages_never_skip_or_repeat_with_equal_finish_times(
    sql: SqlConnection,
) -> None:
    store = store_on(sql)
    saved = []
    # 40 runs over 6 finish times: long runs of equal finished_at, ids out of order.
    for i in range(40):
        s = snapshot(f"exec-{(i * 17) % 40:03d}", START + (i % 6) * 1_000)
        saved.append(s)
    for s in saved:
        await store.save(s)
    await store.save(snapshot("exec-000", START, tenant_id="tenant-b"))
    expected = newest_first(saved)

    for page_size in (1, 2, 3, 7, 40, 41):
        seen: list[str] = []
        after: HistoryCursor | None = None
        while True:
            page = await store.list(TENANT, limit=page_size, after=after)
            assert len(page) <= page_size
            if not page:
                break
            seen.extend(s.execution_id for s in page)
            after = cursor_of(page[-1])
        assert seen == expected, f"page size {page_size}"

    # Pages inside a window, with a cursor.
    inside = [s for s in saved if START + 1_000 <= s.finished_at < START + 4_000]
    seen = []
    after = None
    while page := await store.list(
        TENANT, since=START + 1_000, until=START + 4_000, limit=4, after=after
    ):
        seen.extend(s.execution_id for s in page)
        after = cursor_of(page[-1])
    assert seen == newest_first(inside)


async def test_a_run_saved_between_pages_does_not_shift_the_next_page(sql: SqlConnection) -> None:
    store = store_on(sql)
    for i in range(6):
        await store.save(snapshot(f"exec-{i}", START))
    first = await store.list(TENANT, limit=3)
    assert [s.execution_id for s in first] == ["exec-5", "exec-4", "exec-3"]
    # A newer run, and one at the cursor's time that sorts before it: both on earlier pages.
    await store.save(snapshot("exec-9", START + 1))
    await store.save(snapshot("exec-6", START))
    rest = await store.list(TENANT, limit=10, after=cursor_of(first[-1]))
    assert [s.execution_id for s in rest] == ["exec-2", "exec-1", "exec-0"]


async def test_purge_deletes_runs_finished_before_the_retention(sql: SqlConnection) -> None:
    store = store_on(sql)
    for i, at in enumerate([START - 10, START - 1, START, START + 1]):
        await store.save(snapshot(f"exec-{i}", at))
    await store.save(snapshot("exec-b", START - 5, tenant_id="tenant-b"))
    assert await store.purge(START - 10) == 0
    assert await store.purge(START) == 3  # exec-0, exec-1, exec-b; exec-2 is exactly at it
    assert [s.execution_id for s in await store.list(TENANT)] == ["exec-3", "exec-2"]
    assert await store.list("tenant-b") == []
    assert await store.purge(START) == 0


async def test_pages_and_purges_are_served_by_indexes(sql: SqlConnection) -> None:
    store = store_on(sql)
    page = store._sql.list(True, True, True)
    plan = await plan_of(
        sql,
        page,
        {
            "tenant_id": TENANT,
            "since": START,
            "until": START + 10,
            "after_finished_at": START + 5,
            "after_execution_id": "exec-5",
            "limit": 10,
        },
    )
    assert "ix_agboss_execution_history_tenant_id_finished_at_execution_id" in plan, plan
    assert "filesort" not in plan.lower() and "TEMP B-TREE" not in plan, plan
    plan = await plan_of(sql, store._sql.purge, {"older_than": START})
    assert "ix_agboss_execution_history_finished_at" in plan, plan


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.save(snapshot("", START)),
        lambda s: s.save(snapshot("exec", START, tenant_id="")),
        lambda s: s.save(dataclasses.replace(snapshot("exec", START), workflow="w" * 256)),
        lambda s: s.get("", "exec"),
        lambda s: s.get(TENANT, "x" * 256),
        lambda s: s.list(""),
        lambda s: s.list(TENANT, after=HistoryCursor(START, "")),
    ],
)
async def test_identifiers_are_checked_before_any_statement(
    sql: SqlConnection, call: Callable[[SqlExecutionHistoryRepository], Any]
) -> None:
    store = store_on(sql)
    with statements(sql) as sent:
        with pytest.raises(InvalidIdentifierError):
            await call(store)
    assert sent == []


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.list(TENANT, limit=-1),
        lambda s: s.list(TENANT, since="yesterday"),
        lambda s: s.purge(None),
        lambda s: s.save(dataclasses.replace(snapshot("exec", START), finished_at=1.5)),
        lambda s: s.save(dataclasses.replace(snapshot("exec", START), status="")),
    ],
)
async def test_values_are_checked_before_any_statement(
    sql: SqlConnection, call: Callable[[SqlExecutionHistoryRepository], Any]
) -> None:
    store = store_on(sql)
    with statements(sql) as sent:
        with pytest.raises(ValueError):
            await call(store)
    assert sent == []


async def test_each_operation_sends_one_statement(sql: SqlConnection) -> None:
    store = store_on(sql)
    for operation in (
        lambda: store.save(snapshot("exec-1", START)),
        lambda: store.save(snapshot("exec-1", START + 1)),
        lambda: store.get(TENANT, "exec-1"),
        lambda: store.list(TENANT),
        lambda: store.list(TENANT, since=START, until=START + 5, after=HistoryCursor(START, "z")),
        lambda: store.purge(START),
    ):
        with statements(sql) as sent:
            await operation()
        assert len(sent) == 1, sent
        assert "BEGIN" not in sent[0]


async def test_concurrent_saves_of_one_run_leave_one_of_them(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    stores = [store_on(sql)] + [store_on(new_connection(), f"i-{i}") for i in range(3)]
    versions = [snapshot("exec-1", START + i, record={"version": i}) for i in range(12)]
    await asyncio.gather(*(stores[i % 4].save(v) for i, v in enumerate(versions)))
    listed = await stores[0].list(TENANT)
    assert len(listed) == 1
    assert listed[0] in versions


async def test_backend_and_ping(sql: SqlConnection) -> None:
    store = store_on(sql)
    assert store.backend == sql.backend
    await store.ping()
