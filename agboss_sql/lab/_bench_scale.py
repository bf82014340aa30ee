"""The bench's tables and the scale run: the business table its fenced effects write to,
emptying the agboss tables between operations, and lease take and child claim with many
rows already in the table (`run_scale`, `agboss-sql bench --scale`)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.clocks import StoreClock, SystemClock
from agboss_sql.contracts.types import ApplicationContext
from agboss_sql.lab._bench_floor import measure
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository
from agboss_sql.sql.schema import child_executions, execution_leases, metadata

bench_metadata = sa.MetaData()
bench_rows = sa.Table(
    "agboss_bench_rows",
    bench_metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("row", sa.String(255), nullable=False),
)
"""The business table the fenced effects of the bench write their rows to. It is not part of
the project's schema: the bench creates it, and drops it when done."""


async def fresh_tables(connection: SqlConnection, *more: sa.Table) -> None:
    """Empty every agboss table (and the tables `more`) and give their storage back
    (TRUNCATE where the database has it): a DELETE would leave the dead rows of earlier
    runs in the indexes, and the figures would measure them."""
    names = [table.name for table in (*metadata.sorted_tables, *more)]
    for statement in connection.dialect.truncate_sql(names):
        await connection.execute(statement)


def prepare_database(url: str) -> None:
    """Migrate the database at `url` to head and create the bench's business table."""
    migrate.upgrade(url)
    with migrate.connect(url) as connection, connection.begin():
        bench_metadata.create_all(connection)


def drop_bench_tables(url: str) -> None:
    """Drop the bench's business table (the project's tables stay, emptied)."""
    with migrate.connect(url) as connection, connection.begin():
        bench_metadata.drop_all(connection)


def _numbers(n: int) -> Any:
    """A derived table of the integers 0..n-1 (n a power of ten): a cross join of digits,
    portable to all three databases and free of recursion limits."""
    digits = sa.union_all(*(sa.select(sa.literal(d).label("d")) for d in range(10)))
    places = max(1, len(str(n)) - 1)
    tables = [digits.subquery(f"p{k}") for k in range(places)]
    value = sum((t.c.d * (10**k) for k, t in enumerate(tables)), sa.literal(0))
    query = sa.select(value.label("n"))
    for table in tables:
        query = query.select_from(table) if table is tables[0] else query.join(table, sa.true())
    return query.subquery("numbers")


async def fill_leases(connection: SqlConnection, n: int) -> None:
    """`n` expired leases of other executions (one statement)."""
    t = execution_leases
    numbers = _numbers(n)
    name = sa.literal("fill-") + sa.cast(numbers.c.n, sa.String)
    columns: dict[str, Any] = {
        "tenant_id": sa.literal("fill"),
        "execution_id": name,
        "holder_instance_id": sa.literal("x"),
        "lease_epoch": sa.literal(1),
        "expires_at": sa.literal(0),
        "released": sa.false(),
        "yielded": sa.false(),
        "finished": sa.false(),
        "fence_token": sa.literal(0),
        "updated_at": sa.literal(0),
    }
    select = sa.select(*(v.label(k) for k, v in columns.items()))
    await connection.execute(sa.insert(t).from_select(list(columns), select))


async def fill_children(connection: SqlConnection, n: int) -> None:
    """`n` children already claimed and finished, and as many more queued (one statement
    each): the claim must find the queued ones by its index, not by a scan."""
    t = child_executions
    for status, prefix in (("finished", "done-"), ("queued", "wait-")):
        numbers = _numbers(n)
        columns: dict[str, Any] = {
            "child_execution_id": sa.literal(prefix) + sa.cast(numbers.c.n, sa.String),
            "tenant_id": sa.literal("fill"),
            "root_execution_id": sa.literal("root"),
            "parent_execution_id": sa.literal("parent-") + sa.cast(numbers.c.n % 1000, sa.String),
            "depth": numbers.c.n % 4,
            "status": sa.literal(status),
            "attempt": sa.literal(1),
            "queued_at": numbers.c.n,
        }
        select = sa.select(*(v.label(k) for k, v in columns.items()))
        await connection.execute(sa.insert(t).from_select(list(columns), select))


async def run_scale(url: str, sizes: list[int], *, ops: int = 300, out: Any = None) -> str:
    """p50 of a lease take and of a child claim with `size` rows already in the table, for
    each size: the cost must stay flat (an index lookup, never a scan)."""
    await asyncio.to_thread(migrate.upgrade, url)
    connection = SqlConnection(url)
    leases = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("bench"))
    queue = SqlChildExecutionQueueRepository(connection, SystemClock(), ApplicationContext("b"))
    rows: list[tuple[str, int, float]] = []
    try:
        for size in sizes:
            await fresh_tables(connection)
            await fill_leases(connection, size)
            # As autovacuum (or its peers) would have by now: plans from fresh statistics.
            await connection.execute(connection.dialect.analyze_sql(execution_leases.name))

            async def take(i: int, size: int = size) -> None:
                assert await leases.acquire("t", f"s{size}-{i}", 30_000) is not None

            timing = await measure(take, ops=ops, runs=1, warmup=20, base=0)
            rows.append(("lease.acquire", size, timing.p50_ms))
            await fresh_tables(connection)
            await fill_children(connection, size)
            await connection.execute(connection.dialect.analyze_sql(child_executions.name))

            async def claim(_i: int) -> None:
                assert await queue.claim("bench") is not None

            timing = await measure(claim, ops=ops, runs=1, warmup=20, base=0)
            rows.append(("child.claim", size, timing.p50_ms))
    finally:
        await fresh_tables(connection)
        await connection.close()
    lines = [f"{'operation':<16} {'rows':>9} {'p50 ms':>8} {'vs smallest':>11} verdict"]
    for name, size, p50 in rows:
        base = next(p for n, s, p in rows if n == name and s == sizes[0])
        ratio = p50 / base if base else 0.0
        verdict = "pass" if ratio <= 1.5 else "short"
        record = {
            "operation": name,
            "rows": size,
            "p50_ms": round(p50, 3),
            "ratio_to_smallest": round(ratio, 2),
            "target": 1.5,
            "verdict": verdict,
        }
        print(json.dumps(record), file=out or sys.stdout, flush=True)
        lines.append(f"{name:<16} {size:>9} {p50:>8.3f} {ratio:>11.2f} {verdict}")
    return "\n".join(lines)
