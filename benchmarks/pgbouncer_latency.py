"""Median latency of the three ways a statement is sent, on each URL given: a statement
alone (`SqlConnection.execute`), a step of two statements in a transaction (`run`), and an
engine transaction of one statement (`transaction()`), each 50 times to warm up, then N times.

    python benchmarks/pgbouncer_latency.py 1000 \\
        postgresql://postgres@127.0.0.1:5432/db \\
        'postgresql://postgres@127.0.0.1:6432/db?agboss_pooling=transaction'

Through a transaction pooler (`?agboss_pooling=transaction`) a statement alone takes three
round trips, where a direct connection takes one (docs/operations.md, "Running behind
PgBouncer").
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa

from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.statements import Exec, Step

WARM_UP = 50


def _step() -> Step[None]:
    yield Exec(sa.text("SELECT 1"), {})
    yield Exec(sa.text("SELECT 2"), {})


async def _median_ms(call: Callable[[], Awaitable[Any]], n: int) -> float:
    for _ in range(WARM_UP):
        await call()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def measure(url: str, n: int) -> dict[str, float]:
    """The median ms of each way of sending, on `url`."""
    connection = SqlConnection(url)
    try:

        async def engine_transaction() -> None:
            async with connection.transaction() as transaction:
                await transaction.execute(sa.text("SELECT 1"))

        return {
            "alone": await _median_ms(lambda: connection.execute(sa.text("SELECT 1")), n),
            "step": await _median_ms(lambda: connection.run(_step), n),
            "engine transaction": await _median_ms(engine_transaction, n),
        }
    finally:
        await connection.close()


async def main(n: int, urls: list[str]) -> None:
    for url in urls:
        found = await measure(url, n)
        print(url, {name: round(ms, 3) for name, ms in found.items()})


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2:]))
