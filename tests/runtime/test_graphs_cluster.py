"""A short cluster run of the LangGraph workload on the database under test: three worker
processes running the agent loop (`agboss_sql.lab.graph_app`, on the public API), its
approval interrupts answered by two other workers at once, a cancel, one worker killed and
replaced, another frozen past its lease; the cluster's audit and the workload's LangGraph
rules (each thread's state as a run without faults gives it, each node effect once, no
checkpoint under a superseded epoch, each interrupt taken once) must hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from agboss_sql.lab.cluster import ClusterConfig, load_workload, render_report, run_cluster

pytest.importorskip("langgraph.graph")


def test_a_short_langgraph_cluster_run_through_chaos_keeps_every_invariant(
    sql_url: str, tmp_path: Path
) -> None:
    config = ClusterConfig(
        url=sql_url,
        workers=3,
        trees=6,
        fan_out=2,
        depth=2,
        pause_every=3,
        lease_ms=2_000,
        # Slow enough that the chaos, timed by the share of tool calls charged, lands while
        # threads run.
        step_ms=300,
        migrate=False,
        run_dir=tmp_path,
        timeout_s=150,
    )
    workload = load_workload("langgraph")
    assert workload.name == "langgraph"
    report = run_cluster(config, workload, view=lambda _state, _config: None)
    assert report.ok, render_report(report)
    story = " | ".join(report.chaos)
    for what in ("cancel", "SIGKILL", "started", "SIGSTOP", "SIGCONT"):
        assert what in story, story
    won = [c for c in report.chaos if c.startswith("cancel ") and "(run on" in c]
    expected = {"succeeded": 5, "cancelled": 1} if won else {"succeeded": 6}
    assert report.runs == expected, render_report(report)
    # The approval interrupts were answered (each once: the audit's rules).
    assert report.pauses_answered >= 1, render_report(report)
    assert report.takeovers >= 1, render_report(report)
