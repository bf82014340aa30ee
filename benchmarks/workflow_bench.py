"""Durable workflows: the runtime's `Engine` against DBOS Transact, on one database.

    python benchmarks/workflow_bench.py --url sqlite:////tmp/bench/wf.sqlite
    python benchmarks/workflow_bench.py --url postgresql://postgres@127.0.0.1:5432/agboss_bench

One workflow is `--steps` durable steps (10), each a trivial function (`n + 1`) whose
result is stored before the next step runs, started and awaited by the same process:

- `engine`: an `Engine(app, url=URL)` (it works the runs itself) and a workflow of
  `ctx.step` calls, started with `engine.start` and awaited with `handle.result()` (which,
  for a run on this instance, wakes when the run ends here instead of waiting `poll_ms`).
  Every step is fenced: its result commits in one transaction with the check of the run's
  lease.
- `dbos`: the same workflow with `@DBOS.workflow()` and `@DBOS.step()` (async), started with
  `DBOS.start_workflow_async` and awaited with its handle's `get_result()`, its system
  database at `--dbos-url` (default: beside ours, another SQLite file or another
  PostgreSQL database `<ours>_dbos` on the same server). Left out, with a note, when
  `dbos` is not installed.
- `floor` (`--floor`): the stores used directly, no engine: a lease taken, one
  `save_result_if_absent` per step, the lease finished: what the engine costs over the bare
  stores.

Each concurrency in `--concurrency` (1 and 10: that many workflows in flight, each worker
starting the next when its own ended) runs `--workflows` per contestant, in `--rounds`
slices the contestants take turns in (who goes first rotates), so a change in the
machine's load falls on all of them; a few untimed workflows warm each one up first.

Equal durability on SQLite: our connection runs WAL with `synchronous=NORMAL`
(`agboss_sql/_dialects/sqlite.py`); DBOS's system database is given the same on a
SQLAlchemy engine built here with DBOS's own connection settings otherwise (`BEGIN
IMMEDIATE`, its busy timeout, foreign keys, its pool), where DBOS left alone runs a
rollback journal with `synchronous=FULL`. Each contestant's settings are printed
(`"kind": "settings"`).

Statements per step: after the timed runs, a few workflows of `--steps` steps and a few of
one step run with every statement counted (ours: the connection's statement listener and
the events of the engine under its transactions; DBOS: SQLite's own trace of each
connection, or on PostgreSQL SQLAlchemy's statement and transaction events with the BEGIN
psycopg sends and the pre-ping of each checkout), printed as statements per workflow and
per added step (`"kind": "statements"`). Prints a table, then with `--json` one JSON line
per measurement, comparison and count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import importlib.util
import itertools
import json
import logging
import re
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.stores import ExecutionLeaseRepository, FencedEffectRepository
from agboss_sql.contracts.types import ExecutionContext, JsonValue, StepRef
from agboss_sql.runtime import Engine, WorkflowContext, Workflows
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import upgrade

TENANT = "bench"
TARGETS = {"postgresql": 1.5, "sqlite": 5.0}
"""Ours over DBOS's throughput, per database (`"met"` in a comparison's line)."""
WARMUP = 5
"""Untimed workflows per contestant before each concurrency's runs."""
COUNTED = 5
"""Workflows per length counted statement by statement (of `--steps` steps and of one)."""
ENGINE = "engine"
DBOS_NAME = "dbos"
FLOOR = "floor"


async def add_one(n: int) -> int:
    """A step's trivial work."""
    return n + 1


def _sqlite_path(url: str) -> Path | None:
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database)


def derived_dbos_url(url: str) -> str:
    """DBOS's system database beside ours: `<stem>_dbos.sqlite` in the same directory, or
    the database `<ours>_dbos` on the same PostgreSQL server."""
    parsed = sa.make_url(url)
    path = _sqlite_path(url)
    if path is not None:
        return f"sqlite:///{path.with_name(path.stem + '_dbos.sqlite')}"
    return parsed.set(database=f"{parsed.database}_dbos").render_as_string(hide_password=False)


