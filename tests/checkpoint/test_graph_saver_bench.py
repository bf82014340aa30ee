"""`benchmarks/graph_saver_bench.py` runs end to end on a SQLite file at a smoke size: every
path measured for our saver and the official one at both durabilities, the statements of
one invoke counted by kind of call, the costs per call of each saver apart from the graph, a
ratio per contestant, each path's ceiling (the official saver's time over the graph's own,
with a saver that costs nothing), and on the sync write paths the durable ceiling (the
official saver's time over the least a saver that commits each call does)."""

from __future__ import annotations

import contextlib
import gc
import io
import sqlite3
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "graph_saver_bench.py"


def _ran(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` run with `args` from the checkout, asserted to have exited 0."""
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_every_path_is_measured_against_the_official_saver_at_both_durabilities(
    tmp_path: Path,
) -> None:
    done = _ran(
        SCRIPT,
        *("--url", f"sqlite:///{tmp_path / 'bench.sqlite'}", "--scale", "0.02"),
        *("--repetitions", "1", "--costs", "3"),
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("sqlite ")]
    assert len(rows) == 11, done.stdout
    durable = 0
    for row in rows:
        assert "| SqliteSaver:" in row and "| SqliteSaver (NORMAL):" in row, row
        # The graph alone (a saver that costs nothing), and the ceiling it gives each
        # official saver: their time over it.
        assert "| graph alone:" in row, row
        ceiling = row.split("| ceiling (theirs / graph alone): ")[1].split(" | ")[0]
        assert ceiling.startswith("SqliteSaver ") and ", SqliteSaver (NORMAL) " in ceiling, row
        durable_path = ("invoke" in row or "chat " in row) and "delta" not in row
        if "(sync)" in row and durable_path and "history" not in row:
            # The durable floor (one commit a write call, reads from memory) on the sync
            # write paths, and the durable ceiling it gives each official saver.
            durable += 1
            assert "| durable floor:" in row and row.count("ratio") == 4, row
            floor = row.split("| durable ceiling (theirs / durable floor): ")[1]
            assert floor.startswith("SqliteSaver ") and ", SqliteSaver (NORMAL) " in floor, row
        else:
            assert "durable" not in row and row.count("ratio") == 3, row
    assert durable == 2, done.stdout
    # The chat with `messages` a DeltaChannel, sync and async.
    assert sum("delta chat DeltaChannel" in row for row in rows) == 2, done.stdout
    counted = next(line for line in done.stdout.splitlines() if line.startswith("# sqlite: "))
    # The input's checkpoint and one per node's step; a put_writes per task (__start__ and
    # the four nodes); the get_tuple that starts the run.
    assert "6 put: " in counted and "5 put_writes: " in counted, counted
    assert "1 get_tuple: " in counted and "per super-step" in counted, counted
    costs = [line for line in done.stdout.splitlines() if line.startswith("# costs: ")]
    # The graph alone's time, then ours, SqliteSaver's at NORMAL and the durable floor's calls.
    assert len(costs) == 4 and "storing nothing" in costs[0], done.stdout
    assert "durable floor: " in costs[3], costs
    for line in costs[1:]:
        assert "put_writes" in line and "frames" in line, line


def test_the_durable_floor_commits_every_write_call_before_it_returns(tmp_path: Path) -> None:
    """The durable floor is a floor only if it does what a durable saver must: what each
    `put` and `put_writes` of a sync invoke was given is in the database, serialized, when
    the call returns (read on a connection of the test's own)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import graph_saver_bench as bench
        from graph_saver_floor import FLOOR_TABLE, DurableFloorSaver
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from sqlalchemy.engine import make_url

    database = tmp_path / "floor.sqlite"
    floor = DurableFloorSaver(make_url(f"sqlite:///{database}"))
    found: list[tuple[str, int, int]] = []  # (call, rows given, rows read back at its return)
    put, put_writes = floor.put, floor.put_writes

    def stored(checkpoint_id: str, task_id: str) -> int:
        with sqlite3.connect(database) as reader:
            row = reader.execute(
                f"SELECT count(*) FROM {FLOOR_TABLE} WHERE checkpoint_id = ? AND task_id = ?",
                (checkpoint_id, task_id),
            ).fetchone()
        return int(row[0])

    def checked_put(config: Any, checkpoint: Any, *args: Any) -> Any:
        answer = put(config, checkpoint, *args)
        found.append(("put", 1, stored(checkpoint["id"], "")))
        return answer

    def checked_writes(config: Any, writes: Any, task_id: str, *args: Any) -> None:
        put_writes(config, writes, task_id, *args)
        checkpoint_id = config["configurable"]["checkpoint_id"]
        found.append(("put_writes", len(writes), stored(checkpoint_id, task_id)))

    floor.put, floor.put_writes = checked_put, checked_writes  # type: ignore[method-assign]
    try:
        graph = bench.small_graph().compile(checkpointer=floor)
        graph.invoke(bench.small_input(), bench.config("t"))
    finally:
        floor.close()
    assert sorted({call for call, _, _ in found}) == ["put", "put_writes"], found
    assert sum(1 for call, _, _ in found if call == "put") == 6, found
    assert all(given == read for _, given, read in found), found
    with sqlite3.connect(database) as reader:
        bodies = reader.execute(f"SELECT body FROM {FLOOR_TABLE} WHERE idx = -1").fetchall()
    assert len(bodies) == 6 and all(body.startswith(b"msgpack\0") for (body,) in bodies)


def test_the_history_read_floor_prints_the_budget_and_the_floor() -> None:
    """`benchmarks/history_read_floor.py` times the graph alone, `SqliteSaver` and the read
    floor on one history, and says whether the floor is within the budget 1.5x leaves."""
    done = _ran(ROOT / "benchmarks" / "history_read_floor.py", "--invokes", "2", "--rounds", "1")
    lines = done.stdout.splitlines()
    for name in ("graph alone", "SqliteSaver", "read floor"):
        line = next(line for line in lines if line.startswith(name))
        # 2 invokes of the 4-node graph: the input's checkpoint and one a step, each.
        assert "ms a checkpoint (12 checkpoints)" in line, line
    verdict = lines[-1]
    assert verdict.startswith("budget at 1.5x SqliteSaver: "), verdict
    assert verdict.endswith(("the read floor is over it", "the read floor is within it")), verdict


def test_each_timed_part_starts_after_a_full_collection_and_a_row_counts_those_met() -> None:
    """A contestant's timed part starts with no garbage of a cycle left by the one before it
    (a full collection takes some 100 ms beside LangGraph's imports), and a row says how many
    full collections each contestant met while timed, when any did."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import graph_saver_bench as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    class Node:
        me: Any = None

    left = Node()
    left.me = left
    gone = weakref.ref(left)
    del left
    bench.start_clock()
    assert gone() is None
    assert bench.full_collections() == 0
    gc.collect()
    assert bench.full_collections() == 1
    row: dict[str, Any] = {
        "database": "sqlite",
        "path": "history",
        "unit": "checkpoint",
        "units": 2,
        "times": {bench.OURS: [1.0, 1.0], "SqliteSaver": [2.0, 3.0]},
        "full collections": {bench.OURS: [0, 0], "SqliteSaver": [0, 0]},
    }
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench.print_row(row)
        row["full collections"] = {bench.OURS: [2, 1], "SqliteSaver": [2, 2]}
        bench.print_row(row)
    quiet, counted = printed.getvalue().splitlines()
    assert "ratio  2.50 (2.00-3.00)" in quiet and "full collections" not in quiet, quiet
    assert counted.endswith(
        f"| full collections (each repetition): {bench.OURS} 2/1, SqliteSaver 2/2"
    ), counted
