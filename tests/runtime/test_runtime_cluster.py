"""A short cluster run on the database under test: three worker processes running the
demo tree (written on the public workflow API), with a pause answered by two other
workers at once and a cancel, one worker killed and replaced, another frozen past its
lease; the audit read from the database must hold."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agboss_sql.lab.cluster import (
    ClusterConfig,
    State,
    load_workload,
    render_report,
    run_cluster,
)
from agboss_sql.lab.cluster_view import summary_line, worker_rows


@dataclass(frozen=True)
class Frame:
    """What the live view showed at one update."""

    phase: str
    summary: str
    workers: list[tuple[str, str, str, str]]
    takeovers: int
    lost: int
    refused: int


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
    frames: list[Frame] = []

    def view(state: State, config: ClusterConfig) -> None:
        frames.append(
            Frame(
                state.phase,
                summary_line(state),
                worker_rows(state, config),
                state.takeovers,
                state.lost,
                state.refused,
            )
        )

    report = run_cluster(config, load_workload("tree"), view=view)
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

    # The live view: a frame before anything else, each worker shown starting until ready.
    assert frames[0].phase == "migrating the database" and frames[0].workers == []
    assert any(f.workers and {w[1] for w in f.workers} == {"starting"} for f in frames)
    assert all(" s   work done " in f.summary for f in frames)
    # The counters are read from the database while the run goes on: the killed worker's
    # runs (at 30% of the work) are taken over within a lease, while the rest still runs.
    assert any(f.phase == "running" and f.takeovers >= 1 for f in frames), frames
    # The last frame says what the report says, every worker stopped or killed, no slot busy.
    last = frames[-1]
    assert (last.takeovers, last.lost, last.refused) == (
        report.takeovers,
        report.leases_lost,
        report.zombie_writes_refused,
    ), (last, render_report(report))
    assert f"leases lost {report.leases_lost}" in last.summary
    assert {w[1] for w in last.workers} <= {"stopped", "killed"}, last.workers
    assert {w[2] for w in last.workers} == {"-"}, last.workers
