"""Lease take, fenced effect and child claim on a Galera cluster: one node vs spread.

    urls="$(bash dialects/galera/ready.sh)"
    python benchmarks/galera_bench.py $urls

For each operation, `--workers` instances (one `SqlConnection` each) run `--ops`
operations in all, first with every instance on node 1, then with the instances spread
over the nodes given (round robin). Operations: a lease take of a new execution (one
upsert), a fenced effect under a held lease (fence, work's one business row, result, in
one transaction; each call its own step), and a child claim from a queue filled
beforehand. Prints one line per measurement (ops/s) and the JSON of all of them.
The project's tables and the business table are created afresh on node 1 first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionContext,
    QueuedChild,
    StepRef,
    StoreClock,
    SystemClock,
    fenced_effect_key_of,
)
from agboss_sql.lab.business import insert_business_row
from agboss_sql.lab.database import create_schema, truncate_all
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository

TENANT = "bench"
LEASE_MS = 60_000


async def _run(workers: int, ops: int, op: Callable[[int, int], Awaitable[Any]]) -> float:
    """ops/s of `ops` calls of `op(worker, i)` shared by `workers` concurrent workers."""
    per = ops // workers

    async def worker(w: int) -> None:
        for i in range(per):
            await op(w, i)

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    return per * workers / (time.perf_counter() - start)


async def measure(urls: list[str], workers: int, ops: int, label: str) -> dict[str, float]:
    connections = [SqlConnection(urls[w % len(urls)], pool_size=2) for w in range(workers)]
    try:
        await truncate_all(connections[0])
        store_clock = StoreClock()
        apps = [ApplicationContext(f"{label}-{w}") for w in range(workers)]
        leases = [
            SqlExecutionLeaseRepository(c, store_clock, a)
            for c, a in zip(connections, apps, strict=True)
        ]
        effects = [
            SqlFencedEffectRepository(c, store_clock, a)
            for c, a in zip(connections, apps, strict=True)
        ]
        queues = [
            SqlChildExecutionQueueRepository(c, SystemClock(), a)
            for c, a in zip(connections, apps, strict=True)
        ]
        results: dict[str, float] = {}

        async def take(w: int, i: int) -> None:
            assert await leases[w].acquire(TENANT, f"{label}-take-{w}-{i}", LEASE_MS)

        results["lease take"] = await _run(workers, ops, take)

        held = []
        for w in range(workers):
            lease = await leases[w].acquire(TENANT, f"{label}-fx-{w}", LEASE_MS)
            assert lease is not None
            held.append(lease)

        async def effect(w: int, i: int) -> None:
            lease = held[w]
            ctx = ExecutionContext(
                tenant_id=TENANT,
                root_execution_id=lease.execution_id,
                execution_id=lease.execution_id,
                lease=lease,
                step=StepRef(lease.execution_id, f"step-{i}", "bench"),
            )

            async def work(tx: Any) -> str:
                await insert_business_row(tx, f"{w}-{i}")
                return "ok"

            await effects[w].save_result_if_absent(fenced_effect_key_of(ctx, "bench"), work)

        results["fenced effect"] = await _run(workers, ops, effect)

        for i in range(ops):
            await queues[0].enqueue(QueuedChild(TENANT, "root", "parent", f"{label}-c-{i}", 1))

        async def claim(w: int, i: int) -> None:
            assert await queues[w].claim(f"{label}-{w}") is not None

        results["child claim"] = await _run(workers, ops, claim)
        return results
    finally:
        for connection in connections:
            await connection.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="+", help="the nodes' URLs, node 1 first")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--ops", type=int, default=600)
    args = parser.parse_args()
    create_schema(args.urls[0], drop_first=True)
    table: dict[str, dict[str, float]] = {}
    table["one node"] = await measure(args.urls[:1], args.workers, args.ops, "one")
    table[f"{len(args.urls)} nodes"] = await measure(args.urls, args.workers, args.ops, "spread")
    for placement, results in table.items():
        for op, rate in results.items():
            print(f"{placement:>10}  {op:<14} {rate:8.0f} ops/s")
    print(json.dumps({"workers": args.workers, "ops": args.ops, "ops_per_s": table}))


if __name__ == "__main__":
    asyncio.run(main())