# -- counting statements ---------------------------------------------------------------------


COUNTING: contextvars.ContextVar[bool] = contextvars.ContextVar("bench_counting", default=False)
"""True in the tasks (and the threads they hand work to) of the counted workflows: what the
contestants' background loops send meanwhile is not theirs."""


WRITE = re.compile(
    r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b|\bFOR\s+UPDATE\b|^\s*WITH\b.*\b(INSERT|UPDATE|DELETE)\b",
    re.IGNORECASE | re.DOTALL,
)
"""A statement that writes (or locks rows: on PostgreSQL its commit is flushed too)."""


@dataclass
class Counter:
    """What the counted workflows sent: statements, and durable commits (transactions that
    wrote, and writes sent alone in autocommit: each waits for its WAL to be flushed on
    PostgreSQL, which is what a sequential run's time is made of there)."""

    statements: int = 0
    commits: int = 0
    in_transaction: bool = False
    wrote: bool = False

    def reset(self) -> None:
        self.statements = self.commits = 0
        self.in_transaction = self.wrote = False

    def sent(self, sql: str | None) -> None:
        """A statement was sent (`None`: one that is no write, such as a ping or a BEGIN)."""
        if not COUNTING.get():
            return
        self.statements += 1
        if sql is not None and WRITE.search(sql):
            if self.in_transaction:
                self.wrote = True
            else:
                self.commits += 1

    def began(self) -> None:
        if COUNTING.get():
            self.in_transaction, self.wrote = True, False

    def ended(self, committed: bool) -> None:
        if COUNTING.get():
            self.commits += committed and self.wrote
            self.in_transaction = self.wrote = False

    def statement(self, sql: str) -> None:
        """A statement's text as the database got it, `BEGIN`/`COMMIT`/`ROLLBACK` included."""
        word = sql.split(None, 1)[0].upper() if sql.strip() else ""
        if word == "BEGIN":
            self.sent(None)
            self.began()
        elif word in ("COMMIT", "END", "ROLLBACK"):
            self.sent(None)
            self.ended(word != "ROLLBACK")
        else:
            self.sent(sql)


