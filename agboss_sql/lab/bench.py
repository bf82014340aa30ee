"""The benchmark: our stores beside the raw driver doing the same atomic work, in one run.

For each hot operation it runs the store, then the raw driver sending the same
statements (compiled once from the store's own statement set, or recorded from one of
its calls, and sent on a driver connection with no SQLAlchemy, no pool and no deadline
in between: psycopg async, aiomysql, and the stdlib `sqlite3` synchronously in the
event loop's thread), and reports ops/s, p50/p99 latency, the ratio ours/raw, and
statements per operation. Each figure is the median of several runs. One JSON line
per measurement, then a table.

The database is migrated to head first, and every agboss table is emptied before each
operation: point it at a database of its own, never at one in use.

The floor and the stopwatch are in `_bench_floor`, the bench's tables and the scale run in
`_bench_scale`, the child claim in `_bench_claims`; their public names are named from here.

    agboss-sql bench --url postgresql://postgres@127.0.0.1:5432/agboss_bench
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.clocks import StoreClock
from agboss_sql.contracts.keys import fenced_effect_key_of, fenced_key_identity_of
from agboss_sql.contracts.types import (
    ApplicationContext,
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    StepRef,
)
from agboss_sql.lab._bench_claims import claim_ours, claim_raw
from agboss_sql.lab._bench_floor import (
    Floor,
    InlineFloor,
    Measurement,
    Op,
    ServerFloor,
    Timing,
    _count_engine_statements,
    _median_timing,
    measure,
    open_floor,
    table,
)
from agboss_sql.lab._bench_queue import SHAPES, drain_floor, drain_ours
from agboss_sql.lab._bench_scale import (
    bench_metadata,
    bench_rows,
    drop_bench_tables,
    fill_children,
    fill_leases,
    fresh_tables,
    prepare_database,
    run_scale,
)
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql._fence import FenceStatements
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import EffectStatements, SqlFencedEffectRepository
from agboss_sql.sql.leases import LeaseStatements, SqlExecutionLeaseRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository
from agboss_sql.sql.rate_limits import SqlRateLimitRepository

_INSERT_ROW = sa.insert(bench_rows).values(row=sa.bindparam("row"))


@dataclass
class Bench:
    """One database's benchmark run."""

    url: str
    ops: int = 500
    runs: int = 3
    warmup: int = 50
    results: list[Measurement] = field(default_factory=list)
    out: Any = None
    """Where the JSON lines go (`None`: `sys.stdout` at the time of writing)."""
    database: str = ""
    inline: bool = False

    async def run(self, only: set[str] | None = None) -> list[Measurement]:
        """Run the benchmarks (those named in `only`, else all) on a migrated database and
        return their measurements, ours beside the floor's for each."""
        await asyncio.to_thread(prepare_database, self.url)
        try:
            connection = SqlConnection(self.url)
            try:
                await connection.ping()  # the server's capabilities are known from here on
                self.database = connection.dialect.NAME
                self.inline = connection.capabilities.inline
                floor = await open_floor(connection)
                try:
                    for name, case in self.cases():
                        if only and name not in only:
                            continue
                        await fresh_tables(connection, bench_rows)
                        await case(connection, floor)
                finally:
                    await floor.close()
                    await fresh_tables(connection)
            finally:
                await connection.close()
        finally:
            await asyncio.to_thread(drop_bench_tables, self.url)
        return self.results

    def cases(self) -> list[tuple[str, Callable[[SqlConnection, Floor], Awaitable[None]]]]:
        return [
            ("lease.acquire", self.lease_acquire),
            ("lease.renew", self.lease_renew),
            ("lease.release", self.lease_release),
            ("fenced_effect", self.fenced_effect),
            ("outbound_call.record", self.outbound_record),
            ("rate_limit.acquire_slot", self.slot_acquire),
            ("child.claim", self.child_claim),
            ("child.drain", self.child_drain),
        ]

    # --- reporting ---------------------------------------------------------------------------

    def _record(
        self,
        operation: str,
        ours: tuple[Timing, float],
        raw: tuple[Timing, float],
        *,
        target: float,
        note: str = "",
        total_ops: int,
    ) -> None:
        """Report `ours` beside `raw`, each a timing and the statements sent per op."""
        ratio = ours[0].ops_per_s / raw[0].ops_per_s if raw[0].ops_per_s else None
        for impl, (timing, statements) in (("raw", raw), ("agboss", ours)):
            measurement = Measurement(
                operation=operation,
                database=self.database,
                impl=impl,
                ops_per_s=round(timing.ops_per_s, 1),
                p50_ms=round(timing.p50_ms, 3),
                p99_ms=round(timing.p99_ms, 3),
                statements_per_op=round(statements, 2),
                round_trips_per_op=round(statements, 2),
                cpu_us_per_op=round(timing.cpu_us_per_op, 1),
                ops=total_ops,
                runs=self.runs,
                note=note,
            )
            if impl == "agboss":
                measurement.ratio = round(ratio, 3) if ratio is not None else None
                measurement.target = target
                measurement.verdict = "pass" if ratio is not None and ratio >= target else "short"
            self.results.append(measurement)
            print(json.dumps(asdict(measurement)), file=self.out or sys.stdout, flush=True)

    async def _pair(
        self,
        operation: str,
        connection: SqlConnection,
        floor: Floor,
        ours: Op,
        raw: Op,
        *,
        target: float,
        note: str = "",
    ) -> None:
        counted: list[str] = []
        remove = connection.add_statement_listener(lambda sql, _p: counted.append(sql))
        remove_sa = _count_engine_statements(connection, counted)
        total = self.warmup + self.runs * self.ops
        try:
            our_figures = await measure(
                ours, ops=self.ops, runs=self.runs, warmup=self.warmup, base=0
            )
        finally:
            remove()
            remove_sa()
        floor.statements = 0
        raw_figures = await measure(
            raw, ops=self.ops, runs=self.runs, warmup=self.warmup, base=1_000_000
        )
        self._record(
            operation,
            (our_figures, len(counted) / total),
            (raw_figures, floor.statements / total),
            target=target,
            note=note,
            total_ops=total,
        )

    def _lease_target(self) -> float:
        # Against a raw *sync* inline driver (sqlite3) an async store cannot come as close.
        return 0.5 if self.inline else 0.8

    def _effect_target(self) -> float:
        # Inline, the work's SQLAlchemy Core statement costs more than its whole raw statement.
        return 0.5 if self.inline else 0.7

    def _claim_target(self) -> float:
        # Inline, the raw workers never yield to each other (their driver calls never
        # suspend): one of them takes every child; ours take turns, as async workers must.
        return 0.6 if self.inline else 0.7

    # --- the operations ----------------------------------------------------------------------

    async def lease_acquire(self, connection: SqlConnection, floor: Floor) -> None:
        store = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("bench"))
        statements = _lease_statements(connection)
        statement = (
            statements.acquire_returning if connection.capabilities.insert_returning else None
        )

        async def ours(i: int) -> None:
            assert await store.acquire("t", f"a-{i}", 30_000) is not None

        if statement is None:  # no RETURNING on an insert (MySQL 8): the take and its read-back
            take, read = (
                connection.compiled(statements.acquire),
                connection.compiled(statements.read),
            )

            async def raw(i: int) -> None:
                params = {
                    **take.defaults,
                    "tenant_id": "t",
                    "execution_id": f"a-{i}",
                    "holder": "bench",
                    "lease_ms": 30_000,
                    "take_id": f"{i:032d}",
                }
                await floor.execute(take.sql, params)
                await floor.execute(read.sql, params)
        else:
            compiled = connection.compiled(statement)

            async def raw(i: int) -> None:
                rows, _ = await floor.execute(
                    compiled.sql,
                    {
                        **compiled.defaults,
                        "tenant_id": "t",
                        "execution_id": f"a-{i}",
                        "holder": "bench",
                        "lease_ms": 30_000,
                        "take_id": f"{i:032d}",
                    },
                )
                assert rows

        await self._pair(
            "lease.acquire",
            connection,
            floor,
            ours,
            raw,
            target=self._lease_target(),
            note="a new execution per take",
        )

    async def _held_leases(self, connection: SqlConnection, count: int, prefix: str) -> list[Any]:
        store = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("bench"))
        leases = []
        for i in range(count):
            lease = await store.acquire("t", f"{prefix}-{i}", 600_000)
            assert lease is not None
            leases.append(lease)
        return leases

    async def lease_renew(self, connection: SqlConnection, floor: Floor) -> None:
        store = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("bench"))
        ours_lease = (await self._held_leases(connection, 1, "renew"))[0]
        raw_lease = (await self._held_leases(connection, 1, "renew-raw"))[0]
        statements = _lease_statements(connection)
        compiled = connection.compiled(statements.renew)
        two_trips = not statements.returning
        read = connection.compiled(statements.read)

        async def ours(_i: int) -> None:
            assert await store.renew(ours_lease, 600_000) is not None

        params = {
            **compiled.defaults,
            "tenant_id": "t",
            "execution_id": raw_lease.execution_id,
            "holder": "bench",
            "epoch": raw_lease.lease_epoch,
            "lease_ms": 600_000,
        }

        async def raw(_i: int) -> None:
            _, count = await floor.execute(compiled.sql, params)
            assert count == 1
            if two_trips:
                await floor.execute(read.sql, {**read.defaults, **params})

        await self._pair("lease.renew", connection, floor, ours, raw, target=self._lease_target())

    async def lease_release(self, connection: SqlConnection, floor: Floor) -> None:
        store = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("bench"))
        total = self.warmup + self.runs * self.ops
        ours_leases = await self._held_leases(connection, total, "rel")
        raw_leases = await self._held_leases(connection, total, "rel-raw")
        compiled = connection.compiled(_lease_statements(connection).release)

        async def ours(i: int) -> None:
            assert await store.release(ours_leases[i])

        async def raw(i: int) -> None:
            lease = raw_leases[i - 1_000_000]
            _, count = await floor.execute(
                compiled.sql,
                {
                    **compiled.defaults,
                    "tenant_id": "t",
                    "execution_id": lease.execution_id,
                    "holder": "bench",
                    "epoch": lease.lease_epoch,
                },
            )
            assert count == 1

        await self._pair("lease.release", connection, floor, ours, raw, target=self._lease_target())

    def _key(self, lease: ExecutionLease, i: int, name: str) -> FencedEffectKey:
        context = ExecutionContext(
            "t",
            lease.execution_id,
            lease.execution_id,
            lease,
            StepRef(lease.execution_id, f"step-{i}", "charge"),
        )
        return fenced_effect_key_of(context, name)

    async def fenced_effect(self, connection: SqlConnection, floor: Floor) -> None:
        store = SqlFencedEffectRepository(connection, StoreClock(), ApplicationContext("bench"))
        ours_lease = (await self._held_leases(connection, 1, "fx"))[0]
        raw_lease = (await self._held_leases(connection, 1, "fx-raw"))[0]

        async def ours(i: int) -> None:
            async def work(tx: Any) -> str:
                await tx.execute(_INSERT_ROW, {"row": f"row-{i}"})
                return "ok"

            result = await store.save_result_if_absent(self._key(ours_lease, i, "charge"), work)
            assert not result.replayed

        fence_sql = connection.prepared(FenceStatements, database_time=True)
        effect_sql = connection.prepared(EffectStatements, database_time=True)
        fence = connection.compiled(fence_sql.fence)
        claim = connection.compiled(effect_sql.claim)
        business = connection.compiled(_INSERT_ROW)
        stored = connection.compiled(effect_sql.store)
        begin = connection.dialect.BEGIN

        async def raw(i: int) -> None:
            key = self._key(raw_lease, i, "charge")
            identity = fenced_key_identity_of(key)
            digest = identity_hash(identity)
            await floor.text(begin)
            _, count = await floor.execute(
                fence.sql,
                {
                    **fence.defaults,
                    "tenant_id": "t",
                    "execution_id": raw_lease.execution_id,
                    "token": raw_lease.lease_epoch,
                    "holder_instance_id": raw_lease.holder_instance_id,
                },
            )
            assert count == 1
            await floor.execute(
                claim.sql,
                {
                    **claim.defaults,
                    "identity_hash": digest,
                    "identity": identity,
                    "tenant_id": "t",
                    "scope_key": key.scope_key,
                    "name": key.name,
                    "business_key": None,
                    "fingerprint": None,
                    "step_execution_id": key.step.execution_id,
                    "step_idempotency_key": key.step.idempotency_key,
                    "step_name": key.step.name,
                    "lease_execution_id": key.lease_execution_id,
                    "token": key.token,
                },
            )
            await floor.execute(business.sql, {**business.defaults, "row": f"raw-{i}"})
            await floor.execute(
                stored.sql, {**stored.defaults, "identity_hash": digest, "result": '"ok"'}
            )
            await floor.text("COMMIT")

        await self._pair(
            "fenced_effect",
            connection,
            floor,
            ours,
            raw,
            target=self._effect_target(),
            note="lease check + mark, claim, one business row, result",
        )

    async def outbound_record(self, connection: SqlConnection, floor: Floor) -> None:
        store = SqlOutboundCallRepository(connection, StoreClock(), ApplicationContext("bench"))
        ours_lease = (await self._held_leases(connection, 1, "ob"))[0]

        async def ours(i: int) -> None:
            saved = await store.save_if_absent(
                self._key(ours_lease, i, "pay"), {"amount": i}, 1_700_000_000_000
            )
            assert saved.created

        # The floor: the same fenced transaction, recorded from one of our own calls.
        recorded: list[tuple[str, Mapping[str, Any]]] = []
        probe_lease = (await self._held_leases(connection, 1, "ob-probe"))[0]
        remove = connection.add_statement_listener(
            lambda sql, params: recorded.append((sql, dict(params)))
        )
        try:
            await store.save_if_absent(self._key(probe_lease, 0, "pay"), {"amount": 0}, 0)
        finally:
            remove()
        raw_lease = (await self._held_leases(connection, 1, "ob-raw"))[0]

        async def raw(i: int) -> None:
            key = self._key(raw_lease, i, "pay")
            digest = identity_hash(fenced_key_identity_of(key))
            for sql, params in recorded:
                if not params:
                    await floor.text(sql)
                    continue
                values = dict(params)
                for name, value in params.items():
                    if value == probe_lease.execution_id:
                        values[name] = raw_lease.execution_id
                    elif isinstance(value, str) and name == "identity_hash":
                        values[name] = digest
                    elif isinstance(value, str) and probe_lease.execution_id in value:
                        values[name] = (
                            value.replace(probe_lease.execution_id, raw_lease.execution_id)
                            .replace('"step-0"', f'"step-{i}"')
                            .replace("step-0", f"step-{i}")
                        )
                await floor.execute(sql, values)

        await self._pair(
            "outbound_call.record",
            connection,
            floor,
            ours,
            raw,
            target=0.7,
            note="lease check + mark, insert of the intent",
        )

    async def slot_acquire(self, connection: SqlConnection, floor: Floor) -> None:
        store = SqlRateLimitRepository(connection, StoreClock(), ApplicationContext("bench"))

        async def ours(i: int) -> None:
            assert await store.acquire_slot(f"k-{i}", "h", 3, 60_000)

        recorded: list[tuple[str, Mapping[str, Any]]] = []
        remove = connection.add_statement_listener(
            lambda sql, params: recorded.append((sql, dict(params)))
        )
        try:
            await store.acquire_slot("probe-key", "h", 3, 60_000)
        finally:
            remove()

        async def raw(i: int) -> None:
            for sql, params in recorded:
                if not params:
                    await floor.text(sql)
                    continue
                values = {n: (f"raw-{i}" if v == "probe-key" else v) for n, v in params.items()}
                await floor.execute(sql, values)

        await self._pair(
            "rate_limit.acquire_slot",
            connection,
            floor,
            ours,
            raw,
            target=0.7,
            note="a new key per take",
        )

    async def child_claim(self, connection: SqlConnection, floor: Floor) -> None:
        count = self.ops
        for workers in (1, 2, 8):
            # One queue of `ops` children per run, ours and the floor's runs taking turns
            # (a machine whose load drifts weighs on both alike); the median run of each.
            ours_runs: list[Timing] = []
            raw_runs: list[Timing] = []
            for _ in range(self.runs):
                ours_runs.append(await self._claim_ours(connection, count, workers))
                raw_runs.append(await self._claim_raw(connection, count, workers))
            self._record(
                f"child.claim x{workers}",
                (_median_timing(ours_runs), 0.0),
                (_median_timing(raw_runs), 0.0),
                target=self._claim_target(),
                note=f"{self.runs} runs of {count} queued children, {workers} workers, no "
                "double claims",
                total_ops=count * self.runs,
            )

    async def child_drain(self, connection: SqlConnection, _floor: Floor) -> None:
        """`ops` children claimed 10 at a time and finished, under one parent and one parent
        per child, by 1 and 4 workers: ours and the floor's drains taking turns."""
        for workers in (1, 4):
            for shape in SHAPES:
                ours: list[Timing] = []
                raw: list[Timing] = []
                statements: list[float] = []
                for _ in range(self.runs):
                    mine = await drain_ours(self.url, connection, shape, self.ops, workers)
                    floor = await drain_floor(connection, shape, self.ops, workers)
                    ours.append(Timing(mine.jobs_per_s, 0.0, 0.0, mine.cpu_us_per_job))
                    raw.append(Timing(floor.jobs_per_s, 0.0, 0.0, floor.cpu_us_per_job))
                    statements.append(mine.statements_per_job)
                per_job = statistics.median(statements)
                self._record(
                    f"child.drain x{workers}, {shape}",
                    (_median_timing(ours), per_job),
                    (_median_timing(raw), per_job),
                    target=0.7,
                    note=f"{self.runs} runs of {self.ops} children claimed 10 at a time and "
                    "finished",
                    total_ops=self.ops * self.runs,
                )

    async def _claim_ours(self, connection: SqlConnection, count: int, workers: int) -> Timing:
        return await claim_ours(self.url, connection, count, workers)

    async def _claim_raw(self, connection: SqlConnection, count: int, workers: int) -> Timing:
        return await claim_raw(connection, count, workers)


async def run_bench(url: str, *, ops: int, runs: int, only: set[str] | None = None) -> str:
    """Run the benchmarks on `url` (one JSON line per measurement on stdout) and return the
    readable table."""
    bench = Bench(url, ops=ops, runs=runs, warmup=max(10, ops // 10))
    results = await bench.run(only)
    return table(results)


def _lease_statements(connection: SqlConnection) -> LeaseStatements:
    """The lease store's statement set, as a store on database time (`StoreClock()`) uses it."""
    return connection.prepared(LeaseStatements, database_time=StoreClock().is_database_time)


__all__ = [
    "Bench",
    "Floor",
    "InlineFloor",
    "Measurement",
    "Op",
    "ServerFloor",
    "Timing",
    "bench_metadata",
    "bench_rows",
    "drop_bench_tables",
    "fill_children",
    "fill_leases",
    "fresh_tables",
    "measure",
    "open_floor",
    "prepare_database",
    "run_bench",
    "run_scale",
    "table",
]
