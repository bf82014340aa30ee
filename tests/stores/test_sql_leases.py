"""What only the SQL lease store shows, on the database under test: twenty real
connections racing one lease, expiry on the database's own clock, the statements each move
sends, arguments refused before any statement, and a lease closed by `lease_state_of`.

Every promise of `ExecutionLeaseRepository` (docs/contracts.md) is an `execution_lease` contract
case, run once on the SQL set (tests/stores/test_conformance_sql.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from support.capabilities import require, update_returning
from support.sql import lock_waits_sql

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionLease,
    InvalidIdentifierError,
    LeaseHolder,
    LeaseState,
    StoreClock,
    VirtualClock,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository

START = 1_700_000_000_000
LEASE_MS = 30_000
TENANT = "tenant-1"


class Instances:
    """Lease stores of several instances on one database, deciding by one store time."""

    def __init__(self, sql: SqlConnection, store_clock: StoreClock) -> None:
        self.sql = sql
        self.store_clock = store_clock

    def leases(
        self, instance: int = 1, connection: SqlConnection | None = None
    ) -> SqlExecutionLeaseRepository:
        return SqlExecutionLeaseRepository(
            connection or self.sql, self.store_clock, ApplicationContext(f"instance-{instance}")
        )

    def calls(self, instance: int = 1) -> SqlOutboundCallRepository:
        return SqlOutboundCallRepository(
            self.sql, self.store_clock, ApplicationContext(f"instance-{instance}")
        )


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


@pytest.fixture
def cluster(sql: SqlConnection, clock: VirtualClock) -> Instances:
    return Instances(sql, StoreClock(clock))


async def _acquire(
    cluster: Instances, instance: int = 1, execution: str = "tree-1"
) -> ExecutionLease:
    lease = await cluster.leases(instance).acquire(TENANT, execution, LEASE_MS)
    assert lease is not None
    return lease


async def test_a_lease_closed_by_lease_state_of_is_taken_over(
    cluster: Instances, clock: VirtualClock
) -> None:
    await _acquire(cluster)
    await clock.advance(LEASE_MS)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    taken = await _acquire(cluster, 2)
    assert taken.taken_over_from == LeaseHolder("instance-1", 1)


async def test_a_yielded_lease_closed_after_its_expiry_is_taken_over_too(
    cluster: Instances, clock: VirtualClock
) -> None:
    # As the in-memory store: a close by lease_state_of is an expiry, whatever came before.
    lease = await _acquire(cluster)
    assert await cluster.leases(1).yield_lease(lease)
    await clock.advance(LEASE_MS)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    taken = await _acquire(cluster, 2)
    assert taken.taken_over_from == LeaseHolder("instance-1", 1)


# concurrency: separate connections, as separate instances


async def _race_acquires(
    sql: SqlConnection,
    new_connection: Callable[[], SqlConnection],
    store_clock: StoreClock,
    execution: str,
) -> list[ExecutionLease]:
    stores = [
        SqlExecutionLeaseRepository(new_connection(), store_clock, ApplicationContext(f"racer-{i}"))
        for i in range(20)
    ]
    granted = await asyncio.gather(
        *(store.acquire(TENANT, execution, LEASE_MS) for store in stores)
    )
    return [lease for lease in granted if lease is not None]


@pytest.mark.parametrize("database_time", [False, True], ids=["virtual-time", "database-time"])
async def test_twenty_concurrent_acquires_of_a_free_lease_grant_exactly_one(
    sql: SqlConnection,
    new_connection: Callable[[], SqlConnection],
    clock: VirtualClock,
    database_time: bool,
) -> None:
    store_clock = StoreClock() if database_time else StoreClock(clock)
    for round_ in range(3):
        winners = await _race_acquires(sql, new_connection, store_clock, f"tree-{round_}")
        assert len(winners) == 1
        assert (winners[0].lease_epoch, winners[0].taken_over_from) == (1, None)


async def test_twenty_concurrent_takeovers_of_an_expired_lease_grant_exactly_one(
    sql: SqlConnection,
    new_connection: Callable[[], SqlConnection],
    clock: VirtualClock,
) -> None:
    store_clock = StoreClock(clock)
    first = SqlExecutionLeaseRepository(sql, store_clock, ApplicationContext("instance-0"))
    assert await first.acquire(TENANT, "tree-1", LEASE_MS) is not None
    await clock.advance(LEASE_MS)
    winners = await _race_acquires(sql, new_connection, store_clock, "tree-1")
    assert len(winners) == 1
    assert winners[0].lease_epoch == 2
    assert winners[0].taken_over_from == LeaseHolder("instance-0", 1)


async def test_twenty_concurrent_takeovers_on_database_time_grant_exactly_one(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    store_clock = StoreClock()
    first = SqlExecutionLeaseRepository(sql, store_clock, ApplicationContext("instance-0"))
    lease = await first.acquire(TENANT, "tree-1", 200)
    assert lease is not None
    await asyncio.sleep(0.3)
    winners = await _race_acquires(sql, new_connection, store_clock, "tree-1")
    assert len(winners) == 1
    assert winners[0].lease_epoch == 2
    assert winners[0].taken_over_from == LeaseHolder("instance-0", 1)
    assert await first.renew(lease, LEASE_MS) is None


# the database's own time


async def test_database_time_decides_expiry(sql: SqlConnection) -> None:
    one = SqlExecutionLeaseRepository(sql, StoreClock(), ApplicationContext("instance-1"))
    two = SqlExecutionLeaseRepository(sql, StoreClock(), ApplicationContext("instance-2"))
    lease = await one.acquire(TENANT, "tree-1", 60_000)
    assert lease is not None
    assert 59_000 <= lease.remaining_ms <= 60_000
    remaining = await one.renew(lease, 120_000)
    assert remaining is not None and 119_000 <= remaining <= 120_000
    # A shorter renewal never shortens, on the database's clock too.
    remaining = await one.renew(lease, 1_000)
    assert remaining is not None and remaining > 100_000
    assert await two.acquire(TENANT, "tree-1", 60_000) is None
    short = await one.acquire(TENANT, "tree-2", 150)
    assert short is not None
    await asyncio.sleep(0.25)
    assert await one.renew(short, 60_000) is None
    assert await one.yield_lease(short) is False
    taken = await two.acquire(TENANT, "tree-2", 60_000)
    assert taken is not None and taken.taken_over_from == LeaseHolder("instance-1", 1)


# statements


async def test_each_lease_move_sends_its_statements_and_no_more(
    cluster: Instances, sql: SqlConnection
) -> None:
    sent: list[str] = []
    remove = sql.add_statement_listener(lambda statement, _params: sent.append(statement))
    leases = cluster.leases(1)
    sent.clear()
    lease = await _acquire(cluster)
    take = len(sent)
    sent.clear()
    assert await leases.renew(lease, LEASE_MS) == LEASE_MS
    renew = len(sent)
    counts = {}
    for name, move in (
        ("yield", leases.yield_lease(lease)),
        ("reclaim", leases.reclaim(lease, LEASE_MS)),
    ):
        sent.clear()
        assert await move
        counts[name] = len(sent)
    back = await leases.acquire(TENANT, "tree-2", LEASE_MS)
    assert back is not None
    sent.clear()
    assert await leases.release(back)
    counts["release"] = len(sent)
    other = await _acquire(cluster, 1, "tree-3")
    sent.clear()
    assert await leases.finish(other)
    counts["finish"] = len(sent)
    sent.clear()
    assert await leases.save_execution_id_if_absent(TENANT, "run-1")
    counts["save_execution_id"] = len(sent)
    remove()
    # No UPDATE … RETURNING on MySQL/MariaDB: a renewal reads back what it wrote; MySQL 8
    # has no RETURNING at all, so its take does too (MariaDB's upsert returns).
    assert take == (1 if sql.capabilities.insert_returning else 2)
    assert renew == (1 if sql.capabilities.update_returning else 2)
    assert counts == {"yield": 1, "reclaim": 1, "release": 1, "finish": 1, "save_execution_id": 1}
    assert not any(s.strip().upper().startswith(("BEGIN", "COMMIT")) for s in sent)


async def test_a_renewal_whose_lease_moves_on_between_its_two_statements_answers_its_own_floor(
    cluster: Instances, sql: SqlConnection, sql_url: str, clock: VirtualClock
) -> None:
    # Where an UPDATE returns nothing (the MySQL family) a renewal is two statements, the
    # update and a read back, with no transaction around them. Between the two, the holder
    # releases the lease (its own stop racing its keeper) and another instance takes it
    # for ten times as long: the renewal answers its own floor, `lease_ms`, never the
    # other holder's time left.
    require(not update_returning(sql), "renewal in two statements (its UPDATE returns rows)")
    lease = await _acquire(cluster)
    taken: list[ExecutionLease | None] = []

    async def release_and_take_elsewhere() -> None:
        other = SqlConnection(sql_url)
        try:
            store_clock = StoreClock(clock)
            holder = SqlExecutionLeaseRepository(
                other, store_clock, ApplicationContext("instance-1")
            )
            assert await holder.release(lease)
            thief = SqlExecutionLeaseRepository(
                other, store_clock, ApplicationContext("instance-2")
            )
            taken.append(await thief.acquire(TENANT, lease.execution_id, 10 * LEASE_MS))
        finally:
            await other.close()

    seen: list[str] = []

    def between(statement: str, _params: object) -> None:
        seen.append(statement)
        if len(seen) == 2:
            # The read back is about to be sent: the other instances move now, on their own
            # connection and loop (this listener runs on the renewal's loop, which waits).
            mover = threading.Thread(target=asyncio.run, args=(release_and_take_elsewhere(),))
            mover.start()
            mover.join()

    remove = sql.add_statement_listener(between)
    try:
        answered = await cluster.leases(1).renew(lease, LEASE_MS)
    finally:
        remove()
    assert len(seen) == 2 and taken and taken[0] is not None
    assert taken[0].lease_epoch == lease.lease_epoch + 1
    assert answered == LEASE_MS


# arguments


@pytest.mark.parametrize("bad", ["", "x" * 256, None, 7])
async def test_identifiers_are_checked_before_any_statement(
    cluster: Instances, sql: SqlConnection, bad: object
) -> None:
    sent: list[str] = []
    remove = sql.add_statement_listener(lambda statement, _params: sent.append(statement))
    leases = cluster.leases(1)
    with pytest.raises(InvalidIdentifierError):
        await leases.acquire(bad, "tree-1", LEASE_MS)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        await leases.acquire(TENANT, bad, LEASE_MS)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        await leases.save_execution_id_if_absent(TENANT, bad)  # type: ignore[arg-type]
    remove()
    assert sent == []


async def test_a_take_that_waited_for_the_row_lock_reports_what_is_left_after_the_wait(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    """On the database's clock, a take that waits for another transaction's lock on the
    lease row reports the remaining ms from after the wait, not a full lease measured from
    before it. The holder keeps the lock until the take is seen waiting and at least
    `held_ms` have passed (a lower bound on the wait, whatever the machine's load), so the
    answer must be about `held_ms` short of the lease."""
    if not sql.capabilities.row_locks:
        pytest.skip("needs row locks: a SQLite take waits before its statement starts")
    if sql.capabilities.certified_writes:
        pytest.skip("a Galera node's row locks are its own: the holder and the take may be on two")
    import time

    import sqlalchemy as sa

    from agboss_sql.sql.schema import execution_leases

    held_ms = 300
    lease_ms = 60_000
    database_time = StoreClock()
    first = SqlExecutionLeaseRepository(sql, database_time, ApplicationContext("instance-1"))
    taker_connection = new_connection()
    taker = SqlExecutionLeaseRepository(
        taker_connection, database_time, ApplicationContext("instance-2")
    )
    lease = await first.acquire(TENANT, "tree-wait", 1)  # over at once: free to take
    assert lease is not None
    holder = new_connection()
    row = execution_leases.c
    async with holder.transaction() as tx:
        locked = await tx.execute(
            sa.select(row.lease_epoch)
            .where(row.tenant_id == TENANT, row.execution_id == "tree-wait")
            .with_for_update()
        )
        assert locked.scalar() == 1
        take = asyncio.create_task(taker.acquire(TENANT, "tree-wait", lease_ms))
        # The server says when the take waits for the lock (polled, bounded); from then on
        # the holder keeps the lock for at least `held_ms`.
        waiting = lock_waits_sql(sql, "INSERT INTO agboss_execution_leases")
        for _ in range(3_000):
            if (await sql.execute(waiting)).scalar():
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the take never waited for the row lock")
        held_since = time.monotonic()
        while time.monotonic() - held_since < held_ms / 1000:
            await asyncio.sleep(0.01)
        assert not take.done()
    taken = await asyncio.wait_for(take, 30)
    assert taken is not None and taken.lease_epoch == 2
    # 50 ms of slack: MariaDB reads the statement's time a little into the lock wait (it
    # reported 280-290 ms of a wait of at least 300 ms here); a take that ignored the wait
    # reports the whole lease.
    assert taken.remaining_ms <= lease_ms - held_ms + 50
