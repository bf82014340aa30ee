"""`SqlMeshRequestRepository` on the database under test: one run per incoming request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from support.sql import statements

from agboss_sql.contracts.clocks import VirtualClock
from agboss_sql.contracts.errors import IdempotencyKeyConflictError, InvalidIdentifierError
from agboss_sql.contracts.types import ApplicationContext, MeshRequest
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.mesh import SqlMeshRequestRepository
from agboss_sql.sql.schema import mesh_requests

START = 1_700_000_000_000


def store_on(connection: SqlConnection, instance: str = "instance-1") -> SqlMeshRequestRepository:
    return SqlMeshRequestRepository(connection, VirtualClock(START), ApplicationContext(instance))


async def test_first_save_creates_and_later_saves_replay_it(sql: SqlConnection) -> None:
    store = store_on(sql)
    first = await store.save_if_absent("req-1", "tenant-a", "fp-1", START)
    assert first.created is True
    assert first.request == MeshRequest("req-1", "tenant-a", "fp-1", START)

    again = await store.save_if_absent("req-1", "tenant-a", "fp-1", START + 5_000)
    assert again.created is False
    # The stored request, not the replay's arguments: received_at is the first one.
    assert again.request == MeshRequest("req-1", "tenant-a", "fp-1", START)
    assert await store.get("tenant-a", "req-1") == first.request


async def test_same_key_with_another_fingerprint_is_a_conflict(sql: SqlConnection) -> None:
    store = store_on(sql)
    await store.save_if_absent("req-1", "tenant-a", "fp-1", START)
    with pytest.raises(IdempotencyKeyConflictError) as raised:
        await store.save_if_absent("req-1", "tenant-a", "fp-2", START)
    assert raised.value.code == "idempotency.key-conflict"
    assert await store.get("tenant-a", "req-1") == MeshRequest("req-1", "tenant-a", "fp-1", START)


async def test_same_key_from_another_tenant_is_another_request(sql: SqlConnection) -> None:
    """Keys are per tenant: one row per (key, tenant), neither tenant sees the other's."""
    store = store_on(sql)
    await store.save_if_absent("req-1", "tenant-a", "fp-1", START)
    await store.complete("tenant-a", "req-1", {"secret": "tenant-a's answer"})
    theirs = await store.save_if_absent("req-1", "tenant-b", "fp-2", START + 1)
    assert theirs == (MeshRequest("req-1", "tenant-b", "fp-2", START + 1), True)
    with pytest.raises(IdempotencyKeyConflictError):
        await store.save_if_absent("req-1", "tenant-b", "fp-1", START)
    assert await store.complete("tenant-b", "req-1", {"for": "b"}) is True
    assert await store.get("tenant-a", "req-1") == MeshRequest(
        "req-1", "tenant-a", "fp-1", START, {"secret": "tenant-a's answer"}, completed=True
    )
    assert await store.get("tenant-b", "req-1") == MeshRequest(
        "req-1", "tenant-b", "fp-2", START + 1, {"for": "b"}, completed=True
    )
    rows = await sql.execute(
        sa.select(mesh_requests.c.tenant_id)
        .where(mesh_requests.c.idempotency_key == "req-1")
        .order_by(mesh_requests.c.tenant_id)
    )
    assert [row[0] for row in rows.rows] == ["tenant-a", "tenant-b"]


async def test_complete_stores_the_response_once(sql: SqlConnection) -> None:
    store = store_on(sql)
    await store.save_if_absent("req-1", "tenant-a", "fp-1", START)
    response = {"output": ["é", 1, 2.5, None, {"nested": True}], "ok": True}
    assert await store.complete("tenant-a", "req-1", response) is True
    assert await store.complete("tenant-a", "req-1", {"output": "second"}) is False

    stored = await store.get("tenant-a", "req-1")
    assert stored == MeshRequest("req-1", "tenant-a", "fp-1", START, response, completed=True)
    replay = await store.save_if_absent("req-1", "tenant-a", "fp-1", START)
    assert replay.created is False
    assert replay.request.completed is True
    assert replay.request.response == response


