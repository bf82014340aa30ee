"""What `agboss-sql cluster` shows: the live view while it runs (`live_view`, over the
orchestrator's `State`) and the report after (`render_report`)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.lab.cluster_audit import Report
from agboss_sql.lab.workload import ClusterConfig


@dataclass
class State:
    """What the orchestrator knows while the run goes on."""

    alive: dict[str, str] = field(default_factory=dict)
    slots: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    chaos: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    progress: float = 0.0
    takeovers: int = 0
    refused: int = 0
    lost: int = 0
    running: dict[str, str] = field(default_factory=dict)
    answered: dict[str, float] = field(default_factory=dict)
    """When each paused run was last answered (monotonic s): answered again when it is still,
    or again, paused 2 s later (a run with a second pause; an answer sent to a worker that
    died first)."""
    paused: set[str] = field(default_factory=set)
    started_at: float = field(default_factory=time.monotonic)
    phase: str = "starting"
    """What the run is doing now: migrating, starting the workers, running, stopping,
    auditing."""


def render_report(report: Report) -> str:
    """The report as text."""
    lines = [
        f"cluster on {report.url}: {report.workers} workers, workload {report.workload}, "
        f"tenant {report.tenant}",
        "runs: " + ", ".join(f"{k} {v}" for k, v in sorted(report.runs.items())),
        f"effects and steps stored: {report.effects_stored}, undone: {report.undos}",
        f"children finished: {report.children_finished}, pauses answered: {report.pauses_answered}",
        f"takeovers: {report.takeovers}, leases lost: {report.leases_lost}, "
        f"zombie writes refused by the store: {report.zombie_writes_refused}",
        f"wall time: {report.wall_s} s (workers' output, events and rows: {report.run_dir})",
        "chaos:",
        *(f"  {c}" for c in report.chaos or ["(none)"]),
    ]
    if report.violations:
        lines.append(f"BROKEN: {len(report.violations)} violations")
        lines += [f"  {v}" for v in report.violations]
    else:
        lines.append("every invariant held")
    return "\n".join(lines)


def worker_rows(state: State, config: ClusterConfig) -> list[tuple[str, str, str, str]]:
    """The live view's workers: name, state, slots busy, steps waiting. Only a worker that
    is up shows slots; one starting, stopped, killed or frozen shows `-`."""
    rows = []
    for pod, alive in sorted(state.alive.items(), key=lambda item: (len(item[0]), item[0])):
        if alive.startswith("up"):
            busy, most, waiting = state.slots.get(pod, (0, config.max_concurrent_steps, 0))
            rows.append((pod, alive, f"{busy}/{most}", str(waiting)))
        else:
            rows.append((pod, alive, "-", "-"))
    return rows


def summary_line(state: State, now: float | None = None) -> str:
    """The live view's line under the tables: the phase, the time since the run began, the
    work done, and the safety counters as the database has them at the last poll."""
    elapsed = (time.monotonic() if now is None else now) - state.started_at
    return (
        f"{state.phase}   {elapsed:5.1f} s   work done {state.progress:.0%}   "
        f"takeovers {state.takeovers}   leases lost {state.lost}   "
        f"zombie writes refused by the store {state.refused}"
    )


def live_view(
    console: Any = None,
) -> tuple[Callable[[State, ClusterConfig], None], Callable[[], None]]:
    """A `rich` live view of the run on `console` (default: the terminal): `(update,
    close)`. It shows a line at once, before the first update; each update redraws the
    workers, the runs, `summary_line` and the last chaos moves."""
    from rich.console import Group
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    live = Live(Text("cluster: starting"), console=console, refresh_per_second=4, transient=False)
    live.start(refresh=True)

    def update(state: State, config: ClusterConfig) -> None:
        table = Table(title="workers", expand=False)
        for column in ("worker", "state", "slots busy", "waiting"):
            table.add_column(column)
        for row in worker_rows(state, config):
            table.add_row(*row)
        runs = Table(title="runs", expand=False)
        for column in ("running", "waiting", "paused", "succeeded", "cancelled", "failed"):
            runs.add_column(column)
        s = state.statuses
        runs.add_row(
            *(
                str(s[k])
                for k in ("running", "queued", "paused", "succeeded", "cancelled", "failed")
            )
        )
        summary = Text(summary_line(state))
        chaos = Text("\n".join(state.chaos[-4:]), style="yellow")
        live.update(Group(table, runs, summary, chaos), refresh=True)

    return update, live.stop


__all__ = ["State", "live_view", "render_report", "summary_line", "worker_rows"]
