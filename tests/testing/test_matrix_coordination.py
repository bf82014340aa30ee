"""The coordination matrix: generated from one table per store, so every write of every
coordination store meets every state of its row, on the same and the other instance,
under its own tenant and another one; and it bites. Each broken store of
broken_coordination.py runs its contract's whole suite: the first ones fail only cases of
the matrix's family they break (the hand-picked cases pass them), the others fail the
family beside hand-picked cases (the family is no weaker than the cases it adds to)."""

from __future__ import annotations

import re
from typing import Any

import broken_coordination as broken
import pytest
from conformance_runner import failures, run_class

from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryChildExecutionQueueRepository,
    InMemoryCostLedgerRepository,
    InMemoryExecutionHistoryRepository,
    InMemoryExecutionLeaseEventRepository,
    InMemoryExecutionRecordRepository,
    InMemoryExecutionTreeRepository,
    InMemoryMeshRequestRepository,
    InMemoryPausedExecutionRepository,
    InMemoryRateLimitRepository,
)
from agboss_sql.testing.contracts import StoreFactory, generated_cases, store_conformance
from agboss_sql.testing.contracts._matrix_coordination import TABLES, coordination_cases
from agboss_sql.testing.contracts._matrix_keyed import TABLES as KEYED_TABLES
from agboss_sql.testing.contracts._matrix_rows import ABSENT
from agboss_sql.testing.contracts._matrix_tenants import CASES as TENANT_CASES
from agboss_sql.testing.contracts._matrix_wakes import TABLES as WAKE_TABLES
from agboss_sql.testing.contracts._registry import SUITES, suite_cases

ALL_TABLES = (*TABLES, *KEYED_TABLES, *WAKE_TABLES)

SOUND: dict[str, type[Any]] = {
    "paused_execution": InMemoryPausedExecutionRepository,
    "execution_record": InMemoryExecutionRecordRepository,
    "mesh_request": InMemoryMeshRequestRepository,
    "execution_tree": InMemoryExecutionTreeRepository,
    "execution_history": InMemoryExecutionHistoryRepository,
    "cost_ledger": InMemoryCostLedgerRepository,
    "rate_limit": InMemoryRateLimitRepository,
    "child_queue": InMemoryChildExecutionQueueRepository,
    "execution_lease_event": InMemoryExecutionLeaseEventRepository,
}


def _contract_of(cls: type[Any]) -> str:
    return next(c for c, sound in SOUND.items() if issubclass(cls, sound))


def _alone(cls: type[Any]) -> type:
    """The contract's whole suite for `cls` alone, on a fresh backend."""
    backend = InMemoryBackend()
    contract = _contract_of(cls)

    async def reset() -> None:
        backend.reset()

    # Rate limits decide by the store's time, the others by the application's clock.
    on_store_time = issubclass(cls, InMemoryRateLimitRepository)
    factory = StoreFactory(
        lambda seam: cls(
            backend, seam.store_clock if on_store_time else seam.clock, seam.application
        ),
        reset=reset,
    )
    return store_conformance(name=cls.__name__, stores={contract: factory}, interleavings=False)


def _family(name: str) -> str | None:
    """The matrix family of a generated case: the table's or the tenant cases'."""
    if "__tenants_" in name:
        return "tenants"
    if "__matrix_" in name and "_on_" in name:
        return "rows"
    return None


def test_every_write_meets_every_state_of_its_table() -> None:
    for table in ALL_TABLES:
        names = {state.name for state in table.states}
        assert ABSENT in names and len(names) == len(table.states), table.what
        for op in table.ops:
            assert set(op.answers) == names, (table.what, op.name)
            assert set(op.after) <= names, (table.what, op.name)
    for contract in SOUND:
        rows = sum(len(t.ops) * len(t.states) for t in ALL_TABLES if t.contract == contract)
        assert rows, f"{contract} has no table"
        found = coordination_cases(contract)
        assert len(found) == rows + len(TENANT_CASES.get(contract, []))
        names = [case.name for case in suite_cases(contract)]
        assert len(set(names)) == len(names), f"{contract} repeats a case name"
    for contract in set(SUITES) - set(SOUND):
        assert coordination_cases(contract) == [], contract


