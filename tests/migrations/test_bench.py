"""The `bench` command's machinery on each database: every benchmark runs our store beside
the raw driver, sends the same statements, and leaves the database as it found it.

The bench migrates and empties every agboss table, so it runs on the migration tests'
scratch database, never on the one the store tests share.
"""

from __future__ import annotations

import io
import json

import pytest
import sqlalchemy as sa
from migration_support import connected, table_names

from agboss_sql.contracts.clocks import StoreClock, SystemClock
from agboss_sql.contracts.types import ApplicationContext, ClaimedChild, QueuedChild
from agboss_sql.lab.bench import Bench, Measurement, bench_rows, fresh_tables, run_scale
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository
from agboss_sql.sql.schema import metadata

pytestmark = pytest.mark.database

OPERATIONS = {
    "lease.acquire",
    "lease.renew",
    "lease.release",
    "fenced_effect",
    "outbound_call.record",
    "rate_limit.acquire_slot",
    "child.claim x1",
    "child.claim x2",
    "child.claim x8",
    "child.drain x1, one parent",
    "child.drain x1, parent per child",
    "child.drain x4, one parent",
    "child.drain x4, parent per child",
}
# The floor of these sends exactly what one call of ours sent (compiled from the store's
# statement set, or recorded from one of its calls).
SAME_STATEMENTS = {
    "lease.acquire",
    "lease.renew",
    "lease.release",
    "outbound_call.record",
    "rate_limit.acquire_slot",
}


def _row_counts(url: str) -> dict[str, int]:
    with connected(url) as connection:
        return {
            table.name: int(
                connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            )
            for table in metadata.sorted_tables
        }


async def test_every_benchmark_runs_ours_beside_the_floor(empty_url: str) -> None:
    out = io.StringIO()
    bench = Bench(empty_url, ops=4, runs=1, warmup=2, out=out)
    results = await bench.run()

    by_operation: dict[str, dict[str, Measurement]] = {}
    for m in results:
        by_operation.setdefault(m.operation, {})[m.impl] = m
    assert set(by_operation) == OPERATIONS
    for operation, pair in by_operation.items():
        assert set(pair) == {"raw", "agboss"}, operation
        ours, raw = pair["agboss"], pair["raw"]
        assert ours.ratio is not None and ours.ratio > 0, operation
        assert ours.ops_per_s > 0 and raw.ops_per_s > 0, operation
        assert ours.cpu_us_per_op > 0 and raw.cpu_us_per_op > 0, operation
        if operation in SAME_STATEMENTS:
            assert ours.statements_per_op == raw.statements_per_op >= 1, operation
    ours_fx, raw_fx = by_operation["fenced_effect"]["agboss"], by_operation["fenced_effect"]["raw"]
    # BEGIN, fence, claim, business row, result, COMMIT on the floor; ours sends the same,
    # except where the driver starts its transaction with the first statement (no BEGIN).
    assert raw_fx.statements_per_op == 6
    assert ours_fx.statements_per_op in (5, 6)

    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == len(results) == 2 * len(OPERATIONS)
    # Left as found: the schema at head, every agboss table empty, no business table.
    assert migrate.current(empty_url) == migrate.head()
    assert set(_row_counts(empty_url).values()) == {0}
    assert bench_rows.name not in table_names(empty_url)


async def test_fresh_tables_empties_every_agboss_table(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    async with SqlConnection(empty_url) as connection:
        leases = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("a"))
        queue = SqlChildExecutionQueueRepository(connection, SystemClock(), ApplicationContext("a"))
        for i in range(3):
            assert await leases.acquire("t", f"e-{i}", 60_000) is not None
            await queue.enqueue(QueuedChild("t", "root", "parent", f"c-{i}", 0))
        before = _row_counts(empty_url)
        assert before["agboss_execution_leases"] == 3
        assert before["agboss_child_executions"] == 3

        await fresh_tables(connection)

        assert set(_row_counts(empty_url).values()) == {0}
        # Emptied, still usable: the same keys can be taken again.
        assert await leases.acquire("t", "e-0", 60_000) is not None


async def test_scale_reports_each_size(empty_url: str) -> None:
    # Each size must hold more queued children than the claims measured (5 + 20 warm-up).
    out = io.StringIO()
    text = await run_scale(empty_url, [100, 1000], ops=5, out=out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["operation"], r["rows"]) for r in records] == [
        ("lease.acquire", 100),
        ("child.claim", 100),
        ("lease.acquire", 1000),
        ("child.claim", 1000),
    ]
    assert all(r["p50_ms"] > 0 for r in records)
    assert "vs smallest" in text
    assert set(_row_counts(empty_url).values()) == {0}


async def test_a_doubled_claim_fails_the_claim_benchmark(
    empty_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim benchmark checks its own answer: a broken queue that hands one child out
    twice makes it fail rather than report a rate."""
    migrate.upgrade(empty_url)
    claim = SqlChildExecutionQueueRepository.claim
    handed_out: list[ClaimedChild] = []

    async def claims_one_child_twice(
        self: SqlChildExecutionQueueRepository, instance_id: str
    ) -> ClaimedChild | None:
        if len(handed_out) == 1:
            handed_out.append(handed_out[0])
            return handed_out[0]
        child = await claim(self, instance_id)
        if child is not None and not handed_out:
            handed_out.append(child)
        return child

    async with SqlConnection(empty_url) as connection:
        bench = Bench(empty_url)
        assert (await bench._claim_ours(connection, 5, 2)).ops_per_s > 0  # the real queue
        monkeypatch.setattr(SqlChildExecutionQueueRepository, "claim", claims_one_child_twice)
        with pytest.raises(AssertionError, match="lost or doubled"):
            await bench._claim_ours(connection, 5, 2)
    assert len(handed_out) == 2
