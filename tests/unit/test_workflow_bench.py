"""`benchmarks/workflow_bench.py` runs end to end on a SQLite file with tiny numbers: our
engine and the stores-directly floor measured at each concurrency, statements counted, and
every run it started ended. DBOS is measured too where it is installed (`tox -e
bench-workflows`); elsewhere only DBOS is left out, with a note."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "workflow_bench.py"
WORKFLOWS = 4
STEPS = 3
ROUNDS = 2
CONCURRENCY = (1, 2)


def test_ours_runs_end_to_end_and_leaves_no_run_unfinished(tmp_path: Path) -> None:
    path = tmp_path / "wf.sqlite"
    done = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--url", f"sqlite:///{path}",
            "--workflows", str(WORKFLOWS), "--steps", str(STEPS), "--rounds", str(ROUNDS),
            "--concurrency", *map(str, CONCURRENCY), "--floor", "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines: list[dict[str, Any]] = [
        json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")
    ]
    with_dbos = importlib.util.find_spec("dbos") is not None
    contestants = {"engine", "floor", *(["dbos"] if with_dbos else [])}
    if not with_dbos:
        assert "dbos: not measured" in done.stderr

    measured = {(m["contestant"], m["concurrency"]): m for m in lines if m["kind"] == "measurement"}
    assert set(measured) == {(c, n) for c in contestants for n in CONCURRENCY}
    for m in measured.values():
        assert (m["workflows"], m["steps"]) == (WORKFLOWS, STEPS)
        assert len(m["slice_ms"]) == ROUNDS
        assert m["workflows_per_s"] > 0 and all(ms > 0 for ms in m["slice_ms"])
    comparisons = [c for c in lines if c["kind"] == "comparison"]
    assert len(comparisons) == (len(CONCURRENCY) if with_dbos else 0)

    counts = {c["contestant"]: c for c in lines if c["kind"] == "statements"}
    assert set(counts) == contestants
    for c in counts.values():
        assert c["per_added_step"] > 0 and c["commits_per_added_step"] > 0
        assert c["per_workflow"] == round(
            c["per_one_step_workflow"] + (STEPS - 1) * c["per_added_step"], 2
        )
    # Every step of ours and of the floor is one fenced transaction: one durable commit.
    assert counts["engine"]["commits_per_added_step"] == 1
    assert counts["floor"]["commits_per_added_step"] == 1
    settings = {s["contestant"]: s for s in lines if s["kind"] == "settings"}
    assert (settings["engine"]["journal_mode"], settings["engine"]["synchronous"]) == (
        "wal",
        "NORMAL",
    )
    if with_dbos:
        assert (settings["dbos"]["journal_mode"], settings["dbos"]["synchronous"]) == (
            "wal",
            "NORMAL",
        )

    # Every run the engine started succeeded, and no lease is left held.
    with sqlite3.connect(path) as db:
        statuses = dict(
            db.execute("SELECT status, count(*) FROM agboss_execution_records GROUP BY status")
        )
        assert set(statuses) == {"succeeded"}, statuses
        assert statuses["succeeded"] > 0
        held = db.execute(
            "SELECT count(*) FROM agboss_execution_leases WHERE released = 0"
        ).fetchone()
        assert held == (0,)
