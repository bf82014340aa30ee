"""The child queue's drain: children under one parent against one parent per child.

    python benchmarks/queue_bench.py --url postgresql://postgres@127.0.0.1:5432/bench
    python benchmarks/queue_bench.py --url mysql://root@127.0.0.1:3306/bench --children 500

A drain is what workers of a fan-out do: `--children` no-op children are queued, then
`workers` claimers (asyncio tasks, each on its own `SqlConnection`) each loop `claim` then
`finish` (at the claimed attempt) until the queue is empty. Two shapes: every child under
one parent (a fan-out: every finish is a finish of a sibling of all the others) and one
parent per child (no finish ever shares a parent). Each drain is timed from the first claim
to the last finish; the queue is filled before, not timed. Shapes and worker counts take
turns in each of `--rounds` rounds, so a change in the machine's load falls on all alike.

Prints a table, then one JSON line per measurement (jobs/s of each round, and the median)
and per worker count the ratio of the one-parent drain's median to the parent-per-child
one's (1.0: a fan-out drains as fast as unrelated children).

The project's tables are migrated to head if needed and emptied before each drain: run it
on a database of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from agboss_sql.contracts.clocks import SystemClock
from agboss_sql.contracts.types import ApplicationContext, QueuedChild
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository
from agboss_sql.sql.schema import metadata

SHAPES = ("one parent", "parent per child")


@dataclass
class Measurement:
    """One shape's drains at one worker count: jobs (claim + finish) per second."""

    shape: str
    workers: int
    children: int
    jobs_per_s: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.jobs_per_s)


def _store(connection: SqlConnection, name: str) -> SqlChildExecutionQueueRepository:
    return SqlChildExecutionQueueRepository(connection, SystemClock(), ApplicationContext(name))


async def _fill(connection: SqlConnection, shape: str, children: int) -> None:
    for table in reversed(metadata.sorted_tables):
        await connection.execute(table.delete())
    queue = _store(connection, "bench")
    for i in range(children):
        parent = "parent" if shape == SHAPES[0] else f"parent-{i}"
        await queue.enqueue(QueuedChild("t", "root", parent, f"c-{i}", 1, None))
    await connection.execute(connection.dialect.analyze_sql("agboss_child_executions"))


async def drain(
    url: str, connection: SqlConnection, shape: str, children: int, workers: int
) -> float:
    """Fill the queue in `shape`, drain it with `workers` claimers: jobs per second."""
    await _fill(connection, shape, children)
    connections = [SqlConnection(url) for _ in range(workers)]
    done: list[str] = []
    for c in connections:
        await c.ping()  # connected before the clock starts

    async def worker(queue: SqlChildExecutionQueueRepository) -> None:
        while (child := await queue.claim(queue.application.instance_id)) is not None:
            result = await queue.finish(child.child_execution_id, None, attempt=child.attempt)
            assert result.finished
            done.append(child.child_execution_id)

    try:
        began = time.perf_counter()
        await asyncio.gather(*(worker(_store(c, f"w{w}")) for w, c in enumerate(connections)))
        elapsed = time.perf_counter() - began
    finally:
        for c in connections:
            await c.close()
    if sorted(done) != sorted(f"c-{i}" for i in range(children)):
        raise AssertionError("children lost or finished twice")
    return children / elapsed


async def run(url: str, children: int, workers: list[int], rounds: int) -> list[Measurement]:
    migrate.upgrade(url)
    connection = SqlConnection(url)
    measured = {(s, w): Measurement(s, w, children, []) for w in workers for s in SHAPES}
    try:
        for _ in range(rounds):
            for w in workers:
                for shape in SHAPES:
                    jobs = await drain(url, connection, shape, children, w)
                    measured[(shape, w)].jobs_per_s.append(round(jobs, 1))
        for table in reversed(metadata.sorted_tables):
            await connection.execute(table.delete())
    finally:
        await connection.close()
    return list(measured.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--children", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = asyncio.run(run(args.url, args.children, args.workers, args.rounds))
    print(f"{'shape':<18} {'workers':>7} {'jobs/s (median)':>16}  rounds")
    for m in results:
        print(f"{m.shape:<18} {m.workers:>7} {m.median:>16.1f}  {m.jobs_per_s}")
    for m in results:
        print(json.dumps({"kind": "drain", **asdict(m), "median": m.median}))
    for w in args.workers:
        one, apart = (next(m for m in results if m.shape == s and m.workers == w) for s in SHAPES)
        # Each round's two drains ran one after the other: their ratio is the least touched
        # by the machine's load drifting between rounds.
        paired = [a / o for a, o in zip(apart.jobs_per_s, one.jobs_per_s, strict=True)]
        print(
            json.dumps(
                {
                    "kind": "ratio",
                    "workers": w,
                    "parent_per_child_over_one_parent": round(apart.median / one.median, 3),
                    "per_round": [round(r, 3) for r in paired],
                    "median_per_round": round(statistics.median(paired), 3),
                }
            )
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
