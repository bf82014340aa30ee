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

    agboss-sql bench --url postgresql://postgres@127.0.0.1:5432/agboss_bench
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa

from agboss_sql._dialects import inline_dialect, server_dialect
from agboss_sql._dialects.base import InlineDriver, ServerDriver
from agboss_sql.contracts.clocks import StoreClock, SystemClock
from agboss_sql.contracts.keys import fenced_effect_key_of, fenced_key_identity_of
from agboss_sql.contracts.types import (
    ApplicationContext,
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    QueuedChild,
    StepRef,
)
from agboss_sql.sql import migrate
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql._fence import FenceStatements
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import EffectStatements, SqlFencedEffectRepository
from agboss_sql.sql.leases import LeaseStatements, SqlExecutionLeaseRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository
from agboss_sql.sql.queue import (
    FINISHED,
    QUEUED,
    RUNNING,
    QueueStatements,
    SqlChildExecutionQueueRepository,
)
from agboss_sql.sql.rate_limits import SqlRateLimitRepository
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

_INSERT_ROW = sa.insert(bench_rows).values(row=sa.bindparam("row"))
_STATUS_PARAMS = {"queued": QUEUED, "running": RUNNING, "finished": FINISHED}

Op = Callable[[int], Awaitable[Any]]


@dataclass
class Measurement:
    """One operation's figures for one implementation."""

    operation: str
    database: str
    impl: str
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    statements_per_op: float
    round_trips_per_op: float
    cpu_us_per_op: float
    """This process's CPU time per operation (median over the runs), in µs: what the client
    side costs, apart from the database's and the network's time and from other processes
    competing for the machine."""
    ops: int
    runs: int
    ratio: float | None = None
    target: float | None = None
    verdict: str | None = None
    note: str = ""


