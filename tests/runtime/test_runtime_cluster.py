"""A short cluster run on the database under test: three worker processes running the
demo tree (written on the public workflow API), with a pause answered by two other
workers at once and a cancel, one worker killed and replaced, another frozen past its
lease; the audit read from the database must hold."""

from __future__ import annotations

from pathlib import Path

from agboss_sql.lab.cluster import ClusterConfig, load_workload, render_report, run_cluster


def test_a_short_cluster_run_through_chaos_keeps_every_invariant(
    sql_url: str, tmp_path: Path
) -> None:
    config = ClusterConfig(
        url=sql_url,
        workers=3,
        trees=8,
        fan_out=2,
        depth=2,
        pause_every=4,
        lease_ms=2_000,
        # Slow enough that the chaos, timed by the share of orders charged (read every
        # quarter second), lands while trees run.
        step_ms=150,
        migrate=False,
        run_dir=tmp_path,
        timeout_s=150,
    )
    report = run_cluster(config, load_workload("tree"))
    assert report.ok, render_report(report)
    # The chaos happened: a cancel, a kill and its replacement, a freeze and a thaw.
    story = " | ".join(report.chaos)
    for what in ("cancel", "SIGKILL", "started", "SIGSTOP", "SIGCONT"):
        assert what in story, story
    # A cancel either won, and its run ended cancelled (its undos stored), or came too late.
    won = [c for c in report.chaos if c.startswith("cancel ") and "(run on" in c]
    expected = {"succeeded": 7, "cancelled": 1} if won else {"succeeded": 8}
    assert report.runs == expected, render_report(report)
    if won:
        assert report.undos >= 1, render_report(report)
    # Both pauses were answered once, by workers that had not paused them.
    assert report.pauses_answered == 2, render_report(report)
    # The killed and the frozen workers' runs were taken over.
    assert report.takeovers >= 1, render_report(report)
    # Every child of every succeeded tree finished (2 + 4 per tree); a cancelled tree's
    # children finished too, as many as it had queued when the cancel came.
    assert report.children_finished >= report.runs["succeeded"] * 6, render_report(report)
