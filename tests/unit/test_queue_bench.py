"""`benchmarks/queue_bench.py` runs end to end on a SQLite file: both shapes drained at every
worker count in every round, by our stores and by the raw driver's floor (each child claimed
and finished once, or the script fails), the enqueue timed, the ratios with their targets,
and the queue left empty."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "queue_bench.py"


def test_both_shapes_are_drained_every_round_and_the_queue_is_left_empty(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bench.sqlite"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--url", f"sqlite:///{path}", "--children", "12",
         "--workers", "1", "3", "--rounds", "2", "--floor"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    jobs = {(m["what"], m["workers"]): m for m in lines if m["kind"] == "jobs"}
    assert set(jobs) == {
        (f"{who}, {shape}", workers)
        for who in ("ours", "floor")
        for shape in ("one parent", "parent per child")
        for workers in (1, 3)
    } | {("enqueue ours", 0)}
    enqueues = jobs.pop(("enqueue ours", 0))["jobs_per_s"]
    # Each round: one enqueue, then the fill before each fan-out drain (one per worker count).
    assert len(enqueues) == 2 * (1 + 2) and min(enqueues) > 0
    assert all(len(m["jobs_per_s"]) == 2 and min(m["jobs_per_s"]) > 0 for m in jobs.values())
    # A drain claims in batches of 10: fewer statements per job than a claim each.
    ours = jobs[("ours, parent per child", 1)]
    assert all(0 < n < 8 for n in ours["statements_per_job"])
    ratios = {(m["ratio"], m["workers"], m.get("shape")) for m in lines if m["kind"] == "ratio"}
    assert {("one parent / parent per child", w, None) for w in (1, 3)} <= ratios
    assert {("ours / floor", w, s) for w in (1, 3) for s in ("one parent", "parent per child")} <= (
        ratios
    )
    with sqlite3.connect(path) as connection:
        for table in ("agboss_child_executions", "agboss_child_parents"):
            assert connection.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_the_scale_check_drains_one_parents_children_once_and_owes_one_wake(
    tmp_path: Path,
) -> None:
    path = tmp_path / "scale.sqlite"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--url", f"sqlite:///{path}", "--scale", "20", "300",
         "--workers", "3"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    [found] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert found["kind"] == "scale" and found["children"] == [20, 300]
    assert found["parent_owed_its_wake"] == [1, 1]
    assert min(found["jobs_per_s"]) > 0
    # Its exit status is its verdict (a loaded machine may slow the big drain past 1.5x).
    assert done.returncode == (0 if found["verdict"] == "pass" else 1), done.stderr
