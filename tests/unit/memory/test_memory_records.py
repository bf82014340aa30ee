"""In-memory execution records, tree keys, mesh requests and history (docs/contracts.md)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from memory_cluster import START, TENANT, Cluster

from agboss_sql.contracts import (
    CANCEL_REQUEST_KEY,
    COMPENSATED_PREFIX,
    UNWINDING_KEY,
    DuplicateExecutionError,
    ExecutionRecord,
    ExecutionRecordStatus,
    ExecutionSnapshot,
    HistoryCursor,
    IdempotencyKeyConflictError,
    InvalidIdentifierError,
    MeshRequest,
)

Status = ExecutionRecordStatus


def record(
    execution_id: str,
    status: ExecutionRecordStatus = Status.RUNNING,
    *,
    tenant: str = TENANT,
    thread: str | None = "thread-1",
    created_at: int = START,
    updated_at: int = START,
) -> ExecutionRecord:
    return ExecutionRecord(
        tenant_id=tenant,
        execution_id=execution_id,
        root_execution_id=execution_id,
        parent_execution_id=None,
        thread_id=thread,
        workflow="support",
        owner=None,
        status=status,
        created_at=created_at,
        updated_at=updated_at,
    )


# records


async def test_a_saved_record_reads_back(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-1"))
    assert await cluster.records(2).get(TENANT, "run-1") == record("run-1")
    assert await records.get(TENANT, "run-2") is None


async def test_another_tenants_record_is_none(cluster: Cluster) -> None:
    await cluster.records(1).save(record("run-1"))
    assert await cluster.records(1).get("tenant-2", "run-1") is None
    # ... and the same id under another tenant is another record.
    await cluster.records(1).save(record("run-1", tenant="tenant-2"))


async def test_a_duplicate_record_is_refused(cluster: Cluster) -> None:
    await cluster.records(1).save(record("run-1"))
    with pytest.raises(DuplicateExecutionError):
        await cluster.records(2).save(record("run-1", Status.QUEUED))
    stored = await cluster.records(1).get(TENANT, "run-1")
    assert stored is not None and stored.status is Status.RUNNING


async def test_find_by_thread_is_the_tenants_records_oldest_first(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-b", created_at=START + 2))
    await records.save(record("run-a", created_at=START + 1))
    await records.save(record("run-c", created_at=START + 2))
    await records.save(record("run-x", thread="thread-2"))
    await records.save(record("run-y", tenant="tenant-2"))
    found = await records.find_by_thread(TENANT, "thread-1")
    assert [r.execution_id for r in found] == ["run-a", "run-b", "run-c"]


async def test_find_by_status_is_oldest_update_first_up_to_limit(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-1", updated_at=START + 5))
    await records.save(record("run-2", updated_at=START + 1))
    await records.save(record("run-3", Status.PAUSED))
    await records.save(record("run-4", tenant="tenant-2", updated_at=START + 3))
    found = await records.find_by_status(Status.RUNNING, 10)
    assert [r.execution_id for r in found] == ["run-2", "run-4", "run-1"]
    assert [r.execution_id for r in await records.find_by_status(Status.RUNNING, 1)] == ["run-2"]
    assert await records.find_by_status(Status.RUNNING, 0) == []


async def test_transition_is_a_compare_and_set(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-1", Status.QUEUED))
    await cluster.clock.advance(10)
    assert await records.transition(TENANT, "run-1", Status.RUNNING, Status.PAUSED) is False
    assert await records.transition(TENANT, "run-1", Status.QUEUED, Status.RUNNING) is True
    assert await records.transition(TENANT, "run-1", Status.QUEUED, Status.RUNNING) is False
    assert await records.transition(TENANT, "nobody", Status.QUEUED, Status.RUNNING) is False
    assert await records.transition("tenant-2", "run-1", Status.RUNNING, Status.PAUSED) is False
    stored = await records.get(TENANT, "run-1")
    assert stored is not None
    assert (stored.status, stored.updated_at) == (Status.RUNNING, START + 10)


async def test_a_moved_record_is_found_by_its_new_status(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-1"))
    await records.save(record("run-2"))
    await cluster.clock.advance(1)
    assert await records.transition(TENANT, "run-1", Status.RUNNING, Status.PAUSED)
    assert [r.execution_id for r in await records.find_by_status(Status.RUNNING, 9)] == ["run-2"]
    assert [r.execution_id for r in await records.find_by_status(Status.PAUSED, 9)] == ["run-1"]


async def test_complete_stores_one_outcome_per_run(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-1"))
    done = await asyncio.gather(
        cluster.records(1).complete(TENANT, "run-1", Status.RUNNING, Status.SUCCEEDED, {"a": 1}),
        cluster.records(2).complete(TENANT, "run-1", Status.RUNNING, Status.FAILED, {"b": 2}),
    )
    assert sorted(done) == [False, True]
    stored = await records.get(TENANT, "run-1")
    assert stored is not None
    assert (stored.status, stored.outcome) == (Status.SUCCEEDED, {"a": 1})


async def test_a_finished_run_never_moves_again(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-1"))
    assert await records.complete(TENANT, "run-1", Status.RUNNING, Status.CANCELLED, None)
    assert await records.transition(TENANT, "run-1", Status.CANCELLED, Status.RUNNING) is False
    assert (
        await records.complete(TENANT, "run-1", Status.CANCELLED, Status.SUCCEEDED, {"x": 1})
        is False
    )
    stored = await records.get(TENANT, "run-1")
    assert stored is not None and (stored.status, stored.outcome) == (Status.CANCELLED, None)


async def test_complete_needs_a_final_status(cluster: Cluster) -> None:
    await cluster.records(1).save(record("run-1"))
    with pytest.raises(ValueError):
        await cluster.records(1).complete(TENANT, "run-1", Status.RUNNING, Status.PAUSED, None)


async def test_an_outcome_is_a_copy(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-1"))
    outcome = {"items": [1]}
    await records.complete(TENANT, "run-1", Status.RUNNING, Status.SUCCEEDED, outcome)
    outcome["items"].append(2)
    stored = await records.get(TENANT, "run-1")
    assert stored is not None and stored.outcome == {"items": [1]}
    stored.outcome["items"].append(3)
    again = await records.get(TENANT, "run-1")
    assert again is not None and again.outcome == {"items": [1]}


async def test_a_record_with_a_bad_identifier_is_refused(cluster: Cluster) -> None:
    with pytest.raises(InvalidIdentifierError):
        await cluster.records(1).save(record(""))


# tree keys


async def test_the_first_write_of_a_tree_key_wins(cluster: Cluster) -> None:
    trees = cluster.trees(1)
    assert await trees.save_if_absent(TENANT, "root-1", CANCEL_REQUEST_KEY, {"by": "a"})
    assert (
        await cluster.trees(2).save_if_absent(TENANT, "root-1", CANCEL_REQUEST_KEY, {"by": "b"})
        is False
    )
    assert await trees.get(TENANT, "root-1", CANCEL_REQUEST_KEY) == {"by": "a"}
    assert await trees.get(TENANT, "root-1", UNWINDING_KEY) is None
    assert await trees.get("tenant-2", "root-1", CANCEL_REQUEST_KEY) is None


async def test_concurrent_writes_of_one_tree_key_insert_it_once(cluster: Cluster) -> None:
    saved = await asyncio.gather(
        *(cluster.trees(i).save_if_absent(TENANT, "root-1", UNWINDING_KEY, i) for i in range(10))
    )
    assert saved.count(True) == 1


async def test_list_gives_the_keys_with_a_prefix_in_key_order(cluster: Cluster) -> None:
    trees = cluster.trees(1)
    await trees.save_if_absent(TENANT, "root-1", UNWINDING_KEY, True)
    await trees.save_if_absent(TENANT, "root-1", COMPENSATED_PREFIX + "step-b", 2)
    await trees.save_if_absent(TENANT, "root-1", COMPENSATED_PREFIX + "step-a", 1)
    await trees.save_if_absent(TENANT, "root-2", COMPENSATED_PREFIX + "step-c", 3)
    assert await trees.list(TENANT, "root-1", COMPENSATED_PREFIX) == {
        COMPENSATED_PREFIX + "step-a": 1,
        COMPENSATED_PREFIX + "step-b": 2,
    }
    everything = await trees.list(TENANT, "root-1")
    assert list(everything) == sorted(everything)
    assert len(everything) == 3
    assert await trees.list(TENANT, "nothing") == {}


async def test_delete_tree_deletes_every_key_of_the_tree_only(cluster: Cluster) -> None:
    trees = cluster.trees(1)
    await trees.save_if_absent(TENANT, "root-1", "a", 1)
    await trees.save_if_absent(TENANT, "root-1", "b", 2)
    await trees.save_if_absent(TENANT, "root-2", "a", 1)
    assert await trees.delete_tree(TENANT, "root-1") == 2
    assert await trees.delete_tree(TENANT, "root-1") == 0
    assert await trees.list(TENANT, "root-1") == {}
    assert await trees.get(TENANT, "root-2", "a") == 1
    assert await trees.save_if_absent(TENANT, "root-1", "a", "again")


async def test_tree_values_are_json_copies(cluster: Cluster) -> None:
    trees = cluster.trees(1)
    value = {"items": [1]}
    await trees.save_if_absent(TENANT, "root-1", "k", value)
    value["items"].append(2)
    got = await trees.get(TENANT, "root-1", "k")
    assert got == {"items": [1]}
    got["items"].append(3)
    assert await trees.get(TENANT, "root-1", "k") == {"items": [1]}
    with pytest.raises(TypeError):
        await trees.save_if_absent(TENANT, "root-1", "bad", {1, 2})
    for bad in ("", "k" * 256):
        with pytest.raises(InvalidIdentifierError):
            await trees.save_if_absent(TENANT, "root-1", bad, 1)


# mesh requests


async def test_one_run_per_incoming_request(cluster: Cluster) -> None:
    mesh = cluster.mesh(1)
    created = await mesh.save_if_absent("req-1", TENANT, "fp", START)
    assert created == (MeshRequest("req-1", TENANT, "fp", START), True)
    again = await cluster.mesh(2).save_if_absent("req-1", TENANT, "fp", START + 5)
    assert again == (MeshRequest("req-1", TENANT, "fp", START), False)


async def test_the_same_key_with_other_content_is_a_conflict(cluster: Cluster) -> None:
    mesh = cluster.mesh(1)
    await mesh.save_if_absent("req-1", TENANT, "fp", START)
    with pytest.raises(IdempotencyKeyConflictError):
        await mesh.save_if_absent("req-1", TENANT, "other-fp", START)
    # Keys are per tenant: another tenant's request under the key is its own.
    theirs = await mesh.save_if_absent("req-1", "tenant-2", "fp", START + 1)
    assert theirs == (MeshRequest("req-1", "tenant-2", "fp", START + 1), True)


async def test_a_request_completes_once(cluster: Cluster) -> None:
    mesh = cluster.mesh(1)
    assert await mesh.complete(TENANT, "req-1", {"ok": True}) is False
    await mesh.save_if_absent("req-1", TENANT, "fp", START)
    assert await mesh.complete(TENANT, "req-1", {"ok": True}) is True
    assert await cluster.mesh(2).complete(TENANT, "req-1", {"ok": False}) is False
    assert await mesh.get(TENANT, "req-1") == MeshRequest(
        "req-1", TENANT, "fp", START, response={"ok": True}, completed=True
    )
    saved = await mesh.save_if_absent("req-1", TENANT, "fp", START)
    assert saved.request.completed and saved.request.response == {"ok": True}
    assert await mesh.get(TENANT, "req-2") is None


async def test_a_request_time_is_whole_ms(cluster: Cluster) -> None:
    with pytest.raises(ValueError):
        await cluster.mesh(1).save_if_absent("req-1", TENANT, "fp", 1.5)  # type: ignore[arg-type]
    assert await cluster.mesh(1).get(TENANT, "req-1") is None


async def test_concurrent_saves_of_one_request_create_it_once(cluster: Cluster) -> None:
    saved = await asyncio.gather(
        *(cluster.mesh(i).save_if_absent("req-1", TENANT, "fp", START) for i in range(10))
    )
    assert [s.created for s in saved].count(True) == 1


# history


def snapshot(execution_id: str, finished_at: int, tenant: str = TENANT) -> ExecutionSnapshot:
    return ExecutionSnapshot(
        tenant_id=tenant,
        execution_id=execution_id,
        workflow="support",
        status="succeeded",
        started_at=finished_at - 100,
        finished_at=finished_at,
        record={
            "steps": [{"decision": "approve"}],
            "input_hash": "h",
            "tool_calls": [],
            "origin": "api",
        },
    )


async def test_a_snapshot_is_saved_or_replaced(cluster: Cluster) -> None:
    history = cluster.history(1)
    await history.save(snapshot("run-1", 10))
    assert await history.get(TENANT, "run-1") == snapshot("run-1", 10)
    replaced = snapshot("run-1", 20)
    await cluster.history(2).save(replaced)
    assert await history.get(TENANT, "run-1") == replaced
    assert await history.get("tenant-2", "run-1") is None


async def test_history_lists_newest_first_within_since_and_until(cluster: Cluster) -> None:
    history = cluster.history(1)
    for i, at in enumerate([10, 20, 30, 40]):
        await history.save(snapshot(f"run-{i}", at))
    await history.save(snapshot("other", 25, tenant="tenant-2"))
    listed = await history.list(TENANT)
    assert [s.finished_at for s in listed] == [40, 30, 20, 10]
    listed = await history.list(TENANT, since=20, until=40)
    assert [s.execution_id for s in listed] == ["run-2", "run-1"]
    assert [s.execution_id for s in await history.list(TENANT, limit=1)] == ["run-3"]


async def test_history_pages_by_keyset_without_losing_ties(cluster: Cluster) -> None:
    history = cluster.history(1)
    expected = []
    for at in (10, 20, 20, 20, 30):
        execution_id = f"run-{len(expected)}"
        await history.save(snapshot(execution_id, at))
        expected.append((at, execution_id))
    expected.sort(reverse=True)
    seen = []
    after = None
    while True:
        page = await history.list(TENANT, limit=2, after=after)
        if not page:
            break
        seen.extend((s.finished_at, s.execution_id) for s in page)
        after = HistoryCursor(page[-1].finished_at, page[-1].execution_id)
    assert seen == expected


async def test_history_purge_deletes_runs_finished_before(cluster: Cluster) -> None:
    history = cluster.history(1)
    await history.save(snapshot("run-1", 10))
    await history.save(snapshot("run-2", 20))
    await history.save(snapshot("run-3", 5, tenant="tenant-2"))
    assert await history.purge(20) == 2
    assert [s.execution_id for s in await history.list(TENANT)] == ["run-2"]
    assert await history.purge(20) == 0


async def test_a_snapshots_record_is_a_copy(cluster: Cluster) -> None:
    history = cluster.history(1)
    saved = snapshot("run-1", 10)
    await history.save(saved)
    saved.record["steps"].append({"decision": "later"})
    got = await history.get(TENANT, "run-1")
    assert got is not None and got.record["steps"] == [{"decision": "approve"}]


@pytest.mark.parametrize(
    "changes",
    [
        {"status": ""},
        {"status": "s" * 33},
        {"workflow": ""},
        {"started_at": 1.5},
        {"finished_at": None},
        {"tenant_id": "t" * 256},
    ],
)
async def test_a_snapshot_the_store_could_not_keep_is_refused(
    cluster: Cluster, changes: dict[str, object]
) -> None:
    with pytest.raises((ValueError, InvalidIdentifierError)):
        await cluster.history(1).save(dataclasses.replace(snapshot("run-1", 10), **changes))  # type: ignore[arg-type]
    assert cluster.backend.history == {}


async def test_history_arguments_are_checked(cluster: Cluster) -> None:
    history = cluster.history(1)
    with pytest.raises(ValueError):
        await history.list(TENANT, since=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await history.list(TENANT, limit=-1)
    with pytest.raises(InvalidIdentifierError):
        await history.list(TENANT, after=HistoryCursor(10, ""))
    with pytest.raises(ValueError):
        await history.purge("10")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {"workflow": ""},
        {"thread_id": ""},
        {"parent_execution_id": "p" * 256},
        {"created_at": 1.5},
        {"status": "exploded"},
        {"outcome": {"at": object()}},
    ],
)
async def test_a_record_the_store_could_not_keep_is_refused(
    cluster: Cluster, changes: dict[str, object]
) -> None:
    with pytest.raises((ValueError, TypeError, InvalidIdentifierError)):
        await cluster.records(1).save(dataclasses.replace(record("run-1"), **changes))  # type: ignore[arg-type]
    assert cluster.backend.records == {}


async def test_status_moves_check_their_arguments(cluster: Cluster) -> None:
    records = cluster.records(1)
    await records.save(record("run-1"))
    with pytest.raises(ValueError):
        await records.transition(TENANT, "run-1", Status.RUNNING, "exploded")  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        await records.transition(TENANT, "", Status.RUNNING, Status.PAUSED)
    with pytest.raises(ValueError):
        await records.find_by_status("exploded", 1)  # type: ignore[arg-type]
    stored = await records.get(TENANT, "run-1")
    assert stored is not None and stored.status is Status.RUNNING
