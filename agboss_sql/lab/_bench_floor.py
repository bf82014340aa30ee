"""The bench's floor and stopwatch: a raw driver connection beside our stores (`Floor`),
the timing of an operation (`measure`), the statements our side sends, and the figures and
their table (`Measurement`, `table`)."""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa

from agboss_sql._dialects import inline_dialect, server_dialect
from agboss_sql._dialects.base import InlineDriver, ServerDriver
from agboss_sql.sql.connection import SqlConnection

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
        return InlineFloor(
            inline, inline.connect_sync(connection.url.database or "", connection.timeouts.lock_ms)
        )
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
