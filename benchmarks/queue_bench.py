"""The child queue's drain and enqueue, beside the raw driver's floor and (PostgreSQL) the
peers pgqueuer and procrastinate.

    python benchmarks/queue_bench.py --url postgresql://postgres@127.0.0.1:5432/bench --floor --peers
    python benchmarks/queue_bench.py --url mysql://root@127.0.0.1:3306/bench --floor
    tox -e bench-queue            # the three databases; the peers installed there only
    python benchmarks/queue_bench.py --url URL --scale 1000 100000 --workers 8   # scale check
    python benchmarks/queue_bench.py --url URL --latency 1000    # enqueue to claim, idle worker

A drain is what workers of a fan-out do: `--children` no-op children are queued (one
`enqueue_many`, timed apart: the enqueue's jobs/s), then `workers` claimers, each on a
connection of its own, loop `claim_many(10)` then `finish_many` of those children, each at
its attempt (one transaction per batch; with `--single-finish` also one `finish` per child,
to compare), until the queue is empty (`agboss_sql.lab._bench_queue`). Two shapes: every child under one parent
(a fan-out) and one parent per child. With `--floor`, the same drains by raw driver
connections sending the same statements. With `--peers`, on PostgreSQL: pgqueuer at its
defaults (a `QueueManager` per worker on a psycopg connection of its own, batches of 10,
buffered acknowledgements, drain mode) and procrastinate (one worker of concurrency
`workers`, LISTEN/NOTIFY), each draining the same number of no-op jobs enqueued by its batch
API; their tables live beside ours (`pgqueuer*`, `procrastinate_*`). Everything takes turns
in each of `--rounds` rounds, so the machine's load falls on all alike; ratios are taken
per round, then their median.

Prints a table, then one JSON line per measurement and one per ratio, each with its target
where the project sets one: one parent within 1.2x of one parent per child (>= 0.833), ours
>= 0.7 of the floor, >= 1.0 of pgqueuer's drain and >= 3.0 of procrastinate's, enqueue >= 1.0
of both.

What each guarantees that the others do not: ours finishes a job only at its claimed
attempt (a claimer superseded by a rescue cannot finish it: fenced finish) and wakes the
parent exactly once, in the finish's transaction (the count on the parent's row);
pgqueuer acknowledges in buffered batches (a crash loses the acknowledgements not yet
flushed: those jobs run again) and has no parent; procrastinate has no parent either, and
retries by its own policy.

The agboss tables are emptied before each drain: run it on a database of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from agboss_sql.lab._bench_queue import SHAPES, Drained, drain_floor, drain_ours, fill
from agboss_sql.lab._bench_scale import fresh_tables
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection

TARGETS = {
    "one parent / parent per child": 1 / 1.2,
    "ours / floor": 0.7,
    "ours / pgqueuer": 1.0,
    "ours / procrastinate": 3.0,
    "enqueue ours / pgqueuer": 1.0,
    "enqueue ours / procrastinate": 1.0,
}


@dataclass
class Series:
    """One implementation's drains (or enqueues) at one worker count, round by round."""

    what: str
    workers: int
    rates: list[float] = field(default_factory=list)
    statements: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


# --- the peers (PostgreSQL) --------------------------------------------------------------