def count_transactions(engine: sa.Engine, counter: Counter, *, sends_begin: bool) -> list[Any]:
    """Count what a SQLAlchemy engine sends to a server: each statement, the BEGIN the driver
    sends before a transaction's first one (psycopg does), each COMMIT/ROLLBACK. The hooks,
    for `sa.event.remove`."""

    def statement(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        counter.sent(sql)

    def begin(_conn: Any) -> None:
        if sends_begin:
            counter.sent(None)
        counter.began()

    def commit(_conn: Any) -> None:
        counter.sent(None)
        counter.ended(True)

    def rollback(_conn: Any) -> None:
        counter.sent(None)
        counter.ended(False)

    hooks = [
        (engine, "before_cursor_execute", statement),
        (engine, "begin", begin),
        (engine, "commit", commit),
        (engine, "rollback", rollback),
    ]
    for target, name, hook in hooks:
        sa.event.listen(target, name, hook)
    return hooks


def count_ours(connection: SqlConnection, counter: Counter) -> Callable[[], None]:
    """Count every statement our connection sends: the statement listener (single
    statements, steps, and on SQLite the transactions' BEGIN IMMEDIATE/COMMIT), and on a
    server the engine under `transaction()` (its BEGIN, COMMIT, ROLLBACK). Returns the
    function that stops counting."""
    hooks: list[Any] = []
    if not connection.capabilities.inline:
        hooks = count_transactions(
            connection.transaction_engine,
            counter,
            sends_begin=connection.dialect.DRIVER_SENDS_BEGIN,
        )
    remove_listener = connection.add_statement_listener(lambda sql, _params: counter.statement(sql))

    def remove() -> None:
        remove_listener()
        for target, name, hook in hooks:
            sa.event.remove(target, name, hook)

    return remove


def count_dbos_server(engine: sa.Engine, counter: Counter) -> Callable[[], None]:
    """Count what DBOS's engine sends to PostgreSQL (`count_transactions`), and the
    pre-ping of each checkout of a pooled connection (DBOS sets `pool_pre_ping`). Returns
    the function that stops counting."""
    hooks = count_transactions(engine, counter, sends_begin=True)
    if engine.pool._pre_ping:
        hooks.append((engine.pool, "checkout", lambda *_args: counter.sent(None)))
        sa.event.listen(*hooks[-1])

    def remove() -> None:
        for target, name, hook in hooks:
            sa.event.remove(target, name, hook)

    return remove


# -- the contestants -------------------------------------------------------------------------


class Contestant:
    """Runs one workflow of `steps` steps per `run_one` call. Its statements are counted
    between `count_on()` and `count_off()` only: the timed runs carry no hooks."""

    name: str
    settings: dict[str, Any]
    counter: Counter

    async def run_one(self, index: int, steps: int) -> None:
        raise NotImplementedError

    def count_on(self) -> None:
        raise NotImplementedError

    def count_off(self) -> None:
        raise NotImplementedError

    async def settle(self) -> None:
        """Wait for whatever the finished workflows left running (a lease's release)."""

    async def unfinished(self) -> int:
        """Workflows of this run that did not end (0 when every one succeeded)."""
        return 0


def workflows_app() -> Workflows:
    app = Workflows("bench")

    @app.workflow
    async def flow(ctx: WorkflowContext, steps: int) -> int:
        total = 0
        for _ in range(steps):
            total = await ctx.step("add", add_one, total)
        return total

    return app


class Ours(Contestant):
    """The runtime's `Engine`, its runs awaited in process (see the module)."""

    name = ENGINE

    def __init__(self, url: str, run_id: str, max_steps: int) -> None:
        self.run_id = run_id
        self.started: list[str] = []
        self.engine = Engine(workflows_app(), url=url, max_concurrent_steps=max_steps)
        self.counter = Counter()
        self.settings = {"max_concurrent_steps": max_steps}

    async def open(self) -> None:
        await self.engine.open()
        connection = self.connection
        self.settings |= {"database": connection.dialect_name, "poll_ms": self.engine.poll_ms}
        self.settings |= await _our_pragmas(connection)

    def count_on(self) -> None:
        self._stop_counting = count_ours(self.connection, self.counter)

    def count_off(self) -> None:
        self._stop_counting()

    @property
    def connection(self) -> SqlConnection:
        assert self.engine.app is not None
        for value in self.engine.app.values.values():
            if isinstance(value, SqlConnection):
                return value
        raise RuntimeError("the engine's application has no SQL connection")

    async def close(self) -> None:
        await self.engine.close()

    async def run_one(self, index: int, steps: int) -> None:
        workflow_id = f"wf-{self.run_id}-{index}-{steps}"
        handle = await self.engine.start("flow", steps, id=workflow_id, tenant_id=TENANT)
        self.started.append(workflow_id)
        result = await handle.result()
        if result != steps:
            raise AssertionError(f"{workflow_id} answered {result!r}, not {steps}")

    async def settle(self) -> None:
        # A run's task finishes its lease after it reported its end.
        while any(keeper.held for keeper in list(self.engine._keepers)):
            await asyncio.sleep(0)

    async def unfinished(self) -> int:
        left = 0
        for workflow_id in self.started:
            status = await self.engine.status(workflow_id, tenant_id=TENANT)
            left += status.state.value != "succeeded"
        return left


async def _our_pragmas(connection: SqlConnection) -> dict[str, Any]:
    if connection.dialect_name == "postgresql":
        commit = (await connection.execute(sa.text("SHOW synchronous_commit"))).scalar()
        return {"synchronous_commit": commit}
    if connection.dialect_name != "sqlite":
        return {}
    journal = (await connection.execute(sa.text("PRAGMA journal_mode"))).scalar()
    synchronous = (await connection.execute(sa.text("PRAGMA synchronous"))).scalar()
    return {"journal_mode": journal, "synchronous": SYNCHRONOUS.get(synchronous, synchronous)}


SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class Floor(Contestant):
    """The stores used directly, through the engine's own stores: lease acquire, one
    `save_result_if_absent` per step, lease finish."""

    name = FLOOR

    def __init__(self, ours: Ours, run_id: str) -> None:
        app = ours.engine.app
        assert app is not None
        self.leases = app.store(ExecutionLeaseRepository)
        self.effects: FencedEffectRepository[JsonValue] = app.store(FencedEffectRepository)
        self.run_id = run_id
        self.ours = ours
        self.counter = ours.counter
        self.settings = {"as": "lease acquire, save_result_if_absent per step, lease finish"}
        self.unended = 0

    async def run_one(self, index: int, steps: int) -> None:
        execution_id = f"floor-{self.run_id}-{index}-{steps}"
        lease = await self.leases.acquire(TENANT, execution_id, 30_000)
        assert lease is not None
        total = 0
        for step in range(steps):
            context = ExecutionContext(
                TENANT,
                execution_id,
                execution_id,
                lease,
                StepRef(execution_id, f"add#{step}", "add"),
            )
            output = await add_one(total)

            async def work(_tx: Any, value: int = output) -> JsonValue:
                return {"v": value}

            stored = await self.effects.save_result_if_absent(
                fenced_effect_key_of(context, "wf.step"), work
            )
            assert isinstance(stored.value, dict)
            total = int(stored.value["v"])
        if not await self.leases.finish(lease):
            self.unended += 1

    async def unfinished(self) -> int:
        return self.unended

    def count_on(self) -> None:
        self.ours.count_on()

    def count_off(self) -> None:
        self.ours.count_off()


class Dbos(Contestant):
    """DBOS Transact: `@DBOS.workflow()` of `@DBOS.step()` calls, on its system database."""

    name = DBOS_NAME

    def __init__(self, url: str, run_id: str) -> None:
        self.url = url
        self.run_id = run_id
        self.counter = Counter()
        self.settings = {}
        self.handles: list[Any] = []
        self.raw: list[sqlite3.Connection] = []
        """DBOS's SQLite connections, traced while counting."""
        self.tracing = False

    def launch(self) -> None:
        from dbos import DBOS

        self.DBOS = DBOS

        @DBOS.step()
        async def dbos_add_one(n: int) -> int:
            return await add_one(n)

        @DBOS.workflow()
        async def dbos_flow(steps: int) -> int:
            total = 0
            for _ in range(steps):
                total = await dbos_add_one(total)
            return total

        self.flow = dbos_flow
        config: dict[str, Any] = {
            "name": "agboss-workflow-bench",
            "system_database_url": self.url,
            "log_level": "WARNING",
        }
        path = _sqlite_path(self.url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            config["system_database_engine"] = self._sqlite_engine()
        instance = DBOS(config=config)
        DBOS.launch()
        engine = self.engine = instance._sys_db.engine
        with engine.connect() as connection:
            if path is not None:
                journal = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
                synchronous = connection.exec_driver_sql("PRAGMA synchronous").scalar()
                self.settings = {
                    "journal_mode": journal,
                    "synchronous": SYNCHRONOUS.get(synchronous, synchronous),
                }
            else:
                commit = connection.exec_driver_sql("SHOW synchronous_commit").scalar()
                self.settings = {"synchronous_commit": commit}
        self.settings |= {
            "dbos": _version("dbos"),
            "system_database": sa.make_url(self.url).render_as_string(hide_password=True),
            "pool_size": engine.pool.size() if hasattr(engine.pool, "size") else None,
        }

    def _sqlite_engine(self) -> sa.Engine:
        """DBOS's own SQLite engine (its pool, `BEGIN IMMEDIATE`, busy timeout, foreign keys:
        `dbos._sys_db_sqlite`) in WAL with `synchronous=NORMAL`, as ours runs; each
        connection kept, for SQLite's trace of its statements while counting."""
        engine = sa.create_engine(
            self.url, pool_timeout=30, max_overflow=0, pool_size=20, pool_pre_ping=True
        )

        @sa.event.listens_for(engine, "connect")
        def on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
            dbapi_conn.isolation_level = "IMMEDIATE"
            dbapi_conn.execute("PRAGMA busy_timeout=30000")
            dbapi_conn.execute("PRAGMA foreign_keys=ON")
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=NORMAL")
            self.raw.append(dbapi_conn)
            if self.tracing:
                dbapi_conn.set_trace_callback(self.counter.statement)

        return engine

    def count_on(self) -> None:
        if _sqlite_path(self.url) is None:
            self._stop_counting = count_dbos_server(self.engine, self.counter)
            return
        self.tracing = True
        for raw in self.raw:
            raw.set_trace_callback(self.counter.statement)

    def count_off(self) -> None:
        if _sqlite_path(self.url) is None:
            self._stop_counting()
            return
        self.tracing = False
        for raw in self.raw:
            raw.set_trace_callback(None)

    async def run_one(self, index: int, steps: int) -> None:
        handle = await self.DBOS.start_workflow_async(self.flow, steps)
        result = await handle.get_result()
        if result != steps:
            raise AssertionError(f"{handle.get_workflow_id()} answered {result!r}, not {steps}")
        self.handles.append(handle)

    async def unfinished(self) -> int:
        left = 0
        for handle in self.handles:
            status = await handle.get_status()
            left += status.status != "SUCCESS"
        return left

    def close(self) -> None:
        self.DBOS.destroy()


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def dbos_installed() -> bool:
    return importlib.util.find_spec("dbos") is not None


# -- running ---------------------------------------------------------------------------------


@dataclass
class Measurement:
    database: str
    contestant: str
    concurrency: int
    steps: int
    workflows: int
    seconds: float
    workflows_per_s: float
    steps_per_s: float
    ms_per_workflow: float
    cpu_ms_per_workflow: float
    """This process's CPU time (every thread) per workflow while the contestant ran."""
    slice_ms: list[float] = field(default_factory=list)
    """ms per workflow in each slice, in the order the slices ran."""


@dataclass
class Tally:
    workflows: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    slice_ms: list[float] = field(default_factory=list)


async def drive(
    contestant: Contestant, first: int, count: int, concurrency: int, steps: int
) -> tuple[float, float]:
    """Run `count` workflows, `concurrency` in flight; the seconds they took, and the
    process's CPU seconds meanwhile."""
    numbers = iter(range(first, first + count))

    async def worker() -> None:
        for index in numbers:
            await contestant.run_one(index, steps)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    await contestant.settle()
    return time.perf_counter() - started, time.process_time() - cpu


def slices(total: int, rounds: int) -> list[int]:
    base, extra = divmod(total, max(1, rounds))
    return [base + (1 if i < extra else 0) for i in range(max(1, rounds)) if base or i < extra]


def rotated(items: list[Contestant], turn: int) -> list[Contestant]:
    start = turn % len(items) if items else 0
    return items[start:] + items[:start]


async def measure(
    contestants: list[Contestant],
    database: str,
    workflows: int,
    steps: int,
    concurrency: int,
    rounds: int,
    numbering: Iterator[int],
) -> list[Measurement]:
    for contestant in contestants:
        await drive(contestant, next(numbering) * 1000, WARMUP, concurrency, steps)
    tallies = {c.name: Tally() for c in contestants}
    for turn, size in enumerate(slices(workflows, rounds)):
        for contestant in rotated(contestants, turn):
            spent, cpu = await drive(contestant, next(numbering) * 1000, size, concurrency, steps)
            tally = tallies[contestant.name]
            tally.workflows += size
            tally.seconds += spent
            tally.cpu_seconds += cpu
            tally.slice_ms.append(round(spent * 1000 / size, 3))
    return [
        Measurement(
            database=database,
            contestant=name,
            concurrency=concurrency,
            steps=steps,
            workflows=t.workflows,
            seconds=round(t.seconds, 4),
            workflows_per_s=round(t.workflows / t.seconds, 2),
            steps_per_s=round(t.workflows * steps / t.seconds, 1),
            ms_per_workflow=round(t.seconds * 1000 / t.workflows, 3),
            cpu_ms_per_workflow=round(t.cpu_seconds * 1000 / t.workflows, 3),
            slice_ms=t.slice_ms,
        )
        for name, t in tallies.items()
    ]


async def count_statements(
    contestant: Contestant, steps: int, numbering: Iterator[int]
) -> dict[str, Any]:
    """Statements per workflow of `steps` steps and of one, one workflow at a time: per
    workflow, and per step added (what the whole `steps`-step workflow sends over one)."""
    counter = contestant.counter
    sent: dict[int, float] = {}
    commits: dict[int, float] = {}
    for length in sorted({steps, 1}):
        counter.reset()
        contestant.count_on()
        token = COUNTING.set(True)
        try:
            await drive(contestant, next(numbering) * 1000, COUNTED, 1, length)
        finally:
            COUNTING.reset(token)
            contestant.count_off()
        sent[length] = counter.statements / COUNTED
        commits[length] = counter.commits / COUNTED
    added = max(1, steps - 1)
    return {
        "contestant": contestant.name,
        "steps": steps,
        "per_workflow": round(sent[steps], 2),
        "per_step": round(sent[steps] / steps, 2),
        "per_added_step": round((sent[steps] - sent[1]) / added, 2),
        "per_one_step_workflow": round(sent[1], 2),
        "commits_per_workflow": round(commits[steps], 2),
        "commits_per_added_step": round((commits[steps] - commits[1]) / added, 2),
    }


def prepare(url: str) -> None:
    path = _sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    upgrade(url)


async def benchmark(
    url: str,
    dbos_url: str | None,
    workflows: int,
    steps: int,
    concurrencies: list[int],
    rounds: int,
    floor: bool,
    with_dbos: bool,
) -> tuple[list[Measurement], list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The measurements, the statement counts, each contestant's settings, and notes."""
    notes: list[str] = []
    await asyncio.to_thread(prepare, url)
    run_id = uuid.uuid4().hex[:8]
    ours = Ours(url, run_id, max(8, *concurrencies))
    await ours.open()
    database = ours.connection.dialect_name
    contestants: list[Contestant] = [ours]
    if floor:
        contestants.append(Floor(ours, run_id))
    theirs: Dbos | None = None
    if with_dbos and dbos_installed():
        theirs = Dbos(dbos_url or derived_dbos_url(url), run_id)
        theirs.launch()
        contestants.append(theirs)
    elif with_dbos:
        notes.append("dbos: not measured (the dbos package is not installed)")
    numbering = itertools.count(1)
    measurements: list[Measurement] = []
    counts: list[dict[str, Any]] = []
    try:
        for concurrency in concurrencies:
            measurements += await measure(
                contestants, database, workflows, steps, concurrency, rounds, numbering
            )
        for contestant in contestants:
            counts.append(
                {"database": database, **await count_statements(contestant, steps, numbering)}
            )
        for contestant in contestants:
            left = await contestant.unfinished()
            if left:
                raise AssertionError(f"{contestant.name}: {left} workflows did not succeed")
        settings = [{"database": database, "contestant": c.name, **c.settings} for c in contestants]
    finally:
        if theirs is not None:
            theirs.close()
        await ours.close()
    return measurements, counts, settings, notes


def report(
    measurements: list[Measurement],
    counts: list[dict[str, Any]],
    settings: list[dict[str, Any]],
    notes: list[str],
    *,
    as_json: bool,
) -> None:
    by = {(m.concurrency, m.contestant): m for m in measurements}
    header = (
        f"{'database':<10} {'conc':>4} {'contestant':<10} {'wf/s':>9} {'steps/s':>9} "
        f"{'ms/wf':>9} {'cpu ms/wf':>9} {'ours/dbos':>10}"
    )
    print(header)
    print("-" * len(header))
    comparisons: list[dict[str, Any]] = []
    for m in measurements:
        ratio = ""
        theirs = by.get((m.concurrency, DBOS_NAME))
        if theirs is not None and m.contestant != DBOS_NAME:
            value = m.workflows_per_s / theirs.workflows_per_s
            ratio = f"{value:.2f}x"
            if m.contestant == ENGINE:
                target = TARGETS.get(m.database)
                comparisons.append(
                    {
                        "kind": "comparison",
                        "database": m.database,
                        "concurrency": m.concurrency,
                        "ours_workflows_per_s": m.workflows_per_s,
                        "dbos_workflows_per_s": theirs.workflows_per_s,
                        "ratio": round(value, 2),
                        "target": target,
                        "met": target is not None and value >= target,
                    }
                )
        print(
            f"{m.database:<10} {m.concurrency:>4} {m.contestant:<10} {m.workflows_per_s:>9.1f} "
            f"{m.steps_per_s:>9.1f} {m.ms_per_workflow:>9.3f} {m.cpu_ms_per_workflow:>9.3f} "
            f"{ratio:>10}"
        )
    print()
    for c in counts:
        print(
            f"statements, {c['contestant']}: {c['per_workflow']} per workflow of {c['steps']} "
            f"steps ({c['per_step']} per step), {c['per_added_step']} per added step, "
            f"{c['per_one_step_workflow']} for a one-step workflow; durable commits: "
            f"{c['commits_per_workflow']} per workflow, {c['commits_per_added_step']} per added step"
        )
    for s in settings:
        shown = ", ".join(f"{k}={v}" for k, v in s.items() if k not in ("database", "contestant"))
        print(f"settings, {s['contestant']}: {shown}")
    for note in notes:
        print(f"# {note}", file=sys.stderr)
    if as_json:
        for m in measurements:
            print(json.dumps({"kind": "measurement", **asdict(m)}))
        for comparison in comparisons:
            print(json.dumps(comparison))
        for c in counts:
            print(json.dumps({"kind": "statements", **c}))
        for s in settings:
            print(json.dumps({"kind": "settings", **s}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="our database: sqlite:///… or postgresql://…")
    parser.add_argument(
        "--dbos-url",
        help="DBOS's system database (default: beside ours: <file>_dbos.sqlite, <db>_dbos)",
    )
    parser.add_argument("--workflows", type=int, default=200, help="per contestant and concurrency")
    parser.add_argument("--steps", type=int, default=10, help="steps per workflow")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 10], help="workflows in flight"
    )
    parser.add_argument(
        "--rounds", type=int, default=10, help="slices the contestants take turns in"
    )
    parser.add_argument("--floor", action="store_true", help="also run the stores directly")
    parser.add_argument("--no-dbos", action="store_true", help="leave DBOS out")
    parser.add_argument("--json", action="store_true", help="also print JSON lines")
    args = parser.parse_args()
    if args.workflows <= 0 or args.steps <= 0 or min(args.concurrency) <= 0:
        parser.error("--workflows, --steps and --concurrency must be positive")
    logging.getLogger("dbos").setLevel(logging.WARNING)
    results = asyncio.run(
        benchmark(
            args.url,
            args.dbos_url,
            args.workflows,
            args.steps,
            args.concurrency,
            args.rounds,
            args.floor,
            not args.no_dbos,
        )
    )
    report(*results, as_json=args.json)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
