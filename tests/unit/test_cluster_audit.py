"""The cluster's audit bites: a history that breaks a rule is reported under that rule,
and the same history without the break passes."""

from __future__ import annotations

from typing import Any

from agboss_sql.contracts.stores import COMPENSATED_PREFIX, UNWINDING_KEY
from agboss_sql.lab.cluster import ClusterConfig, Report, audit_cluster
from agboss_sql.lab.faults.audit import StoreHistory
from agboss_sql.lab.tree_worker import END_DECISION_KEY, TreeSpec

TENANT = "t"
TREE = "r-t00"
SPEC = TreeSpec(fan_out=1, depth=1)
LEAF = f"{TREE}.c0"


def _event(execution: str, instance: str, epoch: int, kind: str, at: int = 0) -> dict[str, Any]:
    return {
        "tenant_id": TENANT,
        "execution_id": execution,
        "instance_id": instance,
        "lease_epoch": epoch,
        "kind": kind,
        "at": at,
        "reason": None,
    }


def _result(execution: str, step: str, name: str, token: int = 1, at: int = 0) -> dict[str, Any]:
    return {
        "identity": f"{execution}/{step}/{name}",
        "tenant_id": TENANT,
        "scope_key": execution,
        "name": name,
        "step_execution_id": execution,
        "step_idempotency_key": step,
        "lease_execution_id": execution,
        "token": token,
        "result": '{"value": null, "ms": 5}',
        "stored_at": at,
    }


def _history(status: str = "succeeded") -> StoreHistory:
    """One tree with one leaf, run by w1 without a hitch."""
    rows = [f"{TREE}|reserve", f"{LEAF}|charge"]
    results = [
        _result(TREE, "plan", "step"),
        _result(TREE, "reserve", "charge"),
        _result(LEAF, "charge", "charge"),
        _result(TREE, "close", "step"),
    ]
    return StoreHistory(
        lease_events=[
            _event(TREE, "w1", 1, "acquired"),
            _event(TREE, "w1", 1, "finished"),
            _event(LEAF, "w1", 1, "acquired"),
            _event(LEAF, "w1", 1, "finished"),
        ],
        leases=[
            {"tenant_id": TENANT, "execution_id": e, "lease_epoch": 1, "holder_instance_id": "w1"}
            for e in (TREE, LEAF)
        ],
        results=results,
        business_rows=rows,
        children=[
            {"child_execution_id": LEAF, "status": "finished", "attempt": 1, "tenant_id": TENANT}
        ],
        records=[{"execution_id": TREE, "status": status, "outcome": None}],
        tree_keys=[_decision("cancel" if status == "cancelled" else "close")],
    )


def _decision(decision: str) -> dict[str, Any]:
    """The tree's end decision, as the table returns it (JSON text)."""
    return {
        "root_execution_id": TREE,
        "key": END_DECISION_KEY,
        "value": f'{{"decision": "{decision}", "by": "w1", "at": 0}}',
    }


def _audit(
    history: StoreHistory,
    frozen: tuple[str | None, list[tuple[str, str, int]], int | None] = (None, [], None),
) -> Report:
    return audit_cluster(
        history,
        [{"kind": "child-finish", "child": LEAF, "attempt": 1, "finished": True, "pod": "w1"}],
        config=ClusterConfig(url="sqlite:///x.sqlite", fan_out=1, depth=1),
        tenant=TENANT,
        spec_of={TREE: SPEC},
        frozen=frozen,
        slow_stops=[],
        chaos=[],
        wall_s=1.0,
    )


def _rules(report: Report) -> list[str]:
    return [v.split("]")[0].lstrip("[") for v in report.violations]


def test_a_clean_run_passes() -> None:
    report = _audit(_history())
    assert report.ok, report.violations
    assert report.orders_charged == 1 and report.steps_stored == 4


def test_an_order_charged_twice_is_reported() -> None:
    history = _history()
    history.business_rows.append(f"{LEAF}|charge")
    assert "charged-once" in _rules(_audit(history))


def test_a_succeeded_tree_missing_a_charge_is_reported() -> None:
    history = _history()
    history.business_rows.remove(f"{LEAF}|charge")
    history.results = [r for r in history.results if r["step_execution_id"] != LEAF]
    assert _rules(_audit(history)) == ["tree-ends"]


def test_a_cancelled_tree_must_refund_what_it_charged_and_undo_its_reserve() -> None:
    history = _history("cancelled")
    history.tree_keys += [
        {"root_execution_id": TREE, "key": UNWINDING_KEY},
        {"root_execution_id": TREE, "key": f"{COMPENSATED_PREFIX}reserve"},
    ]
    history.business_rows.append(f"{TREE}|undo:reserve")
    history.results.append(_result(TREE, "undo:reserve", "charge"))
    report = _audit(history)
    assert _rules(report) == ["tree-ends"]
    assert "refunded False" in report.violations[0]
    history.business_rows.append(f"{TREE}|undo:charge:{LEAF}")
    history.results.append(_result(TREE, f"undo:charge:{LEAF}", "charge"))
    assert _audit(history).ok


def test_a_tree_whose_end_disagrees_with_its_decision_is_reported() -> None:
    # A cancel that won, and the tree succeeded all the same.
    history = _history()
    history.tree_keys = [_decision("cancel")]
    report = _audit(history)
    assert _rules(report) == ["tree-ends"]
    assert "end decision is 'cancel'" in report.violations[0]
    # No decision at all: the close never claimed the end.
    history.tree_keys = []
    assert _rules(_audit(history)) == ["tree-ends"]


def test_a_tree_that_did_not_end_is_reported() -> None:
    assert _rules(_audit(_history("queued"))) == ["tree-ends"]


def test_an_epoch_logged_late_is_allowed_only_when_its_holder_logs_it_lost() -> None:
    history = _history()
    history.lease_events = [
        _event(TREE, "w2", 2, "taken-over"),
        _event(TREE, "w2", 2, "finished"),
        _event(TREE, "w1", 1, "acquired"),
        _event(LEAF, "w1", 1, "acquired"),
        _event(LEAF, "w1", 1, "finished"),
    ]
    history.leases[0]["lease_epoch"] = 2
    assert _rules(_audit(history)) == ["epochs-increase"]
    history.lease_events.insert(3, _event(TREE, "w1", 1, "lost"))
    assert _audit(history).ok


def test_a_takeover_missing_from_the_log_is_reported() -> None:
    history = _history()
    history.leases[0]["lease_epoch"] = 2
    assert _rules(_audit(history)) == ["epochs-increase"]


def test_a_zombie_that_stored_after_it_woke_or_never_saw_its_loss_is_reported() -> None:
    history = _history()
    history.lease_events[2:2] = [_event(TREE, "w2", 2, "taken-over", at=50)]
    history.leases[0]["lease_epoch"] = 2
    history.lease_events = [
        e
        for e in history.lease_events
        if e["instance_id"] != "w1" or e["execution_id"] != TREE or e["kind"] != "finished"
    ]
    history.lease_events.append(_event(TREE, "w2", 2, "finished", at=60))
    frozen = ("w1", [("w1", TREE, 1)], 100)
    # w1 logged no loss after it woke: reported.
    assert _rules(_audit(history, frozen)) == ["zombie-fenced"]
    history.lease_events.append(_event(TREE, "w1", 1, "lost", at=120))
    assert _audit(history, frozen).ok
    # And a write it stored at its old epoch after it woke is reported too.
    history.results.append(_result(TREE, "late", "step", token=1, at=130))
    assert "zombie-fenced" in _rules(_audit(history, frozen))