def _libpq(url: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return (
        f"host={u.host} port={u.port or 5432} user={u.username or 'postgres'} dbname={u.database}"
    )


async def pgqueuer_round(url: str, count: int, workers: int) -> tuple[float, float]:
    """pgqueuer at its defaults: `count` no-op jobs enqueued in one batch, drained by
    `workers` queue managers: (enqueue jobs/s, drain jobs/s)."""
    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    conninfo = _libpq(url)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as admin:
        queries = Queries(PsycopgDriver(admin))
        if not await queries.has_table("pgqueuer"):
            await queries.install()
        await admin.execute("TRUNCATE pgqueuer, pgqueuer_log")
        began = time.perf_counter()
        await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        enqueue = count / (time.perf_counter() - began)
    done: list[int] = []
    last: list[float] = []
    connections = [
        await psycopg.AsyncConnection.connect(conninfo, autocommit=True) for _ in range(workers)
    ]
    managers = []
    for c in connections:
        manager = QueueManager(Queries(PsycopgDriver(c)))

        @manager.entrypoint("noop")
        async def noop(job: Any) -> None:
            done.append(1)
            if len(done) == count:
                last.append(time.perf_counter())

        managers.append(manager)
    try:
        began = time.perf_counter()
        # Timed to the last job's run (its buffered acknowledgement may come later); drain
        # mode then stops each manager once the queue is empty.
        await asyncio.gather(
            *(
                m.run(dequeue_timeout=timedelta(seconds=1), mode=QueueExecutionMode.drain)
                for m in managers
            )
        )
        drain = count / (last[0] - began)
    finally:
        for c in connections:
            await c.close()
    if len(done) != count:
        raise AssertionError(f"pgqueuer ran {len(done)} of {count} jobs")
    return enqueue, drain


async def procrastinate_round(url: str, count: int, workers: int) -> tuple[float, float]:
    """procrastinate: `count` no-op jobs deferred in one batch, drained by one worker of
    concurrency `workers` that stops once the queue is empty: (enqueue jobs/s, drain jobs/s)."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=_libpq(url)))
    done: list[int] = []
    last: list[float] = []

    @app.task(name="noop")
    async def noop() -> None:
        done.append(1)
        if len(done) == count:
            last.append(time.perf_counter())

    async with app.open_async():
        connector: Any = app.connector
        exists = await connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS present"
        )
        if not exists["present"]:
            await app.schema_manager.apply_schema_async()
        await connector.execute_query_async(
            "TRUNCATE procrastinate_jobs, procrastinate_events CASCADE"
        )
        began = time.perf_counter()
        await noop.batch_defer_async(*({} for _ in range(count)))
        enqueue = count / (time.perf_counter() - began)
        began = time.perf_counter()
        await app.run_worker_async(
            concurrency=workers, wait=False, install_signal_handlers=False, delete_jobs="always"
        )
        drain = count / (last[0] - began)  # to the last job's run
    if len(done) != count:
        raise AssertionError(f"procrastinate ran {len(done)} of {count} jobs")
    return enqueue, drain


# --- the run ------------------------------------------------------------------------------


async def run(
    url: str,
    children: int,
    workers: list[int],
    rounds: int,
    floor: bool,
    peers: bool,
    single: bool = False,
) -> dict[tuple[str, int], Series]:
    migrate.upgrade(url)
    connection = SqlConnection(url)
    await connection.ping()
    measured: dict[tuple[str, int], Series] = {}

    def series(what: str, w: int) -> Series:
        return measured.setdefault((what, w), Series(what, w))

    def add(what: str, w: int, drained: Drained) -> None:
        s = series(what, w)
        s.rates.append(round(drained.jobs_per_s, 1))
        s.statements.append(round(drained.statements_per_job, 2))
        print(f"  {what} x{w}: {drained.jobs_per_s:.1f} jobs/s", file=sys.stderr, flush=True)

    try:
        for _ in range(rounds):
            # A fan-out's enqueue: its children under one parent, in one enqueue_many.
            series("enqueue ours", 0).rates.append(
                round(await fill(connection, SHAPES[0], children), 1)
            )
            for w in workers:
                for shape in SHAPES:
                    drained = await drain_ours(url, connection, shape, children, w)
                    add(f"ours, {shape}", w, drained)
                    if shape == SHAPES[0]:
                        # The fill before each fan-out drain is an enqueue too: as many of
                        # ours as of the peers' (one per worker count), interleaved.
                        enqueues = series("enqueue ours", 0).rates
                        enqueues.append(round(drained.enqueue_per_s, 1))
                    if single:
                        one_by_one = await drain_ours(
                            url, connection, shape, children, w, batch_finish=False
                        )
                        add(f"ours 1-by-1, {shape}", w, one_by_one)
                    if floor:
                        add(f"floor, {shape}", w, await drain_floor(connection, shape, children, w))
                if peers:
                    for peer, peer_round in (
                        ("pgqueuer", pgqueuer_round),
                        ("procrastinate", procrastinate_round),
                    ):
                        enqueue, drain = await peer_round(url, children, w)
                        series(f"enqueue {peer}", 0).rates.append(round(enqueue, 1))
                        series(peer, w).rates.append(round(drain, 1))
                        print(f"  {peer} x{w}: {drain:.1f} jobs/s", file=sys.stderr, flush=True)
        await fresh_tables(connection)
    finally:
        await connection.close()
    return measured


def ratios(measured: dict[tuple[str, int], Series], workers: list[int]) -> list[dict[str, Any]]:
    """Each ratio the project sets a target for, per round then its median."""
    out: list[dict[str, Any]] = []

    def ratio(name: str, w: int, top: Series | None, bottom: Series | None, **facts: Any) -> None:
        if top is None or bottom is None or not top.rates or not bottom.rates:
            return
        per_round = [t / b for t, b in zip(top.rates, bottom.rates, strict=False) if b]
        median = statistics.median(per_round)
        target = TARGETS[name]
        out.append(
            {
                "kind": "ratio",
                "ratio": name,
                "workers": w,
                **facts,
                "per_round": [round(r, 3) for r in per_round],
                "median": round(median, 3),
                "target": round(target, 3),
                "verdict": "pass" if median >= target else "short",
            }
        )

    get = measured.get
    for w in workers:
        ratio(
            "one parent / parent per child",
            w,
            get((f"ours, {SHAPES[0]}", w)),
            get((f"ours, {SHAPES[1]}", w)),
        )
        for shape in SHAPES:
            ours = get((f"ours, {shape}", w))
            ratio("ours / floor", w, ours, get((f"floor, {shape}", w)), shape=shape)
            ratio("ours / pgqueuer", w, ours, get(("pgqueuer", w)), shape=shape)
            ratio("ours / procrastinate", w, ours, get(("procrastinate", w)), shape=shape)
    enqueue = get(("enqueue ours", 0))
    for peer in ("pgqueuer", "procrastinate"):
        theirs = get((f"enqueue {peer}", 0))
        if enqueue is not None and theirs is not None:
            # Ours ran 1 + one per worker count a round, the peers' one per worker count:
            # compare medians.
            top = Series("", 0, [enqueue.median])
            ratio(f"enqueue ours / {peer}", 0, top, Series("", 0, [theirs.median]))
    return out


async def scale(url: str, small: int, big: int, workers: int) -> dict[str, Any]:
    """The scale check: one parent's `small` children, then its `big` children, each drained
    by `workers` claimers; every child finished once (the drains check it), the parent owed
    its wake once (exactly one finish saw none left), and the big drain's rate within 1.5x
    of the small one's."""
    migrate.upgrade(url)
    connection = SqlConnection(url)
    await connection.ping()
    try:
        drains = {}
        for count in (small, big):
            began = time.perf_counter()
            drained = await drain_ours(url, connection, SHAPES[0], count, workers)
            drains[count] = (drained, time.perf_counter() - began)
        await fresh_tables(connection)
    finally:
        await connection.close()
    (few, _), (many, took) = drains[small], drains[big]
    slowdown = few.jobs_per_s / many.jobs_per_s
    ok = slowdown <= 1.5 and few.none_left == 1 and many.none_left == 1
    return {
        "kind": "scale",
        "database": url.split(":", 1)[0],
        "workers": workers,
        "children": [small, big],
        "jobs_per_s": [round(few.jobs_per_s, 1), round(many.jobs_per_s, 1)],
        "statements_per_job": [round(few.statements_per_job, 2), round(many.statements_per_job, 2)],
        "parent_owed_its_wake": [few.none_left, many.none_left],
        "slowdown": round(slowdown, 3),
        "target": 1.5,
        "seconds_with_fill": round(took, 1),
        "verdict": "pass" if ok else "short",
    }


async def latency(url: str, samples: int, poll_ms: int) -> dict[str, Any]:
    """Enqueue to claim: an idle `ChildWorker` (started with `poll_ms`, so its naps have grown
    to `poll_ms`) on a connection of its own; each sample enqueues one child from another
    connection after the worker has been idle for 2 x `poll_ms`, and times until the
    worker's run of it starts."""
    import random

    from agboss_sql.contracts.clocks import StoreClock, SystemClock
    from agboss_sql.contracts.types import ApplicationContext, QueuedChild
    from agboss_sql.runtime import ChildWorker
    from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
    from agboss_sql.sql.leases import SqlExecutionLeaseRepository
    from agboss_sql.sql.queue import SqlChildExecutionQueueRepository

    migrate.upgrade(url)
    mine, theirs = SqlConnection(url), SqlConnection(url)
    await fresh_tables(theirs)
    app = ApplicationContext("worker")
    clock = SystemClock()
    queue = SqlChildExecutionQueueRepository(mine, clock, app)
    enqueuer = SqlChildExecutionQueueRepository(theirs, clock, ApplicationContext("api"))
    started: dict[str, float] = {}

    async def run_child(child: Any, _lease: Any) -> None:
        started[child.child_execution_id] = time.perf_counter()

    async def wake_parent(_tenant: str, _parent: str) -> None:
        pass

    worker = ChildWorker(
        queue,
        SqlExecutionLeaseRepository(mine, StoreClock(), app),
        SqlExecutionLeaseEventRepository(mine, StoreClock(), app),
        clock,
        run_child=run_child,
        wake_parent=wake_parent,
    )
    worker.start(poll_ms=poll_ms, rescue_every_ms=3_600_000)
    waits: list[float] = []
    try:
        for i in range(samples):
            await asyncio.sleep(2 * poll_ms / 1000 + random.random() * poll_ms / 1000)
            queued = time.perf_counter()
            await enqueuer.enqueue(QueuedChild("t", "root", f"p-{i}", f"c-{i}", 1))
            async with asyncio.timeout(10 + 2 * poll_ms / 1000):
                while f"c-{i}" not in started:
                    await asyncio.sleep(0.001)
            waits.append((started[f"c-{i}"] - queued) * 1000)
        listening = worker.listening
    finally:
        await worker.stop()
        await fresh_tables(theirs)
        await mine.close()
        await theirs.close()
    waits.sort()
    return {
        "kind": "latency",
        "database": url.split(":", 1)[0],
        "poll_ms": poll_ms,
        "notified": listening,
        "samples": samples,
        "enqueue_to_claim_ms": {
            "p50": round(statistics.median(waits), 1),
            "max": round(waits[-1], 1),
            "min": round(waits[0], 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--children", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--floor", action="store_true", help="the raw driver's drains too")
    parser.add_argument("--peers", action="store_true", help="pgqueuer and procrastinate too")
    parser.add_argument(
        "--single-finish",
        action="store_true",
        help="also our drains finishing one child per transaction (no finish_many)",
    )
    parser.add_argument(
        "--scale",
        type=int,
        nargs=2,
        metavar=("SMALL", "BIG"),
        help="the scale check instead: one parent's SMALL then BIG children (e.g. 1000 "
        "100000) drained by --workers' first count (e.g. 8)",
    )
    parser.add_argument(
        "--latency",
        type=int,
        metavar="POLL_MS",
        help="enqueue-to-claim latency instead: an idle worker polling every POLL_MS",
    )
    args = parser.parse_args()
    if args.latency:
        print(json.dumps(asyncio.run(latency(args.url, args.rounds * 4, args.latency))))
        return
    if args.scale:
        found = asyncio.run(scale(args.url, *args.scale, args.workers[0]))
        print(json.dumps(found))
        sys.exit(0 if found["verdict"] == "pass" else 1)
    measured = asyncio.run(
        run(
            args.url,
            args.children,
            args.workers,
            args.rounds,
            args.floor,
            args.peers,
            args.single_finish,
        )
    )
    database = args.url.split(":", 1)[0]
    print(f"{database}: {args.children} no-op jobs, {args.rounds} rounds")
    print(f"{'what':<28} {'workers':>7} {'jobs/s (median)':>16} {'stmts/job':>9}  rounds")
    for s in measured.values():
        stmts = f"{statistics.median(s.statements):.2f}" if s.statements else "-"
        print(f"{s.what:<28} {s.workers or '-':>7} {s.median:>16.1f} {stmts:>9}  {s.rates}")
    for s in measured.values():
        line = {"kind": "jobs", "database": database, "what": s.what, "workers": s.workers}
        print(
            json.dumps(
                {
                    **line,
                    "jobs_per_s": s.rates,
                    "median": s.median,
                    "statements_per_job": s.statements,
                }
            )
        )
    grouped: dict[str, list[str]] = defaultdict(list)
    for r in ratios(measured, args.workers):
        print(json.dumps({"database": database, **r}))
        grouped[r["verdict"]].append(f"{r['ratio']} x{r['workers']} {r.get('shape', '')}")
    print(f"short of target: {grouped['short'] or 'none'}", file=sys.stderr)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
