"""How long `import_threads` takes to bring a `SqliteSaver` file's threads over.

Writes `--threads` chat threads of `--turns` turns each with LangGraph's `SqliteSaver` (the
chat graph of `graph_saver_bench.py`: `add_messages`, one reply a turn) into a file of its
own, then imports them into each `--url` (its agboss tables emptied first: use a database
of its own), checked, and again (the second run writes everything again as it was). Prints
the report and the seconds of each run, and the milliseconds a checkpoint.

    python benchmarks/import_threads_bench.py --url sqlite:///import.sqlite \
        --url postgresql://postgres@127.0.0.1:5432/agboss_bench
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from graph_saver_bench import OURS, Contestant, chat_graph, chat_input, config, fresh
from langgraph.checkpoint.sqlite import SqliteSaver
from sqlalchemy.engine import make_url

from agboss_sql.sql.checkpoint import SqlCheckpointSaver, import_threads


def write_source(path: Path, threads: int, turns: int) -> None:
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        graph = chat_graph().compile(checkpointer=SqliteSaver(conn))
        for thread in range(threads):
            for turn in range(turns):
                graph.invoke(chat_input(turn), config(f"chat-{thread}"))
        conn.commit()
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", action="append", required=True, help="a target; repeat")
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        source_path = Path(folder) / "official.sqlite"
        write_source(source_path, args.threads, args.turns)
        conn = sqlite3.connect(source_path, check_same_thread=False)
        try:
            source = SqliteSaver(conn)
            for given in args.url:
                url = make_url(given)
                target_url = fresh(url, 0, Contestant(OURS, url))
                with SqlCheckpointSaver.from_conn_string(target_url) as target:
                    started = time.perf_counter()
                    report = import_threads(source, target)
                    first = time.perf_counter() - started
                    started = time.perf_counter()
                    import_threads(source, target)
                    again = time.perf_counter() - started
                print(
                    f"{url.get_backend_name()}: {report}: {first:.2f} s "
                    f"({first * 1000 / max(1, report.checkpoints):.2f} ms a checkpoint, the "
                    f"check included); again {again:.2f} s",
                    flush=True,
                )
        finally:
            conn.close()


if __name__ == "__main__":
    main()
