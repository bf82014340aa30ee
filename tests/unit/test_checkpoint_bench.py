"""`benchmarks/checkpoint_bench.py` runs end to end, as README gives it, on a SQLite file: every
contestant measured in every scenario, each slice recorded, and nothing left behind."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "checkpoint_bench.py"
ROUNDS = 2


def _run(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_every_contestant_and_scenario_is_measured_and_the_run_leaves_no_thread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bench.sqlite"
    lines = _run(
        "--url", f"sqlite:///{path}", "--ops", "4", "--warmup", "1",
        "--rounds", str(ROUNDS), "--floor",
    )  # fmt: skip
    measured = {(m["scenario"], m["saver"]): m for m in lines if m["kind"] == "measurement"}
    for scenario in ("1 thread", "100 threads", "chat"):
        for saver in ("SqlCheckpointSaver", "AsyncSqliteSaver", "floor"):
            assert (scenario, saver) in measured, (scenario, saver)
    for saver in ("SqlCheckpointSaver", "AsyncSqliteSaver"):
        assert ("history", saver) in measured
    for m in measured.values():
        assert m["ops"] == 4
        assert len(m["slice_ms"]) == ROUNDS
        assert all(ms > 0 for ms in m["slice_ms"])
    ratios = [c for c in lines if c["kind"] == "comparison"]
    assert {c["scenario"] for c in ratios} == {"1 thread", "100 threads", "chat", "history"}
    assert all(c["theirs"] == "AsyncSqliteSaver" and c["ratio"] > 0 for c in ratios)
    # Every thread the run wrote was deleted, by each saver; the floor's table was dropped.
    with sqlite3.connect(path) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        assert "bench_floor_rows" not in tables
        for table in ("agboss_checkpoints", "agboss_checkpoint_blobs", "checkpoints", "writes"):
            if table in tables:
                assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table


def test_the_latest_read_is_measured_at_both_lengths(tmp_path: Path) -> None:
    path = tmp_path / "flat.sqlite"
    lines = _run("--url", f"sqlite:///{path}", "--flat", "30")
    reads = {r["saver"]: r for r in lines if r["kind"] == "latest_read"}
    assert set(reads) == {"SqlCheckpointSaver", "AsyncSqliteSaver"}
    for read in reads.values():
        assert read["p50_ms_at_10"] > 0
        assert read["p50_ms_at_30"] > 0
        # Printed rounded (to 0.001 ms, the growth to 0.01): compared to the last digit.
        assert abs(read["growth"] - read["p50_ms_at_30"] / read["p50_ms_at_10"]) < 0.05
    # The threads it wrote are deleted.
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM agboss_checkpoints").fetchone() == (0,)
