"""Each audit rule bites: a deliberately broken piece (store or runtime) makes the
matching scenario's audit fail on that rule, with real pods on the database under test;
the rules no workload piece can break alone are proven on hand-made histories."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fault_support import fault_url
from support.capabilities import embedded_url

from agboss_sql.lab.faults import (
    AuditFacts,
    FaultSettings,
    StoreHistory,
    audit,
    format_report,
    run_scenario,
)
from agboss_sql.lab.faults.audit import never_submitted

BROKEN = "broken_pieces"


@dataclass(frozen=True)
class Bite:
    piece: str
    scenario: str
    rule: str
    stores: str = "agboss_sql.lab.faults.fixture:sql_store_set"
    pieces: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    events_only: bool = False
    """The piece is the pods' own and its rule reads the pods' events alone, never the
    store's history: whether it bites does not depend on the database, so it runs on the
    embedded one only (the SQLite tier of every run). The scenario itself runs clean on
    every database in test_fault_scenarios.py."""


BITES = [
    Bite(
        "a keeper that never fences itself",
        "zombie",
        "zombie-fenced",
        pieces={"keeper": f"{BROKEN}:NeverFencingKeeper"},
        # Short enough that the wait for the self-fencing that never comes fails soon, long
        # enough that a loaded machine reaches the hold first (10 s was not, at load 8).
        settings={"wait_s": 30.0},
        # zombie-fenced's first half: no `lease-lost` event from the keeper.
        events_only=True,
    ),
    Bite(
        "an effect store that writes its business row outside the transaction",
        "zombie",
        "charged-once",
        stores=f"{BROKEN}:outside_transaction_set",
    ),
    Bite(
        "a queue finish without the attempt compare",
        "zombie-child",
        "child-once",
        stores=f"{BROKEN}:no_attempt_compare_set",
    ),
    Bite(
        "a runtime that compensates on a hand-over",
        "zombie",
        "no-undo-on-handover",
        pieces={"compensate_on_handover": True},
    ),
    Bite(
        "a runtime without the recovery sweep",
        "kill-before-fence",
        "tree-ends",
        pieces={"recovery": False},
        settings={"tree_bound_s": 15.0},
    ),
    Bite(
        "a graceful stop that keeps its leases",
        "sigterm",
        "graceful-stop",
        pieces={"release_on_stop": False},
    ),
    Bite(
        "a store call that never answers",
        "kill-during-pause",
        "no-hang",
        stores=f"{BROKEN}:hanging_pause_set",
        settings={"op_bound_ms": 3_000, "tree_bound_s": 10.0, "wait_s": 10.0},
        events_only=True,
    ),
]


@pytest.mark.faults
@pytest.mark.database
@pytest.mark.parametrize("bite", BITES, ids=[b.piece.replace(" ", "-") for b in BITES])
def test_a_broken_piece_fails_its_rule(bite: Bite, tmp_path: Path) -> None:
    if bite.events_only and not embedded_url(fault_url()):
        pytest.skip("its rule reads the pods' events alone: run on the embedded database")
    settings = FaultSettings(pieces=bite.pieces, **bite.settings)
    result = run_scenario(
        fault_url(), bite.scenario, stores=bite.stores, settings=settings, dump_dir=tmp_path
    )
    rules = {v.rule for v in result.violations}
    assert bite.rule in rules, (
        f"{bite.piece} in {bite.scenario} was not caught by [{bite.rule}]:\n"
        + format_report([result])
    )
    # The failed run was dumped: each pod's events and output, and the store history.
    assert result.run_dir is not None
    dumped = {p.name for p in result.run_dir.iterdir()}
    assert {"store-history.json", "violations.txt", "pod-1.events.jsonl", "pod-1.out"} <= dumped
    # No pod outlived the run.
    assert len(result.pids) == settings.pods
    for pid in result.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _grant(execution: str, instance: str, epoch: int, kind: str = "acquired") -> dict[str, Any]:
    return {
        "tenant_id": "t",
        "execution_id": execution,
        "instance_id": instance,
        "lease_epoch": epoch,
        "kind": kind,
        "at": 0,
        "reason": None,
    }


def _result(step: str, token: int, stored_at: int) -> dict[str, Any]:
    return {
        "identity": f"tree|{step}",
        "scope_key": "t/tree",
        "name": "charge",
        "step_execution_id": "tree",
        "step_idempotency_key": step,
        "token": token,
        "stored_at": stored_at,
        "result": "{}",
    }


FACTS = AuditFacts(trees=[], children_per_tree=0)


def test_one_holder_bites_on_an_epoch_granted_twice() -> None:
    history = StoreHistory(
        lease_events=[_grant("tree", "pod-1", 1), _grant("tree", "pod-2", 1, "taken-over")]
    )
    assert [v.rule for v in audit(history, [], FACTS)] == ["one-holder"]


def test_one_holder_bites_on_a_write_at_an_older_epoch_after_a_newer_one() -> None:
    history = StoreHistory(
        results=[_result("s1", 2, 100), _result("s2", 1, 200)],
        business_rows=["tree|s1", "tree|s2"],
    )
    assert [v.rule for v in audit(history, [], FACTS)] == ["one-holder"]


def test_a_clean_history_passes() -> None:
    history = StoreHistory(
        lease_events=[_grant("tree", "pod-1", 1), _grant("tree", "pod-2", 2, "taken-over")],
        results=[_result("s1", 1, 100), _result("s2", 2, 200)],
        business_rows=["tree|s1", "tree|s2"],
    )
    assert audit(history, [], FACTS) == []


def test_result_and_row_bites_both_ways() -> None:
    history = StoreHistory(results=[_result("s1", 1, 100)], business_rows=["tree|s2"])
    found = audit(history, [], FACTS)
    assert [v.rule for v in found] == ["result-and-row", "result-and-row"]


def test_no_hang_forgives_a_frozen_pod_only_while_frozen() -> None:
    slow = {
        "kind": "op-slow",
        "pod": "pod-1",
        "op": "x.y",
        "ms": 20_000.0,
        "start": 100,
        "end": 20_100,
    }
    frozen = AuditFacts(trees=[], children_per_tree=0, freezes=[("pod-1", 50, 10_000)])
    assert audit(StoreHistory(), [slow], frozen) == []
    assert [v.rule for v in audit(StoreHistory(), [slow], FACTS)] == ["no-hang"]


def test_a_tree_is_excused_only_when_its_killed_pod_never_submitted_it() -> None:
    """A tree whose pod was killed before its record committed was never promised; one with
    a record, one an event names, or one of a pod that was not killed, still is."""
    owners = {"tree-1-0": "pod-1", "tree-1-1": "pod-1", "tree-2-0": "pod-2"}
    events = [{"kind": "tree-run", "pod": "pod-1", "tree": "tree-1-0"}]
    assert never_submitted(owners, owners, {"pod-1"}, set(), events) == ["tree-1-1"]
    assert never_submitted(owners, owners, {"pod-1"}, {"tree-1-1"}, events) == []
    assert never_submitted(owners, owners, set(), set(), events) == []

    excused = AuditFacts(trees=["tree-1-1"], children_per_tree=2, unsubmitted=["tree-1-1"])
    assert audit(StoreHistory(), [], excused) == []
    # The audit checks the excuse again on the final rows and events.
    recorded = StoreHistory(records=[{"execution_id": "tree-1-1", "status": "running"}])
    assert [v.rule for v in audit(recorded, [], excused)] == ["child-once"] * 2 + ["tree-ends"]
    named = [{"kind": "tree-run", "pod": "pod-2", "tree": "tree-1-1"}]
    assert {v.rule for v in audit(StoreHistory(), named, excused)} == {"child-once", "tree-ends"}
    unexcused = AuditFacts(trees=["tree-1-1"], children_per_tree=2)
    assert [v.rule for v in audit(StoreHistory(), [], unexcused)] == ["child-once"] * 2 + [
        "tree-ends"
    ]
