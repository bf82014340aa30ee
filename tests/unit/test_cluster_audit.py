"""The cluster's audit bites: a history that breaks a rule is reported under that rule,
and the same history without the break passes."""

from __future__ import annotations

import json
from typing import Any

from agboss_sql.contracts.stores import COMPENSATED_PREFIX, UNWINDING_KEY
from agboss_sql.lab import tree_app
from agboss_sql.lab.cluster import ClusterConfig, ClusterRun
from agboss_sql.lab.cluster_audit import END_KEY, UNDO_EFFECT, Report, audit_cluster
from agboss_sql.lab.faults.audit import StoreHistory

TENANT = "t"
TREE = "r-t00"
LEAF = f"{TREE}/split#1.0"
RUN = ClusterRun("tree", {"fan_out": 1, "depth": 1, "pause": False, "step_ms": 0}, TREE)


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
        "result": '{"v": null}',
        "stored_at": at,
    }


def _key(key: str, value: Any) -> dict[str, Any]:
    return {"tenant_id": TENANT, "root_execution_id": TREE, "key": key, "value": json.dumps(value)}


def _history(status: str = "succeeded") -> StoreHistory:
    """One tree with one leaf, run by w1 without a hitch (or cancelled after its charge)."""
    history = StoreHistory(
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
        results=[
            _result(TREE, "plan#1", "wf.step"),
            _result(TREE, "reserve#1", "wf.effect"),
            _result(LEAF, "charge#1", "wf.effect"),
            _result(TREE, "close#1", "wf.step"),
        ],
        business_rows=[f"{TREE}|reserve", f"{LEAF}|charge"],
        children=[
            {"child_execution_id": LEAF, "status": "finished", "attempt": 1, "tenant_id": TENANT}
        ],
        records=[{"execution_id": TREE, "status": status, "outcome": None}],
        tree_keys=[_key(END_KEY, {"decision": "cancel" if status == "cancelled" else "close"})],
    )
    if status == "cancelled":
        history.results.pop()  # the close never ran
        history.records[0]["outcome"] = {"error": {"code": "execution.cancelled"}}
        history.tree_keys.append(_key(UNWINDING_KEY, {"compensators": []}))
        for execution, step, row in (
            (LEAF, "charge#1", "undo:charge"),
            (TREE, "reserve#1", "undo:reserve"),
        ):
            key = f"{execution}/{step}"
            history.tree_keys.append(_key(COMPENSATED_PREFIX + key, True))
            history.results.append(_result(TREE, f"undo/{key}", UNDO_EFFECT))
            history.business_rows.append(f"{execution}|{row}")
    return history


def _audit(
    history: StoreHistory,
    events: list[dict[str, Any]] | None = None,
    frozen: tuple[str | None, list[tuple[str, str, int]], int | None] = (None, [], None),
) -> Report:
    finish = {"kind": "child-finish", "child": LEAF, "attempt": 1, "finished": True, "pod": "w1"}
    return audit_cluster(
        history,
        [finish, *(events or [])],
        config=ClusterConfig(url="sqlite:///x.sqlite", fan_out=1, depth=1),
        workload=tree_app.workload,
        tenant=TENANT,
        runs=[RUN],
        frozen=frozen,
        slow_stops=[],
        chaos=[],
        wall_s=1.0,
    )


def _rules(report: Report) -> list[str]:
    return sorted({v.split("]")[0].lstrip("[") for v in report.violations})


def test_a_clean_run_passes_succeeded_and_cancelled() -> None:
    report = _audit(_history())
    assert report.ok, report.violations
    assert report.runs == {"succeeded": 1} and report.effects_stored == 4
    cancelled = _audit(_history("cancelled"))
    assert cancelled.ok, cancelled.violations
    assert cancelled.undos == 2


def test_a_business_row_written_twice_or_an_attempt_sent_twice_is_reported() -> None:
    history = _history()
    history.business_rows.append(f"{LEAF}|charge")
    assert _rules(_audit(history)) == ["effect-once"]
    sent = {"kind": "sent", "call": f"{LEAF}|notify#1", "attempt": 1}
    assert _rules(_audit(_history(), [sent, {**sent, "pod": "w2"}])) == ["effect-once"]
    assert _audit(_history(), [sent, {**sent, "attempt": 2}]).ok


