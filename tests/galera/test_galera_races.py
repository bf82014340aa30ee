"""The promises that a multi-primary Galera cluster tests hardest, with instances connected
to different nodes (`AGBOSS_GALERA_URLS`, see conftest.py).

On Galera, row locks are local to a node, an `UPDATE` that changes nothing is invisible to
certification, a node may read before it has applied what another node committed, and
`GET_LOCK` is local too. Each test here races instances spread over the nodes:

- concurrent takes of one lease: exactly one winner, every round;
- a zombie's fenced write after a takeover on another node, while the zombie's node has
  the takeover queued in its applier and the zombie's clock is behind: refused;
- the last children of a parent finished on different nodes: exactly one finisher sees
  none left;
- children claimed on different nodes: each claimed once;
- rate limit slots taken on different nodes: never more than the maximum;
- `upgrade` run on two nodes at once: both succeed, the schema at head.

Applier lag is induced on the zombie's node only: a session there with `wsrep_on=OFF`
(its transactions are not replicated, and the applier waits for their row locks rather
than aborting them) holds a row of a probe table that the next replicated write set
updates, so every later write set queues behind it until that session rolls back.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pymysql
import sqlalchemy as sa

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionContext,
    ExecutionFencedError,
    ExecutionLease,
    FencedEffectKey,
    QueuedChild,
    StepRef,
    StoreClock,
    VirtualClock,
    fenced_effect_key_of,
)
from agboss_sql.lab.business import committed_business_rows, insert_business_row
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository
from agboss_sql.sql.rate_limits import SqlRateLimitRepository
from agboss_sql.sql.schema import execution_leases

TENANT = "tenant-1"
LEASE_MS = 30_000
START = 1_700_000_000_000
ROUNDS = int(os.environ.get("AGBOSS_GALERA_ROUNDS", "100"))
"""Rounds of each race (the galera tox env sets more)."""


def _raw(url: str, *, database: bool = True) -> pymysql.connections.Connection[Any]:
    parsed = sa.make_url(url)
    return pymysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        database=parsed.database if database else None,
        autocommit=True,
    )


def _query(url: str, sql: str, *, stale_ok: bool = False) -> list[Any]:
    """Rows of `sql` on the node at `url`; with `stale_ok`, without waiting for the node to
    apply what other nodes committed (`wsrep_sync_wait = 0`), else after it did."""
    connection = _raw(url)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SET SESSION wsrep_sync_wait = {0 if stale_ok else 1}")
            cursor.execute(sql)
            return list(cursor.fetchall())
    finally:
        connection.close()


@contextmanager
def applier_held(urls: list[str], lagging: int) -> Iterator[Callable[[], None]]:
    """Hold the applier of node `lagging` (see the module docstring): inside the block,
    what other nodes commit is certified but not yet applied there. Yields a function
    that lets the applier go (also called on exit)."""
    setup = _raw(urls[0])
    with setup.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS galera_probe (id INT PRIMARY KEY, v INT)")
        cursor.execute("INSERT IGNORE INTO galera_probe VALUES (1, 0)")
    setup.close()
    _query(urls[lagging], "SELECT v FROM galera_probe WHERE id = 1")  # applied there too
    holder = _raw(urls[lagging])
    released = False
    with holder.cursor() as cursor:
        cursor.execute("SET SESSION wsrep_on = OFF")
        cursor.execute("BEGIN")
        cursor.execute("SELECT v FROM galera_probe WHERE id = 1 FOR UPDATE")
    other = _raw(urls[0])
    with other.cursor() as cursor:
        cursor.execute("UPDATE galera_probe SET v = v + 1 WHERE id = 1")
    other.close()

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            with holder.cursor() as cursor:
                cursor.execute("ROLLBACK")
            holder.close()

    try:
        yield release
    finally:
        release()


def _key(lease: ExecutionLease, step: str) -> FencedEffectKey:
    ctx = ExecutionContext(
        tenant_id=lease.tenant_id,
        root_execution_id=lease.execution_id,
        execution_id=lease.execution_id,
        lease=lease,
        step=StepRef(lease.execution_id, step, "charge-step"),
    )
    return fenced_effect_key_of(ctx, "charge")


class Charge:
    def __init__(self, row: str) -> None:
        self.row = row

    async def __call__(self, tx: Any) -> Any:
        await insert_business_row(tx, self.row)
        return {"row": self.row.split("-", 1)[1]}


# --- leases -------------------------------------------------------------------------------


async def test_concurrent_takes_split_across_nodes_have_exactly_one_winner(
    nodes: Callable[[int], SqlConnection],
) -> None:
    store_clock = StoreClock()  # each node's own clock
    stores = [
        SqlExecutionLeaseRepository(nodes(i), store_clock, ApplicationContext(f"racer-{i}"))
        for i in range(20)
    ]
    bad: list[tuple[int, int]] = []
    for round_ in range(ROUNDS):
        granted = await asyncio.gather(
            *(store.acquire(TENANT, f"tree-{round_}", LEASE_MS) for store in stores)
        )
        winners = [lease for lease in granted if lease is not None]
        if len(winners) != 1:
            bad.append((round_, len(winners)))
    assert bad == [], f"rounds (round, winners) without exactly one winner: {bad}"


async def test_a_zombie_write_after_a_takeover_on_another_node_is_refused(
    nodes: Callable[[int], SqlConnection], galera_urls: list[str]
) -> None:
    rounds = max(3, ROUNDS // 50)
    # The zombie's clock is behind the taker's: by its own clock its lease is still live.
    zombie_clock = StoreClock(VirtualClock(START))
    taker_clock = StoreClock(VirtualClock(START + 2 * LEASE_MS))
    zombie_node = nodes(1)
    zombie_leases = SqlExecutionLeaseRepository(
        zombie_node, zombie_clock, ApplicationContext("zombie")
    )
    zombie_effects = SqlFencedEffectRepository(
        zombie_node, zombie_clock, ApplicationContext("zombie")
    )
    taker_leases = SqlExecutionLeaseRepository(nodes(0), taker_clock, ApplicationContext("taker"))
    accepted: list[int] = []
    for round_ in range(rounds):
        execution = f"tree-{round_}"
        lease = await zombie_leases.acquire(TENANT, execution, LEASE_MS)
        assert lease is not None
        # Written once at its epoch: the mark is already at the zombie's token.
        await zombie_effects.save_result_if_absent(_key(lease, "step-1"), Charge(f"{round_}-a"))
        with applier_held(galera_urls, 1) as release:
            taken = await taker_leases.acquire(TENANT, execution, LEASE_MS)
            assert taken is not None and taken.lease_epoch == 2
            stale = _query(
                galera_urls[1],
                f"SELECT lease_epoch FROM {execution_leases.name} WHERE execution_id = '{execution}'",
                stale_ok=True,
            )
            assert stale == [(1,)], "the zombie's node applied the takeover: no lag induced"
            zombie = asyncio.create_task(
                zombie_effects.save_result_if_absent(_key(lease, "step-2"), Charge(f"{round_}-z"))
            )
            # Bounded: the zombie's write ends (or waits for the applier) on its own.
            await asyncio.wait([zombie], timeout=0.5)
            release()
            try:
                await zombie
            except ExecutionFencedError:
                pass
            else:
                accepted.append(round_)
    rows = await committed_business_rows(nodes(0))
    assert accepted == [], f"zombie writes accepted in rounds {accepted}; rows {rows}"
    assert not [row for row in rows if row.endswith("-z")]


async def test_one_business_key_raced_on_different_nodes_commits_one_charge(
    nodes: Callable[[int], SqlConnection],
) -> None:
    # The work may run on more than one node (certification aborts the losers after their
    # work ran, and their retry replays the winner's result): one charge commits.
    store_clock = StoreClock(VirtualClock(START))
    for round_ in range(max(3, ROUNDS // 100)):
        effects = []
        keys = []
        for i in range(9):
            connection = nodes(i)
            app = ApplicationContext(f"instance-{i}")
            lease = await SqlExecutionLeaseRepository(connection, store_clock, app).acquire(
                TENANT, f"tree-{round_}-{i}", LEASE_MS
            )
            assert lease is not None
            ctx = ExecutionContext(
                tenant_id=TENANT,
                root_execution_id=lease.execution_id,
                execution_id=lease.execution_id,
                lease=lease,
                step=StepRef(lease.execution_id, "step-1", "charge-step"),
            )
            keys.append(fenced_effect_key_of(ctx, "charge", business_key=f"order-{round_}"))
            effects.append(SqlFencedEffectRepository(connection, store_clock, app))
        results = await asyncio.gather(
            *(
                store.save_result_if_absent(key, Charge(f"{round_}-by-{i}"))
                for i, (store, key) in enumerate(zip(effects, keys, strict=True))
            )
        )
        committed = [
            row for row in await committed_business_rows(nodes(0)) if row.startswith(f"{round_}-")
        ]
        assert len(committed) == 1, f"round {round_}: {committed}"
        assert {result.value["row"] for result in results} == {committed[0].split("-", 1)[1]}
        assert sum(1 for result in results if not result.replayed) == 1


# --- the child queue ------------------------------------------------------------------------


async def test_the_last_children_finished_on_different_nodes_wake_the_parent_once(
    nodes: Callable[[int], SqlConnection],
) -> None:
    clock = VirtualClock(START)
    queues = [
        SqlChildExecutionQueueRepository(nodes(i), clock, ApplicationContext(f"worker-{i}"))
        for i in range(8)
    ]
    bad: list[tuple[int, int]] = []
    for round_ in range(max(10, ROUNDS // 3)):
        parent = f"parent-{round_}"
        children = [f"{parent}-child-{i}" for i in range(8)]
        for child in children:
            await queues[0].enqueue(QueuedChild(TENANT, "root", parent, child, 1))
        claimed = [await queue.claim(f"worker-{i}") for i, queue in enumerate(queues)]
        assert all(c is not None for c in claimed)
        results = await asyncio.gather(
            *(
                queue.finish(c.child_execution_id, "done", attempt=c.attempt)
                for queue, c in zip(queues, claimed, strict=True)
                if c is not None
            )
        )
        assert all(result.finished for result in results)
        zeros = sum(1 for result in results if result.remaining == 0)
        if zeros != 1:
            bad.append((round_, zeros))
    assert bad == [], f"rounds (round, finishers that saw none left) not exactly one: {bad}"


async def test_children_claimed_on_different_nodes_are_each_claimed_once(
    nodes: Callable[[int], SqlConnection],
) -> None:
    clock = VirtualClock(START)
    queues = [
        SqlChildExecutionQueueRepository(nodes(i), clock, ApplicationContext(f"worker-{i}"))
        for i in range(8)
    ]
    total = 200
    for i in range(total):
        await queues[0].enqueue(QueuedChild(TENANT, "root", "parent", f"child-{i}", 1))

    async def drain(i: int) -> list[str]:
        got: list[str] = []
        while (child := await queues[i].claim(f"worker-{i}")) is not None:
            got.append(child.child_execution_id)
        return got

    claimed = [c for got in await asyncio.gather(*(drain(i) for i in range(8))) for c in got]
    assert sorted(claimed) == sorted(f"child-{i}" for i in range(total))


# --- rate limits --------------------------------------------------------------------------


async def test_slots_taken_on_different_nodes_never_exceed_the_maximum(
    nodes: Callable[[int], SqlConnection],
) -> None:
    clock = VirtualClock(START)
    stores = [
        SqlRateLimitRepository(nodes(i), StoreClock(clock), ApplicationContext(f"taker-{i}"))
        for i in range(12)
    ]
    bad: list[tuple[int, int]] = []
    for round_ in range(max(10, ROUNDS // 10)):
        taken = await asyncio.gather(
            *(
                store.acquire_slot(f"key-{round_}", f"holder-{i}", 3, LEASE_MS)
                for i, store in enumerate(stores)
            )
        )
        if sum(taken) != 3:
            bad.append((round_, sum(taken)))
    assert bad == [], f"rounds (round, slots taken of 3) : {bad}"


# --- migrations ---------------------------------------------------------------------------


def test_concurrent_upgrades_on_two_nodes_both_succeed(
    galera_urls: list[str], tmp_path: pathlib.Path
) -> None:
    database = "agboss_galera_migrate"
    admin = _raw(galera_urls[0], database=False)
    urls = [
        sa.make_url(url).set(database=database).render_as_string(hide_password=False)
        for url in galera_urls
    ]
    for round_ in range(3):
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {database}")
            cursor.execute(f"CREATE DATABASE {database} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        for url in galera_urls:
            # Wait until every node has applied the CREATE DATABASE (a connection naming a
            # database checks it before any causal wait could run).
            node = _raw(url, database=False)
            with node.cursor() as cursor:
                cursor.execute("SET SESSION wsrep_sync_wait = 1")
                cursor.execute(
                    "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
                    (database,),
                )
                assert cursor.fetchone() == (1,)
            node.close()
        # Two processes, as two instances starting at once (Alembic's context is global
        # to a process). Each waits for a start file, so both begin together.
        go = tmp_path / f"go-{round_}"
        script = (
            "import pathlib, sys, time\n"
            "from agboss_sql.sql import migrate\n"
            "deadline = time.monotonic() + 60\n"
            "while not pathlib.Path(sys.argv[2]).exists() and time.monotonic() < deadline:\n"
            "    time.sleep(0.001)\n"
            "migrate.upgrade(sys.argv[1])\n"
        )
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", script, url, str(go)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for url in urls[:2]
        ]
        go.touch()
        outcomes = [(worker.wait(timeout=600), worker.stderr) for worker in workers]
        failures = [stream.read() if stream else "" for code, stream in outcomes if code != 0]
        assert failures == [], f"round {round_}: " + "\n".join(failures)[-3000:]
        for url in urls:
            assert migrate.current(url) == migrate.head()
    with admin.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {database}")
    admin.close()


async def test_the_lease_row_is_one_row_on_every_node(
    nodes: Callable[[int], SqlConnection], galera_urls: list[str]
) -> None:
    # Sanity of the harness: a take on node 1 is read on every node once applied.
    leases = SqlExecutionLeaseRepository(nodes(0), StoreClock(), ApplicationContext("one"))
    assert await leases.acquire(TENANT, "tree-x", LEASE_MS) is not None
    for url in galera_urls:
        rows = _query(url, f"SELECT holder_instance_id FROM {execution_leases.name}")
        assert rows == [("one",)]
