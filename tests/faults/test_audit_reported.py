"""The audit's rules on what the pods reported, which a database that lost acknowledged
commits (a standby promoted from asynchronous replication) no longer shows: one epoch
reported granted to two pods, one effect reported run twice."""

from __future__ import annotations

from typing import Any

from agboss_sql.lab.faults import AuditFacts, StoreHistory, audit

FACTS = AuditFacts(trees=[], children_per_tree=0)


def _run(pod: str, epoch: int, *, child: bool = False) -> dict[str, Any]:
    if child:
        return {"kind": "child-run", "pod": pod, "child": "tree.c0", "epoch": epoch, "attempt": 1}
    return {"kind": "tree-run", "pod": pod, "tree": "tree", "epoch": epoch}


def _effect(pod: str, epoch: int, replayed: bool) -> dict[str, Any]:
    return {
        "kind": "effect",
        "pod": pod,
        "execution": "tree",
        "step": "s1",
        "epoch": epoch,
        "replayed": replayed,
    }


def test_an_epoch_reported_granted_to_two_pods_breaks_one_holder() -> None:
    for child in (False, True):
        found = audit(
            StoreHistory(), [_run("pod-1", 3, child=child), _run("pod-2", 3, child=child)], FACTS
        )
        assert [v.rule for v in found] == ["one-holder"], found
        assert "epoch 3" in found[0].detail and "granted twice" in found[0].detail


def test_successive_epochs_on_two_pods_and_one_pod_running_twice_pass() -> None:
    events = [_run("pod-1", 1), _run("pod-2", 2), _run("pod-2", 2), _run("pod-1", 1, child=True)]
    assert audit(StoreHistory(), events, FACTS) == []


def test_an_effect_reported_run_twice_breaks_charged_once() -> None:
    events = [_effect("pod-1", 1, False), _effect("pod-2", 2, False)]
    found = audit(StoreHistory(), events, FACTS)
    assert [v.rule for v in found] == ["charged-once"], found
    assert "tree s1" in found[0].detail


def test_an_effect_run_once_and_replayed_passes() -> None:
    events = [_effect("pod-1", 1, False), _effect("pod-2", 2, True), _effect("pod-1", 1, True)]
    assert audit(StoreHistory(), events, FACTS) == []
