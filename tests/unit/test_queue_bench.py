"""`benchmarks/queue_bench.py` runs end to end on a SQLite file: both shapes drained at every
worker count in every round (each child claimed and finished once, or the script fails),
a ratio per worker count, and the queue left empty."""

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
         "--workers", "1", "3", "--rounds", "2"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    drains = {(m["shape"], m["workers"]): m for m in lines if m["kind"] == "drain"}
    assert set(drains) == {
        (shape, workers) for shape in ("one parent", "parent per child") for workers in (1, 3)
    }
    assert all(len(m["jobs_per_s"]) == 2 and min(m["jobs_per_s"]) > 0 for m in drains.values())
    ratios = {m["workers"]: m for m in lines if m["kind"] == "ratio"}
    assert set(ratios) == {1, 3}
    assert all(len(m["per_round"]) == 2 for m in ratios.values())
    with sqlite3.connect(path) as connection:
        for table in ("agboss_child_executions", "agboss_child_parents"):
            assert connection.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
