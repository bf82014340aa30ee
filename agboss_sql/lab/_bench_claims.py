"""The bench's child claim: queued children claimed by several workers at once, by our
queue stores and by the floor sending the same claim statements, checked for lost or
doubled claims."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agboss_sql.contracts.clocks import SystemClock
from agboss_sql.contracts.types import ApplicationContext, QueuedChild
from agboss_sql.lab._bench_floor import Floor, Timing, _claims_timing, open_floor
from agboss_sql.lab._bench_scale import fresh_tables
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.queue import (
    FINISHED,
    QUEUED,
    RUNNING,
    QueueStatements,
    SqlChildExecutionQueueRepository,
)
from agboss_sql.sql.schema import child_executions

_STATUS_PARAMS = {"queued": QUEUED, "running": RUNNING, "finished": FINISHED}


async def enqueue(connection: SqlConnection, count: int, prefix: str) -> None:
    """`count` children queued afresh (every agboss table emptied first), named `prefix-i`."""
    await fresh_tables(connection)
    queue = SqlChildExecutionQueueRepository(connection, SystemClock(), ApplicationContext("bench"))
    for i in range(count):
        await queue.enqueue(QueuedChild("t", "root", "parent", f"{prefix}-{i}", i % 4))
    # Fresh planner statistics, as autovacuum (or its peers) would have in steady state.
    await connection.execute(connection.dialect.analyze_sql(child_executions.name))


async def claim_ours(url: str, connection: SqlConnection, count: int, workers: int) -> Timing:
    """`count` queued children claimed by `workers` of our queue stores, each on its own
    connection to `url`; `AssertionError` when one is lost or claimed twice."""
    await enqueue(connection, count, "c")
    connections = [SqlConnection(url) for _ in range(workers)]
    stores = [
        SqlChildExecutionQueueRepository(c, SystemClock(), ApplicationContext(f"w{w}"))
        for w, c in enumerate(connections)
    ]
    claimed: list[str] = []
    for c in connections:
        await c.ping()  # connected before the clock starts, as the floor's connections are

    async def worker(store: SqlChildExecutionQueueRepository) -> None:
        while (child := await store.claim(store.application.instance_id)) is not None:
            claimed.append(child.child_execution_id)

    try:
        cpu, began = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(s) for s in stores))
        timing = _claims_timing(count, began, cpu)
    finally:
        for c in connections:
            await c.close()
    if sorted(claimed) != sorted(f"c-{i}" for i in range(count)):
        raise AssertionError("child claims lost or doubled")
    return timing


async def claim_raw(connection: SqlConnection, count: int, workers: int) -> Timing:
    """`count` queued children claimed by `workers` floor connections sending the queue's own
    claim statements; `AssertionError` when one is lost or claimed twice."""
    await enqueue(connection, count, "r")
    sql = connection.prepared(QueueStatements)
    one_statement = sql.update_returning
    claim = connection.compiled(sql.claim if one_statement else sql.lock_next)
    locked = None if one_statement else connection.compiled(sql.claim_locked)
    floors = [await open_floor(connection) for _ in range(workers)]
    claimed: list[Any] = []

    async def worker(floor: Floor, name: str) -> None:
        params: dict[str, Any] = {**_STATUS_PARAMS, "instance_id": name}
        while True:
            params["now"] = time.time_ns() // 1_000_000
            if locked is None:
                rows, _ = await floor.execute(claim.sql, {**claim.defaults, **params})
                if not rows:
                    return
                claimed.append(rows[0][3])
                continue
            await floor.text(connection.dialect.BEGIN)
            rows, _ = await floor.execute(claim.sql, {**claim.defaults, **params})
            if not rows:
                await floor.text("COMMIT")
                return
            await floor.execute(locked.sql, {**locked.defaults, **params, "id": rows[0][0]})
            await floor.text("COMMIT")
            claimed.append(rows[0][4])

    try:
        cpu, began = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(f, f"raw{w}") for w, f in enumerate(floors)))
        timing = _claims_timing(count, began, cpu)
    finally:
        for f in floors:
            await f.close()
    if sorted(claimed) != sorted(f"r-{i}" for i in range(count)):
        raise AssertionError("raw child claims lost or doubled")
    return timing