async def test_a_null_response_still_completes(sql: SqlConnection) -> None:
    store = store_on(sql)
    await store.save_if_absent("req-1", "tenant-a", "fp-1", START)
    assert await store.complete("tenant-a", "req-1", None) is True
    assert await store.complete("tenant-a", "req-1", {"late": True}) is False
    stored = await store.get("tenant-a", "req-1")
    assert stored is not None and stored.completed is True and stored.response is None


async def test_complete_of_an_unknown_key_changes_nothing(sql: SqlConnection) -> None:
    store = store_on(sql)
    assert await store.complete("tenant-a", "missing", {"x": 1}) is False
    assert await store.get("tenant-a", "missing") is None


async def test_keys_compare_by_exact_characters(sql: SqlConnection) -> None:
    store = store_on(sql)
    assert (await store.save_if_absent("Req-1", "tenant-a", "fp", START)).created
    assert (await store.save_if_absent("req-1", "tenant-a", "fp", START)).created
    assert (await store.get("tenant-a", "REQ-1")) is None


async def test_a_key_ending_with_a_space_is_refused_everywhere(sql: SqlConnection) -> None:
    """MySQL would compare "req-1" and "req-1 " as one key: such keys are refused up front."""
    store = store_on(sql)
    await store.save_if_absent("req-1", "tenant-a", "fp", START)
    with statements(sql) as sent, pytest.raises(InvalidIdentifierError):
        await store.save_if_absent("req-1 ", "tenant-a", "fp", START)
    assert sent == []
    with pytest.raises(InvalidIdentifierError):
        await store.get("tenant-a", "req-1 ")


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.save_if_absent("", "tenant-a", "fp", START),
        lambda s: s.save_if_absent("k" * 256, "tenant-a", "fp", START),
        lambda s: s.save_if_absent("req", "", "fp", START),
        lambda s: s.complete("tenant-a", "", None),
        lambda s: s.get("tenant-a", ""),
    ],
)
async def test_identifiers_are_checked_before_any_statement(
    sql: SqlConnection, call: Callable[[SqlMeshRequestRepository], Any]
) -> None:
    store = store_on(sql)
    with statements(sql) as sent:
        with pytest.raises(InvalidIdentifierError):
            await call(store)
    assert sent == []


async def test_each_operation_sends_the_fewest_statements(sql: SqlConnection) -> None:
    store = store_on(sql)
    with statements(sql) as sent:
        await store.save_if_absent("req-1", "tenant-a", "fp-1", START)
    assert len(sent) == 1, sent  # created: the insert alone, no read-back
    with statements(sql) as sent:
        await store.save_if_absent("req-1", "tenant-a", "fp-1", START)
    assert len(sent) == 2, sent  # the refused insert, then the stored row
    with statements(sql) as sent:
        await store.complete("tenant-a", "req-1", {"ok": True})
    assert len(sent) == 1, sent
    with statements(sql) as sent:
        await store.get("tenant-a", "req-1")
    assert len(sent) == 1, sent


async def test_concurrent_saves_of_one_key_create_it_once(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    stores = [store_on(sql, "instance-0")] + [
        store_on(new_connection(), f"instance-{i}") for i in range(1, 4)
    ]
    for round_number in range(15):
        key = f"req-{round_number}"
        results = await asyncio.gather(
            *(
                stores[i % len(stores)].save_if_absent(key, "tenant-a", "fp", START + i)
                for i in range(12)
            )
        )
        created = [r for r in results if r.created]
        assert len(created) == 1, f"round {round_number}: {len(created)} creators"
        winner = created[0].request
        assert all(r.request == winner for r in results)
        assert await stores[0].get("tenant-a", key) == winner


async def test_concurrent_completions_store_one_response(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    stores = [store_on(sql)] + [store_on(new_connection()) for _ in range(3)]
    for round_number in range(10):
        key = f"req-{round_number}"
        await stores[0].save_if_absent(key, "tenant-a", "fp", START)
        outcomes = await asyncio.gather(
            *(stores[i % 4].complete("tenant-a", key, {"by": i}) for i in range(8))
        )
        assert outcomes.count(True) == 1
        stored = await stores[0].get("tenant-a", key)
        assert stored is not None and stored.response == {"by": outcomes.index(True)}


async def test_backend_and_ping(sql: SqlConnection) -> None:
    store = store_on(sql)
    assert store.backend == sql.backend
    await store.ping()