class Floor(Protocol):
    """A raw driver connection the floor runs on (no SQLAlchemy, no pool, no deadlines):
    the same thin driver calls our runners make, and nothing around them."""

    statements: int
    """Statements sent so far (`BEGIN`/`COMMIT` included)."""

    async def execute(self, sql: str, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        """Send `sql` with `params`; its rows (none for a statement without) and rowcount."""
        ...

    async def text(self, sql: str) -> None:
        """Send `sql` as written (`BEGIN`, `COMMIT`)."""
        ...

    async def close(self) -> None: ...


@dataclass
class InlineFloor:
    """An embedded database's stdlib driver, called synchronously on the event loop's
    thread."""

    driver: InlineDriver
    raw: sqlite3.Connection
    statements: int = 0

    async def execute(self, sql: str, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        self.statements += 1
        rows, count = self.driver.execute_sync(self.raw, sql, params)
        return rows or [], count

    async def text(self, sql: str) -> None:
        self.statements += 1
        self.driver.execute_sync(self.raw, sql, None)

    async def close(self) -> None:
        self.raw.close()


@dataclass
class ServerFloor:
    """A server's async driver connection, in autocommit, awaited directly."""

    driver: ServerDriver
    raw: Any
    statements: int = 0

    async def execute(self, sql: str, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        self.statements += 1
        rows, count = await self.driver.execute(self.raw, sql, params)
        return rows or [], count

    async def text(self, sql: str) -> None:
        self.statements += 1
        await self.driver.run_text(self.raw, sql)

    async def close(self) -> None:
        await self.driver.close(self.raw)


async def open_floor(connection: SqlConnection) -> Floor:
    """A raw driver connection to the same database, set up as our stores' connections are
    (the dialect's own connect: same session settings and bounds)."""
    name = connection.dialect.NAME
    if connection.capabilities.inline:
        inline = inline_dialect(name)
        return InlineFloor(inline, inline.connect_sync(connection.url.database or ""))
    server = server_dialect(name)
    return ServerFloor(server, await server.connect(connection.url, connection.timeouts))


class Timing(NamedTuple):
    """What `measure` found."""

    ops_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_op: float


async def _timed(op: Op, start: int, count: int) -> tuple[float, float, list[float]]:
    latencies: list[float] = []
    cpu = time.process_time()
    began = time.perf_counter()
    for i in range(start, start + count):
        t0 = time.perf_counter()
        await op(i)
        latencies.append((time.perf_counter() - t0) * 1000)
    elapsed = time.perf_counter() - began
    return count / elapsed, (time.process_time() - cpu) / count * 1e6, latencies


async def measure(op: Op, *, ops: int, runs: int, warmup: int, base: int) -> Timing:
    """Median ops/s and CPU µs per op over `runs`, and p50/p99 latency (ms) over every op."""
    await _timed(op, base, warmup)
    rates: list[float] = []
    cpus: list[float] = []
    latencies: list[float] = []
    for run in range(runs):
        rate, cpu, lat = await _timed(op, base + warmup + run * ops, ops)
        rates.append(rate)
        cpus.append(cpu)
        latencies.extend(lat)
    latencies.sort()
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return Timing(statistics.median(rates), p50, p99, statistics.median(cpus))


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
        store = SqlRateLimitRepository(connection, SystemClock(), ApplicationContext("bench"))

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

    async def _enqueue(self, connection: SqlConnection, count: int, prefix: str) -> None:
        await fresh_tables(connection)
        queue = SqlChildExecutionQueueRepository(
            connection, SystemClock(), ApplicationContext("bench")
        )
        for i in range(count):
            await queue.enqueue(QueuedChild("t", "root", "parent", f"{prefix}-{i}", i % 4))
        # Fresh planner statistics, as autovacuum (or its peers) would have in steady state.
        await connection.execute(connection.dialect.analyze_sql(child_executions.name))

    async def _claim_ours(self, connection: SqlConnection, count: int, workers: int) -> Timing:
        await self._enqueue(connection, count, "c")
        connections = [SqlConnection(self.url) for _ in range(workers)]
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

    async def _claim_raw(self, connection: SqlConnection, count: int, workers: int) -> Timing:
        await self._enqueue(connection, count, "r")
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


def _count_engine_statements(connection: SqlConnection, counted: list[str]) -> Callable[[], None]:
    """Count what goes through the SQLAlchemy engine too (a fenced effect's transaction and its
    work): each statement, each COMMIT/ROLLBACK, and the BEGIN a driver sends on its own
    before the first statement (`Dialect.DRIVER_SENDS_BEGIN`; where the engine sends the
    BEGIN itself, it is a statement). On SQLite the transaction's BEGIN/COMMIT/ROLLBACK are
    the inline runner's, seen by the statement listener: only the work's statements are
    counted here."""
    engine = connection.transaction_engine

    def statement(*_args: Any) -> None:
        counted.append("statement")

    sends_begin = connection.dialect.DRIVER_SENDS_BEGIN

    def begin(*_args: Any) -> None:
        if sends_begin:
            counted.append("BEGIN")

    def end(*_args: Any) -> None:
        counted.append("END")

    hooks: list[tuple[str, Callable[..., None]]] = [("before_cursor_execute", statement)]
    if not connection.capabilities.inline:
        hooks += [("begin", begin), ("commit", end), ("rollback", end)]
    for name, hook in hooks:
        sa.event.listen(engine, name, hook)

    def remove() -> None:
        for name, hook in hooks:
            sa.event.remove(engine, name, hook)

    return remove


def _median_timing(runs: list[Timing]) -> Timing:
    """The median rate and CPU per operation of `runs` (claims keep no latencies)."""
    return Timing(
        statistics.median(t.ops_per_s for t in runs),
        0.0,
        0.0,
        statistics.median(t.cpu_us_per_op for t in runs),
    )


def _claims_timing(count: int, began: float, cpu: float) -> Timing:
    """The rate and CPU per claim of `count` claims since `began` (`perf_counter`) and `cpu`
    (`process_time`); the workers' latencies are not kept."""
    rate = count / (time.perf_counter() - began)
    return Timing(rate, 0.0, 0.0, (time.process_time() - cpu) / count * 1e6)


def table(results: list[Measurement]) -> str:
    """The readable table of a run."""
    header = (
        f"{'operation':<26} {'database':<10} {'impl':<7} {'ops/s':>9} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'cpu µs':>7} {'stmts':>6} {'ratio':>6} {'target':>6} verdict"
    )
    lines = [header, "-" * len(header)]
    for m in results:
        lines.append(
            f"{m.operation:<26} {m.database:<10} {m.impl:<7} {m.ops_per_s:>9.0f} "
            f"{m.p50_ms:>8.3f} {m.p99_ms:>8.3f} {m.cpu_us_per_op:>7.0f} {m.statements_per_op:>6.2f} "
            f"{'' if m.ratio is None else f'{m.ratio:.2f}':>6} "
            f"{'' if m.target is None else f'{m.target:.2f}':>6} {m.verdict or ''}"
        )
    return "\n".join(lines)


async def run_bench(url: str, *, ops: int, runs: int, only: set[str] | None = None) -> str:
    """Run the benchmarks on `url` (one JSON line per measurement on stdout) and return the
    readable table."""
    bench = Bench(url, ops=ops, runs=runs, warmup=max(10, ops // 10))
    results = await bench.run(only)
    return table(results)


def _lease_statements(connection: SqlConnection) -> LeaseStatements:
    """The lease store's statement set, as a store on database time (`StoreClock()`) uses it."""
    return connection.prepared(LeaseStatements, database_time=StoreClock().is_database_time)