def test_the_generated_class_runs_every_matrix_case() -> None:
    cls = _alone(InMemoryPausedExecutionRepository)
    names = [n for n in generated_cases(cls) if _family(n)]
    assert len(names) == len(coordination_cases("paused_execution"))


@pytest.mark.parametrize("cls", list(SOUND.values()), ids=list(SOUND))
async def test_the_sound_store_passes_its_whole_suite(cls: type[Any]) -> None:
    results = await run_class(_alone(cls), real_time=False)
    assert failures(results) == {}
    assert sum(1 for n in results if _family(n)) == len(coordination_cases(_contract_of(cls)))


ONLY_THE_FAMILY = [
    (broken.SaveOverAClosedPause, "rows", "pause-states"),
    (broken.CancelOfAnyTenant, "rows", "tenant-isolation"),
    (broken.CancelledRunsRequeue, "rows", "record-states"),
    (broken.CompleteOfAnyTenant, "rows", "tenant-isolation"),
    (broken.CancelChecksItsTenantCancelsEvery, "rows", "tenant-isolation"),
    (broken.TransitionChecksItsTenantMovesEvery, "rows", "tenant-isolation"),
    (broken.ConflictOnlyWhileOpen, "rows", "mesh-states"),
    (broken.ClaimsAWokenWake, "rows", "child-states"),
    (broken.WakesWaitingEntryOfAnyTenant, "tenants", "tenant-isolation"),
    (broken.ApplicationReserveAgainstEveryTenant, "tenants", "tenant-isolation"),
]
"""Broken stores only the matrix catches: (store, family, rule)."""

ALSO_THE_FAMILY = [
    (broken.TakesACancelledPause, "rows", "pause-states"),
    (broken.DeletedKeysStayTaken, "rows", "tree-states"),
    (broken.TreeKeyOnceAcrossTenants, "rows", "tenant-isolation"),
    (broken.HistoryByExecutionOnly, "rows", "tenant-isolation"),
    (broken.EntryIdAcrossTenants, "rows", "tenant-isolation"),
    (broken.EntryIdAcrossTenants, "tenants", "tenant-isolation"),
    (broken.TotalsCountEveryTenantsReservations, "tenants", "tenant-isolation"),
    (broken.RenewsARunOutSlot, "rows", "slot-states"),
    (broken.RefusesAWindowFilledExactly, "rows", "window-states"),
    (broken.PauseLastWins, "rows", "pause-never-shortens"),
    (broken.LogOfEveryTenant, "rows", "tenant-isolation"),
    (broken.FinishesAWaitingChild, "rows", "child-states"),
    (broken.RestartsAWaitingChild, "rows", "child-states"),
]
"""Broken stores the matrix catches beside hand-picked cases: (store, family, rule)."""


def _ids(rows: list[tuple[type[Any], str, str]]) -> list[str]:
    return [f"{cls.__name__} fails {family} on {rule}" for cls, family, rule in rows]


@pytest.mark.parametrize(("cls", "family", "rule"), ONLY_THE_FAMILY, ids=_ids(ONLY_THE_FAMILY))
async def test_only_the_family_catches(cls: type[Any], family: str, rule: str) -> None:
    failed = failures(await run_class(_alone(cls), real_time=False))
    assert failed, f"{cls.__name__} passes its whole suite"
    outside = {n: m for n, m in failed.items() if _family(n) != family}
    assert outside == {}, f"{cls.__name__} fails cases outside the {family} family"
    assert any(re.search(rf"\[{re.escape(rule)}\] ", m) for m in failed.values()), failed


@pytest.mark.parametrize(("cls", "family", "rule"), ALSO_THE_FAMILY, ids=_ids(ALSO_THE_FAMILY))
async def test_the_family_catches_beside_the_cases(cls: type[Any], family: str, rule: str) -> None:
    failed = failures(await run_class(_alone(cls), real_time=False))
    ours = {n: m for n, m in failed.items() if _family(n) == family}
    assert any(re.search(rf"\[{re.escape(rule)}\] ", m) for m in ours.values()), failed
