"""`benchmarks/graph_saver_bench.py` runs end to end on a SQLite file at a smoke size: every
path measured for our saver and the official one at both durabilities, the statements of
one invoke counted by kind of call, the costs per call of each saver apart from the graph, a
ratio per contestant, and each path's ceiling (the official saver's time over the graph's own,
with a saver that costs nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "graph_saver_bench.py"


def test_every_path_is_measured_against_the_official_saver_at_both_durabilities(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--url",
            f"sqlite:///{tmp_path / 'bench.sqlite'}",
            "--scale",
            "0.02",
            "--repetitions",
            "1",
            "--costs",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("sqlite ")]
    assert len(rows) == 9, done.stdout
    for row in rows:
        assert "| SqliteSaver:" in row and "| SqliteSaver (NORMAL):" in row, row
        # The graph alone (a saver that costs nothing), and the ceiling it gives each
        # official saver: their time over it.
        assert "| graph alone:" in row and row.count("ratio") == 3, row
        ceiling = row.split("| ceiling (theirs / graph alone): ")[1]
        assert ceiling.startswith("SqliteSaver ") and ", SqliteSaver (NORMAL) " in ceiling, row
    counted = next(line for line in done.stdout.splitlines() if line.startswith("# sqlite: "))
    # The input's checkpoint and one per node's step; a put_writes per task (__start__ and
    # the four nodes); the get_tuple that starts the run.
    assert "6 put: " in counted and "5 put_writes: " in counted, counted
    assert "1 get_tuple: " in counted and "per super-step" in counted, counted
    costs = [line for line in done.stdout.splitlines() if line.startswith("# costs: ")]
    assert len(costs) == 3 and "storing nothing" in costs[0], done.stdout
    for line in costs[1:]:
        assert "put_writes" in line and "frames" in line, line
