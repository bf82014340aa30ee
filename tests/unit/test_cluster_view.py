"""The cluster's live view as a terminal shows it: a line the moment it starts, then each
update with the phase, the time since the run began, the safety counters as given, and
only a worker that is up shown with slots."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("rich")

from rich.console import Console

from agboss_sql.lab.cluster_view import State, live_view, summary_line, worker_rows
from agboss_sql.lab.workload import ClusterConfig

CONFIG = ClusterConfig(url="sqlite:///unused.sqlite", max_concurrent_steps=4)


def test_the_view_shows_a_line_before_the_first_update() -> None:
    out = io.StringIO()
    _, close = live_view(Console(file=out, force_terminal=True, width=120))
    try:
        assert "cluster: starting" in out.getvalue()
    finally:
        close()


def test_an_update_shows_the_phase_the_time_and_the_counters() -> None:
    out = io.StringIO()
    state = State(phase="running", takeovers=2, lost=9, refused=4)
    state.started_at -= 12.5
    state.alive = {"w1": "up", "w2": "killed", "w10": "stopped", "w3": "frozen"}
    state.slots = {"w1": (3, 4, 1), "w2": (4, 4, 0), "w10": (4, 4, 0), "w3": (4, 4, 2)}
    update, close = live_view(Console(file=out, force_terminal=True, width=160))
    try:
        update(state, CONFIG)
    finally:
        close()

    text = out.getvalue()
    assert "leases lost 9" in text and "zombie writes refused by the store 4" in text
    line = summary_line(state, now=state.started_at + 12.5)
    assert line.startswith("running    12.5 s   work done 0%   takeovers 2")
    # A worker that is not up shows no slots, whatever it reported before it stopped.
    assert worker_rows(state, CONFIG) == [
        ("w1", "up", "3/4", "1"),
        ("w2", "killed", "-", "-"),
        ("w3", "frozen", "-", "-"),
        ("w10", "stopped", "-", "-"),
    ]
