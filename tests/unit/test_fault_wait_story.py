"""A fault run's failed wait tells what the pods did: a flaky run read from CI's output
alone (no run directory kept) is explained by the run itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from agboss_sql.lab.faults.harness import STORY_EVENTS, Cluster, WaitTimeout, story


def test_the_story_tells_trees_holds_and_errors_and_leaves_the_rest() -> None:
    events = [
        {"kind": "ready", "pod_index": 0},
        {
            "kind": "tree-run",
            "pod": "pod-2",
            "pod_index": 1,
            "tree": "tree-1-0",
            "epoch": 2,
            "taken_over_from": "pod-0",
        },
        {"kind": "effect", "pod": "pod-2", "pod_index": 1, "tree": "tree-1-0"},
        {"kind": "held", "pod": "pod-1", "pod_index": 0, "hold": "unsubmitted"},
        {
            "kind": "op-error",
            "pod": "pod-1",
            "pod_index": 0,
            "op": "leases.renew",
            "error": "StoreTimeoutError",
            "message": "x" * 500,
        },
    ]
    told = story(events)
    assert told.startswith("what the pods reported last (3): ")
    assert "pod-2 tree-run tree=tree-1-0 epoch=2 taken_over_from=pod-0" in told
    assert "pod-1 held hold=unsubmitted" in told
    assert f"message={'x' * 120} " not in told and f"message={'x' * 120}" in told
    assert "ready" not in told and "effect" not in told
    assert told.index("tree-run") < told.index("held") < told.index("op-error")


def test_the_story_keeps_the_last_events() -> None:
    events = [{"kind": "tree-done", "pod_index": 0, "tree": f"t{i}"} for i in range(100)]
    told = story(events)
    assert f"({STORY_EVENTS})" in told
    assert "tree=t99" in told and f"tree=t{100 - STORY_EVENTS} " in told + " "
    assert f"tree=t{99 - STORY_EVENTS} " not in told + " "
    assert story([{"kind": "ready"}]) == "the pods reported no tree, hold or error"


def test_a_failed_wait_says_what_happened(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "sqlite://", [])  # no pod started: its events given here
    cluster.events.append({"kind": "tree-run", "pod_index": 2, "tree": "tree-2-0", "epoch": 1})
    with pytest.raises(WaitTimeout) as failed:
        cluster.wait_for(lambda e: e.get("kind") == "held", 0.0, "a pod to reach hold work")
    assert "waited 0 s for a pod to reach hold work: it did not happen; " in str(failed.value)
    assert "pod index 2 tree-run tree=tree-2-0 epoch=1" in str(failed.value)
