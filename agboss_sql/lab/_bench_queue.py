"""The bench's child-queue drain: no-op children claimed in batches and finished, by our
queue stores and by the floor (a raw driver connection sending the same statements), under
one parent or one parent per child; and the batch enqueue.

A drain is what a fan-out's workers do: `workers` claimers, each on a connection of its own,
loop `claim_many(BATCH)` then `finish_many` of the children claimed, each at its attempt,
until the queue is empty (or, to compare, one `finish` per child). It is timed from the first claim to the last finish; the queue is filled (one
`enqueue_many`) before. Both sides are checked: every child finished exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.clocks import SystemClock
from agboss_sql.contracts.types import ApplicationContext, ChildFinish, QueuedChild
from agboss_sql.lab._bench_floor import Floor, open_floor
from agboss_sql.lab._bench_scale import fresh_tables
from agboss_sql.sql._queue_batch import BatchStatements
from agboss_sql.sql.connection import MAX_ATTEMPTS, SqlConnection
from agboss_sql.sql.queue import (
    QUEUED,
    RUNNING,
    QueueStatements,
    SqlChildExecutionQueueRepository,
)
from agboss_sql.sql.schema import child_executions
from agboss_sql.sql.statements import Result, Step

SHAPES = ("one parent", "parent per child")
BATCH = 10
"""How many children a claimer takes at a time (pgqueuer's default batch)."""


@dataclass
class Drained:
    """One drain: jobs (claim + finish) per second, and the statements each job cost."""

    jobs_per_s: float
    statements_per_job: float
    cpu_us_per_job: float
    none_left: int = 0
    """How many finishes answered that none of their parent's children was left (each owes
    its parent's wake): one per parent."""
    enqueue_per_s: float = 0.0
    """The rate of the `enqueue_many` that filled the queue before the drain."""


def children_of(shape: str, count: int, prefix: str = "c") -> list[QueuedChild]:
    """`count` no-op children in `shape`: all under one parent, or one parent each."""
    return [
        QueuedChild(
            "t", "root", "parent" if shape == SHAPES[0] else f"parent-{i}", f"{prefix}-{i}", 1
        )
        for i in range(count)
    ]


def _store(connection: SqlConnection, name: str) -> SqlChildExecutionQueueRepository:
    return SqlChildExecutionQueueRepository(connection, SystemClock(), ApplicationContext(name))


async def fill(connection: SqlConnection, shape: str, count: int, prefix: str = "c") -> float:
    """Empty the agboss tables, queue `count` children in `shape` with one `enqueue_many`
    and refresh the planner's statistics: the enqueue's jobs per second."""
    await fresh_tables(connection)
    batch = children_of(shape, count, prefix)
    began = time.perf_counter()
    queued = await _store(connection, "bench").enqueue_many(batch)
    elapsed = time.perf_counter() - began
    if len(queued) != count:
        raise AssertionError(f"{len(queued)} of {count} children queued")
    await connection.execute(connection.dialect.analyze_sql(child_executions.name))
    return count / elapsed


async def drain_ours(
    url: str,
    connection: SqlConnection,
    shape: str,
    count: int,
    workers: int,
    *,
    batch_finish: bool = True,
) -> Drained:
    """Fill the queue in `shape`, drain it with `workers` of our queue stores (each on its
    own one-connection pool; each claimed batch finished with one `finish_many`, or with
    `batch_finish=False` one `finish` per child): jobs per second, statements per job."""
    enqueued = await fill(connection, shape, count)
    connections = [SqlConnection(url, pool_size=1) for _ in range(workers)]
    sent: list[str] = []
    for c in connections:
        await c.ping()  # connected before the clock starts
        c.add_statement_listener(lambda sql, _params: sent.append(sql))
    done: list[str] = []
    none_left: list[str] = []

    async def worker(queue: SqlChildExecutionQueueRepository) -> None:
        name = queue.application.instance_id
        while batch := await queue.claim_many(name, BATCH):
            if batch_finish:
                entries = [ChildFinish(c.child_execution_id, c.attempt) for c in batch]
                results = list(await queue.finish_many(entries))
            else:
                results = [
                    await queue.finish(c.child_execution_id, None, attempt=c.attempt) for c in batch
                ]
            for child, result in zip(batch, results, strict=True):
                if not result.finished:
                    raise AssertionError(f"{child.child_execution_id} did not finish")
                done.append(child.child_execution_id)
                if result.remaining == 0:
                    none_left.append(child.child_execution_id)

    try:
        cpu, began = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(_store(c, f"w{w}")) for w, c in enumerate(connections)))
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        for c in connections:
            await c.close()
    _check(done, count, "c")
    return Drained(count / elapsed, len(sent) / count, cpu / count * 1e6, len(none_left), enqueued)


