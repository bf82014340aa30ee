"""What any saver must spend to read the small graph's history cold on SQLite, against the
budget that 1.5x `SqliteSaver` leaves it.

    python benchmarks/history_read_floor.py            # in the bench-saver environment

`graph_saver_bench.py` reads a thread of about 210 checkpoints of the 4-node graph through
`get_state_history` on a new saver instance. This writes such a thread with `SqliteSaver`
(WAL, `synchronous=NORMAL`), then times, each the minimum of `--rounds`:

- the graph alone: `get_state_history` over a saver that hands back kept objects
  (`FreeSaver`), the graph's own work;
- `SqliteSaver`: the same read through a new `SqliteSaver` on a new connection;
- the read floor: a new `sqlite3` connection selecting every checkpoint and pending write
  of the thread, and the serializer decoding what they hold: what any saver that keeps
  LangGraph's serialized values must do to answer that read, whatever its tables.

A saver 1.5x faster than `SqliteSaver` there may spend at most `SqliteSaver`'s time / 1.5
minus the graph's own: the budget. Where the read floor is over the budget, no such saver
reaches 1.5x on the path. Times are per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from graph_saver_bench import config, small_graph, small_input
from graph_saver_floor import FreeSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer


def best(run: Callable[[], int], rounds: int) -> tuple[float, int]:
    """The least time `run` took over `rounds` (seconds), and what it counted."""
    times = []
    count = 0
    for _ in range(rounds):
        started = time.perf_counter()
        count = run()
        times.append(time.perf_counter() - started)
    return min(times), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--invokes", type=int, default=35, help="6 checkpoints each")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="read-floor-") as folder:
        measure(str(Path(folder) / "history.sqlite"), args.invokes, args.rounds)


def measure(database: str, invokes: int, rounds: int) -> None:
    """Write the history to `database`, then time the three reads of it (the docstring)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    thread = str(uuid.uuid4())
    kept: dict[tuple[str, str], dict[str, object]] = {}
    with SqliteSaver.from_conn_string(database) as saver:
        saver.conn.execute("PRAGMA synchronous=NORMAL")
        graph = small_graph().compile(checkpointer=saver)
        alone = small_graph().compile(checkpointer=FreeSaver(kept))
        for _ in range(invokes):
            graph.invoke(small_input(), config(thread))
            alone.invoke(small_input(), config(thread))

    def graph_alone() -> int:
        graph = small_graph().compile(checkpointer=FreeSaver(kept))
        return sum(1 for _ in graph.get_state_history(config(thread)))

    def official() -> int:
        with SqliteSaver.from_conn_string(database) as saver:
            graph = small_graph().compile(checkpointer=saver)
            return sum(1 for _ in graph.get_state_history(config(thread)))

    serde = JsonPlusSerializer()

    def read_floor() -> int:
        conn = sqlite3.connect(database)
        try:
            checkpoints = conn.execute(
                "SELECT type, checkpoint, metadata FROM checkpoints WHERE thread_id = ? "
                "ORDER BY checkpoint_id DESC",
                (thread,),
            ).fetchall()
            writes = conn.execute(
                "SELECT type, value FROM writes WHERE thread_id = ?", (thread,)
            ).fetchall()
        finally:
            conn.close()
        for kind, body, metadata in checkpoints:
            serde.loads_typed((kind, body))
            json.loads(metadata)
        for kind, value in writes:
            serde.loads_typed((kind, value))
        return len(checkpoints)

    figures = {}
    for name, run in (
        ("graph alone", graph_alone),
        ("SqliteSaver", official),
        ("read floor", read_floor),
    ):
        seconds, count = best(run, rounds)
        figures[name] = seconds * 1000 / count
        print(f"{name:<12} {figures[name]:.4f} ms a checkpoint ({count} checkpoints)")
    budget = figures["SqliteSaver"] / 1.5 - figures["graph alone"]
    verdict = "over" if figures["read floor"] > budget else "within"
    print(
        f"budget at 1.5x SqliteSaver: {budget:.4f} ms a checkpoint; the read floor is {verdict} it"
    )


if __name__ == "__main__":
    main()
