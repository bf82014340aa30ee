"""In-memory pauses and the cost ledger (docs/contracts.md)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from memory_cluster import START, TENANT, Cluster

from agboss_sql.contracts import (
    BudgetScope,
    CostEntry,
    CostTotal,
    DuplicatePauseError,
    InvalidIdentifierError,
    NotPausedError,
    PausedExecution,
    PauseStatus,
)


def pause(
    pause_id: str,
    *,
    tenant: str = TENANT,
    root: str = "root-1",
    status: PauseStatus = PauseStatus.PENDING,
    created_at: int = START,
    resolved_at: int | None = None,
) -> PausedExecution:
    return PausedExecution(
        tenant_id=tenant,
        pause_id=pause_id,
        execution_id=f"exec-{pause_id}",
        root_execution_id=root,
        thread_id="thread-1",
        status=status,
        request={"question": "approve?"},
        decision=None,
        created_at=created_at,
        resolved_at=resolved_at,
    )


async def test_a_saved_pause_reads_back_for_its_tenant_only(cluster: Cluster) -> None:
    pauses = cluster.pauses(1)
    await pauses.save(pause("p-1"))
    assert await cluster.pauses(2).get(TENANT, "p-1") == pause("p-1")
    assert await pauses.get("tenant-2", "p-1") is None
    assert await pauses.get(TENANT, "p-2") is None


async def test_a_pause_id_is_saved_once_per_tenant(cluster: Cluster) -> None:
    await cluster.pauses(1).save(pause("p-1"))
    with pytest.raises(DuplicatePauseError):
        await cluster.pauses(2).save(pause("p-1", root="root-2"))
    stored = await cluster.pauses(1).get(TENANT, "p-1")
    assert stored is not None and stored.root_execution_id == "root-1"
    await cluster.pauses(2).save(pause("p-1", tenant="tenant-2"))
    assert await cluster.pauses(1).get("tenant-2", "p-1") == pause("p-1", tenant="tenant-2")


async def test_a_pause_is_resolved_once_whichever_instance_answers(cluster: Cluster) -> None:
    await cluster.pauses(1).save(pause("p-1"))
    await cluster.clock.advance(5)
    resolved = await cluster.pauses(2).resolve(TENANT, "p-1", {"approved": True})
    assert (resolved.status, resolved.decision, resolved.resolved_at) == (
        PauseStatus.RESOLVED,
        {"approved": True},
        START + 5,
    )
    with pytest.raises(NotPausedError) as second:
        await cluster.pauses(1).resolve(TENANT, "p-1", {"approved": False})
    assert second.value.code == "pause.not-paused"
    stored = await cluster.pauses(1).get(TENANT, "p-1")
    assert stored == resolved


async def test_concurrent_answers_resolve_once(cluster: Cluster) -> None:
    await cluster.pauses(1).save(pause("p-1"))
    answers = await asyncio.gather(
        *(cluster.pauses(i).resolve(TENANT, "p-1", i) for i in range(10)),
        return_exceptions=True,
    )
    assert len([a for a in answers if isinstance(a, PausedExecution)]) == 1
    assert all(isinstance(a, (PausedExecution, NotPausedError)) for a in answers)


async def test_an_unknown_or_foreign_pause_is_not_paused(cluster: Cluster) -> None:
    await cluster.pauses(1).save(pause("p-1"))
    with pytest.raises(NotPausedError):
        await cluster.pauses(1).resolve(TENANT, "nobody", 1)
    with pytest.raises(NotPausedError):
        await cluster.pauses(1).resolve("tenant-2", "p-1", 1)


async def test_resolved_lists_the_trees_decisions_to_drain_oldest_first(cluster: Cluster) -> None:
    pauses = cluster.pauses(1)
    await pauses.save(pause("p-late", created_at=START + 2))
    await pauses.save(pause("p-early", created_at=START + 1))
    await pauses.save(pause("p-pending"))
    await pauses.save(pause("p-other-root", root="root-2"))
    for pause_id in ("p-late", "p-early", "p-other-root"):
        await pauses.resolve(TENANT, pause_id, pause_id)
    drained = await pauses.resolved(TENANT, "root-1")
    assert [(p.pause_id, p.decision) for p in drained] == [
        ("p-early", "p-early"),
        ("p-late", "p-late"),
    ]
    assert await pauses.resolved("tenant-2", "root-1") == []


async def test_take_moves_resolved_to_taken_once(cluster: Cluster) -> None:
    pauses = cluster.pauses(1)
    await pauses.save(pause("p-1"))
    assert await pauses.take(TENANT, "p-1") is False
    await pauses.resolve(TENANT, "p-1", "yes")
    assert await pauses.take(TENANT, "p-1") is True
    assert await cluster.pauses(2).take(TENANT, "p-1") is False
    taken = await pauses.get(TENANT, "p-1")
    assert taken is not None and (taken.status, taken.decision) == (PauseStatus.TAKEN, "yes")
    assert await pauses.resolved(TENANT, "root-1") == []


async def test_cancel_moves_pending_to_cancelled_once(cluster: Cluster) -> None:
    pauses = cluster.pauses(1)
    await pauses.save(pause("p-1"))
    await pauses.save(pause("p-2"))
    assert await pauses.cancel(TENANT, "p-1") is True
    assert await pauses.cancel(TENANT, "p-1") is False
    with pytest.raises(NotPausedError):
        await pauses.resolve(TENANT, "p-1", "late")
    await pauses.resolve(TENANT, "p-2", "yes")
    assert await pauses.cancel(TENANT, "p-2") is False
    assert await pauses.cancel("tenant-2", "p-2") is False


async def test_purge_deletes_taken_and_cancelled_pauses_last_moved_before_the_retention(
    cluster: Cluster,
) -> None:
    pauses = cluster.pauses(1)
    for pause_id in ("taken-old", "cancelled-old", "pending-old", "resolved-old", "taken-late"):
        await pauses.save(pause(pause_id, created_at=START - 10_000))
    await pauses.resolve(TENANT, "taken-old", "yes")
    await pauses.take(TENANT, "taken-old")
    await pauses.cancel(TENANT, "cancelled-old")
    await pauses.resolve(TENANT, "resolved-old", "yes")
    await pauses.resolve(TENANT, "taken-late", "yes")
    await cluster.clock.advance(1_000)
    # Resolved long ago but taken now: its age counts from the take.
    await pauses.take(TENANT, "taken-late")
    await pauses.save(pause("cancelled-new", created_at=START - 10_000))
    await pauses.cancel(TENANT, "cancelled-new")
    await pauses.save(pause("saved-taken", status=PauseStatus.TAKEN, created_at=0))
    assert await pauses.purge(START + 1_000) == 2
    assert {pause_id for _, pause_id in cluster.backend.pauses} == {
        "pending-old",
        "resolved-old",
        "taken-late",
        "cancelled-new",
        "saved-taken",
    }
    assert await pauses.purge(START + 1_000) == 0
    assert await pauses.purge(START + 1_001) == 3


async def test_pause_payloads_are_copies(cluster: Cluster) -> None:
    pauses = cluster.pauses(1)
    saved = pause("p-1")
    await pauses.save(saved)
    saved.request["question"] = "changed"
    decision = {"approved": [1]}
    resolved = await pauses.resolve(TENANT, "p-1", decision)
    decision["approved"].append(2)
    resolved.decision["approved"].append(3)
    stored = await pauses.get(TENANT, "p-1")
    assert stored is not None
    assert (stored.request, stored.decision) == ({"question": "approve?"}, {"approved": [1]})


# cost ledger


def entry(
    entry_id: str,
    *,
    execution: str = "run-1",
    tenant: str = TENANT,
    at: int = START,
    cost: int = 100,
) -> CostEntry:
    return CostEntry(
        entry_id=entry_id,
        tenant_id=tenant,
        execution_id=execution,
        application="support",
        tokens_in=10,
        tokens_out=5,
        cost_micros=cost,
        at=at,
    )


async def test_an_entry_is_recorded_once(cluster: Cluster) -> None:
    costs = cluster.costs(1)
    assert await costs.record(entry("e-1")) is True
    assert await cluster.costs(2).record(entry("e-1")) is False
    assert await costs.total(BudgetScope.EXECUTION, "run-1") == CostTotal(10, 5, 100)


async def test_totals_per_scope(cluster: Cluster) -> None:
    costs = cluster.costs(1)
    await costs.record(entry("e-1", execution="run-1"))
    await costs.record(entry("e-2", execution="run-2"))
    await costs.record(entry("e-3", execution="run-3", tenant="tenant-2"))
    assert await costs.total(BudgetScope.EXECUTION, "run-2") == CostTotal(10, 5, 100)
    assert await costs.total(BudgetScope.TENANT, TENANT) == CostTotal(20, 10, 200)
    assert await costs.total(BudgetScope.APPLICATION, "support") == CostTotal(30, 15, 300)
    assert await costs.total(BudgetScope.TENANT, "nobody") == CostTotal()


async def test_a_total_since_counts_entries_at_or_after(cluster: Cluster) -> None:
    costs = cluster.costs(1)
    await costs.record(entry("e-1", at=START - 1))
    await costs.record(entry("e-2", at=START))
    await costs.record(entry("e-3", at=START + 1))
    assert (await costs.total(BudgetScope.TENANT, TENANT, since=START)).cost_micros == 200


async def test_reservations_stay_within_the_limit_and_count_in_the_total(
    cluster: Cluster,
) -> None:
    costs = cluster.costs(1)
    await costs.record(entry("e-1", cost=600))
    assert await costs.try_reserve(BudgetScope.TENANT, TENANT, 300, 1_000) is True
    assert await costs.try_reserve(BudgetScope.TENANT, TENANT, 101, 1_000) is False
    assert await costs.try_reserve(BudgetScope.TENANT, TENANT, 100, 1_000) is True
    assert await costs.total(BudgetScope.TENANT, TENANT) == CostTotal(10, 5, 1_000)
    # A reservation belongs to its scope and key only.
    assert await costs.total(BudgetScope.EXECUTION, "run-1") == CostTotal(10, 5, 600)
    assert await costs.total(BudgetScope.TENANT, "tenant-2") == CostTotal()


async def test_reservations_count_in_every_total_of_their_key_whatever_since(
    cluster: Cluster,
) -> None:
    costs = cluster.costs(1)
    assert await costs.try_reserve(BudgetScope.EXECUTION, "run-1", 50, 100)
    await cluster.clock.advance(10)
    assert await costs.try_reserve(BudgetScope.EXECUTION, "run-1", 50, 100)
    assert await costs.try_reserve(BudgetScope.EXECUTION, "run-1", 1, 100) is False
    later = await costs.total(BudgetScope.EXECUTION, "run-1", since=START + 1_000)
    assert later == CostTotal(0, 0, 100)


async def test_concurrent_reservations_never_pass_the_limit(cluster: Cluster) -> None:
    reserved = await asyncio.gather(
        *(cluster.costs(i).try_reserve(BudgetScope.TENANT, TENANT, 100, 1_050) for i in range(20))
    )
    assert reserved.count(True) == 10
    assert (await cluster.costs(1).total(BudgetScope.TENANT, TENANT)).cost_micros == 1_000


async def test_a_negative_reservation_is_refused(cluster: Cluster) -> None:
    with pytest.raises(ValueError):
        await cluster.costs(1).try_reserve(BudgetScope.TENANT, TENANT, -1, 100)


@pytest.mark.parametrize(
    "changes", [{"tokens_in": 1.5}, {"cost_micros": None}, {"at": "now"}, {"entry_id": ""}]
)
async def test_an_entry_the_ledger_could_not_keep_is_refused(
    cluster: Cluster, changes: dict[str, object]
) -> None:
    with pytest.raises((ValueError, InvalidIdentifierError)):
        await cluster.costs(1).record(dataclasses.replace(entry("e-1"), **changes))  # type: ignore[arg-type]
    assert cluster.backend.cost_entries == {}


async def test_pause_and_total_arguments_are_checked(cluster: Cluster) -> None:
    with pytest.raises(ValueError):
        await cluster.pauses(1).purge(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await cluster.costs(1).total(BudgetScope.TENANT, TENANT, since=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await cluster.costs(1).total("galaxy", TENANT)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        await cluster.pauses(1).save(pause("p-1", tenant=""))