def _check(done: list[str], count: int, prefix: str) -> None:
    if len(done) != count or set(done) != {f"{prefix}-{i}" for i in range(count)}:
        raise AssertionError("children lost or finished twice")


async def drain_floor(connection: SqlConnection, shape: str, count: int, workers: int) -> Drained:
    """The same drain by `workers` raw driver connections sending our queue's statements
    (compiled once from its statement set: the batch claim, then the batch finish's step)
    with nothing around them."""
    await fill(connection, shape, count, "r")
    sql = connection.prepared(QueueStatements)
    batch: BatchStatements = sql.batch
    store = _store(connection, "floor")
    floors = [await open_floor(connection) for _ in range(workers)]
    compiled = connection.compiled
    begin = connection.dialect.BEGIN
    done: list[str] = []

    async def run(floor: Floor, statement: Any, params: dict[str, Any]) -> list[Any]:
        c = compiled(statement)
        rows, _ = await floor.execute(c.sql, {**c.defaults, **params})
        return rows

    async def transaction(floor: Floor, body: Callable[[], Awaitable[Any]]) -> Any:
        """`body` between BEGIN and COMMIT, run again after a conflict that undid it (a
        deadlock between two workers' finishes on MariaDB), as our store runs its own."""
        attempt = 0
        while True:
            attempt += 1
            await floor.text(begin)
            try:
                answer = await body()
                await floor.text("COMMIT")
                return answer
            except Exception as exc:
                if attempt >= MAX_ATTEMPTS or not connection.is_transient(exc):
                    raise
                await floor.text("ROLLBACK")

    async def claim(floor: Floor, name: str) -> list[Any]:
        params: dict[str, Any] = {
            "queued": QUEUED,
            "running": RUNNING,
            "instance_id": name,
            "now": time.time_ns() // 1_000_000,
            "n": BATCH,
        }
        if batch.update_returning:
            return await run(floor, batch.claim, params)

        async def lock_and_claim() -> list[Any]:
            rows = await run(floor, batch.lock_next, params)
            if rows:
                size = 1
                while size < len(rows):
                    size *= 2
                ids = {f"id_{i}": rows[min(i, len(rows) - 1)][0] for i in range(size)}
                await run(floor, batch.claim_locked(size), {**params, **ids})
            return rows

        rows = await transaction(floor, lock_and_claim)
        # The claimed rows as the one-statement claim answers them (id last).
        return [(*row[1:], None, row[0]) for row in rows]

    async def drive(floor: Floor, step: Step[Any]) -> Any:
        """Send a step's statements (the store's own, compiled once) on the raw driver."""
        try:
            statement = next(step)
            while True:
                c = compiled(statement.statement)
                rows, rowcount = await floor.execute(c.sql, {**c.defaults, **statement.params})
                statement = step.send(Result(rows, rowcount))
        except StopIteration as stop:
            return stop.value

    async def finish(floor: Floor, rows: list[Any]) -> None:
        # The claim answers the attempt before its increment where it cannot return rows.
        bump = 0 if batch.update_returning else 1
        entries = [(row[3], int(row[6]) + bump, "null") for row in rows]
        results = await transaction(
            floor, lambda: drive(floor, store._finish_many(entries, time.time_ns() // 1_000_000))
        )
        for row, result in zip(rows, results, strict=True):
            if not result.finished:
                raise AssertionError(f"{row[3]} did not finish")
            done.append(row[3])

    async def worker(floor: Floor, name: str) -> None:
        while rows := await claim(floor, name):
            await finish(floor, rows)

    try:
        for floor in floors:
            floor.statements = 0
        cpu, began = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(f, f"raw{w}") for w, f in enumerate(floors)))
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
        statements = sum(f.statements for f in floors)
    finally:
        for f in floors:
            await f.close()
    _check(done, count, "r")
    return Drained(count / elapsed, statements / count, cpu / count * 1e6)


__all__ = ["BATCH", "SHAPES", "Drained", "children_of", "drain_floor", "drain_ours", "fill"]