def test_a_child_not_finished_or_finished_twice_or_by_a_superseded_attempt_is_reported() -> None:
    history = _history()
    history.children[0]["status"] = "running"
    assert "child-once" in _rules(_audit(history))
    twice = {"kind": "child-finish", "child": LEAF, "attempt": 1, "finished": True}
    assert _rules(_audit(_history(), [twice])) == ["child-once"]
    history = _history()
    history.children[0]["attempt"] = 2
    assert _rules(_audit(history)) == ["child-once"]


def test_a_run_whose_end_disagrees_with_its_decision_or_that_did_not_end_is_reported() -> None:
    history = _history()
    history.tree_keys = [_key(END_KEY, {"decision": "cancel"})]
    assert _rules(_audit(history)) == ["run-ends"]
    assert _rules(_audit(_history("running"))) == ["run-ends"]


def test_a_failed_run_needs_its_error() -> None:
    history = _history("failed")
    assert _rules(_audit(history)) == ["run-ends"]
    history.records[0]["outcome"] = {"error": {"type": "ValueError", "message": "boom"}}
    assert _audit(history).ok


def test_a_cancelled_run_must_unwind_and_store_each_undo_it_marked() -> None:
    history = _history("cancelled")
    history.tree_keys = [k for k in history.tree_keys if k["key"] != UNWINDING_KEY]
    assert "run-ends" in _rules(_audit(history))
    history = _history("cancelled")
    history.results = [
        r for r in history.results if r["step_idempotency_key"] != f"undo/{LEAF}/charge#1"
    ]
    assert _rules(_audit(history)) == ["run-ends"]


def test_a_succeeded_run_that_undid_a_step_is_reported() -> None:
    history = _history()
    history.results.append(_result(TREE, f"undo/{TREE}/reserve#1", UNDO_EFFECT))
    assert "run-ends" in _rules(_audit(history))


def test_the_tree_s_own_rules_charges_and_refunds() -> None:
    history = _history()
    history.business_rows.remove(f"{LEAF}|charge")
    assert _rules(_audit(history)) == ["tree"]
    history = _history("cancelled")
    history.business_rows.remove(f"{LEAF}|undo:charge")
    assert _rules(_audit(history)) == ["tree"]
    history = _history("cancelled")
    history.business_rows.remove(f"{TREE}|undo:reserve")
    assert _rules(_audit(history)) == ["tree"]


def test_a_pause_resolved_twice_or_left_pending_is_reported() -> None:
    pause = {
        "tenant_id": TENANT,
        "root_execution_id": TREE,
        "pause_id": f"{TREE}:approval#1",
        "status": "taken",
    }
    history = _history()
    history.pauses = [pause]
    resolved = {"kind": "resolved", "tree": TREE}
    assert _audit(history, [resolved]).ok
    assert _rules(_audit(history, [resolved, {**resolved, "pod": "w3"}])) == ["pause-once"]
    history.pauses = [{**pause, "status": "pending"}]
    assert _rules(_audit(history)) == ["pause-once"]
    # A succeeded run took its pause; a cancelled one may keep an answer it never took.
    history.pauses = [{**pause, "status": "resolved"}]
    assert _rules(_audit(history)) == ["pause-once"]
    cancelled = _history("cancelled")
    cancelled.pauses = [{**pause, "status": "resolved"}]
    assert _audit(cancelled).ok
    cancelled.pauses = [{**pause, "status": "pending"}]
    assert _rules(_audit(cancelled)) == ["pause-once"]


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
    assert _rules(_audit(history, frozen=frozen)) == ["zombie-fenced"]
    history.lease_events.append(_event(TREE, "w1", 1, "lost", at=120))
    assert _audit(history, frozen=frozen).ok
    history.results.append(_result(TREE, "late#1", "wf.step", token=1, at=130))
    assert "zombie-fenced" in _rules(_audit(history, frozen=frozen))
