"""`SqlExecutionLeaseRepository` keeps every promise of SPEC 3.1 on the database under test.

Time is the store's: a `StoreClock(VirtualClock)` pins the boundaries to the
millisecond; `StoreClock()` runs the same races on the database's own clock.
Concurrent callers use separate `SqlConnection`s, as separate instances would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

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


# acquire


async def test_first_acquire_grants_epoch_one_for_the_whole_lease(cluster: Instances) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease == ExecutionLease(TENANT, "tree-1", "instance-1", 1, LEASE_MS, None)


async def test_a_live_lease_is_refused_to_everyone_its_holder_included(
    cluster: Instances,
) -> None:
    await _acquire(cluster)
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None
    assert await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS) is None


async def test_leases_are_per_tenant_and_execution(cluster: Instances) -> None:
    leases = cluster.leases(1)
    assert await leases.acquire(TENANT, "tree-1", LEASE_MS) is not None
    assert await leases.acquire(TENANT, "tree-2", LEASE_MS) is not None
    assert await leases.acquire("tenant-2", "tree-1", LEASE_MS) is not None


@pytest.mark.parametrize(("offset", "granted"), [(-1, False), (0, True), (1, True)])
async def test_acquire_at_the_expiry_boundary(
    cluster: Instances, clock: VirtualClock, offset: int, granted: bool
) -> None:
    await _acquire(cluster)
    await clock.advance(LEASE_MS + offset)
    taken = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    if not granted:
        assert taken is None
        return
    assert taken == ExecutionLease(
        TENANT, "tree-1", "instance-2", 2, LEASE_MS, LeaseHolder("instance-1", 1)
    )


async def test_a_takeover_from_itself_names_itself(cluster: Instances, clock: VirtualClock) -> None:
    first = await _acquire(cluster)
    await clock.advance(LEASE_MS)
    again = await _acquire(cluster)
    assert again.lease_epoch == 2
    assert again.taken_over_from == LeaseHolder("instance-1", 1)
    # The old epoch is a zombie even in its own instance.
    assert await cluster.leases(1).renew(first, LEASE_MS) is None
    assert await cluster.leases(1).renew(again, LEASE_MS) == LEASE_MS


async def test_a_released_lease_is_free_and_not_a_takeover(cluster: Instances) -> None:
    lease = await _acquire(cluster)
    assert await cluster.leases(1).release(lease)
    taken = await _acquire(cluster, 2)
    assert (taken.lease_epoch, taken.taken_over_from) == (2, None)


async def test_a_yielded_lease_is_free_to_anyone_and_not_a_takeover(cluster: Instances) -> None:
    lease = await _acquire(cluster)
    assert await cluster.leases(1).yield_lease(lease)
    taken = await _acquire(cluster, 2)
    assert (taken.lease_epoch, taken.taken_over_from) == (2, None)
    # The yielder cannot take it back once another instance took it.
    assert await cluster.leases(1).reclaim(lease, LEASE_MS) is None


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


@pytest.mark.parametrize("later_ms", [0, LEASE_MS, 1000 * LEASE_MS])
async def test_a_finished_lease_is_never_granted_again(
    cluster: Instances, clock: VirtualClock, later_ms: int
) -> None:
    lease = await _acquire(cluster)
    assert await cluster.leases(1).finish(lease)
    await clock.advance(later_ms)
    for instance in (1, 2):
        assert await cluster.leases(instance).acquire(TENANT, "tree-1", LEASE_MS) is None
    assert await cluster.leases(1).reclaim(lease, LEASE_MS) is None
    assert await cluster.leases(1).renew(lease, LEASE_MS) is None


async def test_epochs_are_never_granted_twice(cluster: Instances, clock: VirtualClock) -> None:
    granted: list[int] = []
    lease = await _acquire(cluster, 1)
    granted.append(lease.lease_epoch)
    assert await cluster.leases(1).release(lease)
    lease = await _acquire(cluster, 2)
    granted.append(lease.lease_epoch)
    assert await cluster.leases(2).yield_lease(lease)
    reclaimed = await cluster.leases(2).reclaim(lease, LEASE_MS)
    assert reclaimed is not None
    granted.append(reclaimed.lease_epoch)
    await clock.advance(LEASE_MS)
    lease = await _acquire(cluster, 3)
    granted.append(lease.lease_epoch)
    assert await cluster.leases(3).yield_lease(lease)
    lease = await _acquire(cluster, 1)
    granted.append(lease.lease_epoch)
    assert granted == [1, 2, 3, 4, 5]


# renew


async def test_renew_extends_and_answers_the_time_left(
    cluster: Instances, clock: VirtualClock
) -> None:
    lease = await _acquire(cluster)
    await clock.advance(10_000)
    assert await cluster.leases(1).renew(lease, LEASE_MS) == LEASE_MS
    await clock.advance(LEASE_MS - 1)
    assert await cluster.leases(1).renew(lease, 2 * LEASE_MS) == 2 * LEASE_MS


async def test_renew_never_shortens(cluster: Instances, clock: VirtualClock) -> None:
    lease = await _acquire(cluster)
    await clock.advance(1_000)
    # A shorter renewal keeps the old end: 29 s are left, not 5.
    assert await cluster.leases(1).renew(lease, 5_000) == LEASE_MS - 1_000
    await clock.advance(LEASE_MS - 1_000 - 1)
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None
    await clock.advance(1)
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is not None


@pytest.mark.parametrize(("offset", "renewed"), [(-1, True), (0, False), (1, False)])
async def test_renew_at_the_expiry_boundary(
    cluster: Instances, clock: VirtualClock, offset: int, renewed: bool
) -> None:
    lease = await _acquire(cluster)
    await clock.advance(LEASE_MS + offset)
    remaining = await cluster.leases(1).renew(lease, LEASE_MS)
    assert remaining == (LEASE_MS if renewed else None)
    # Over at the boundary, whether or not another instance took it.
    taken = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    assert (taken is None) is renewed


async def test_a_zombie_moves_nothing(cluster: Instances, clock: VirtualClock) -> None:
    old = await _acquire(cluster, 1)
    await clock.advance(LEASE_MS)
    new = await _acquire(cluster, 2)
    zombie = cluster.leases(1)
    assert await zombie.renew(old, LEASE_MS) is None
    assert await zombie.yield_lease(old) is False
    assert await zombie.reclaim(old, LEASE_MS) is None
    assert await zombie.release(old) is False
    assert await zombie.finish(old) is False
    assert await cluster.leases(2).renew(new, LEASE_MS) == LEASE_MS


async def test_another_instance_cannot_move_a_lease_it_does_not_hold(cluster: Instances) -> None:
    lease = await _acquire(cluster, 1)
    other = cluster.leases(2)
    assert await other.renew(lease, LEASE_MS) is None
    assert await other.yield_lease(lease) is False
    assert await other.release(lease) is False
    assert await other.finish(lease) is False
    assert await cluster.leases(1).yield_lease(lease)
    assert await other.reclaim(lease, LEASE_MS) is None
    assert await cluster.leases(1).reclaim(lease, LEASE_MS) is not None


async def test_renew_refuses_released_yielded_and_finished_leases(cluster: Instances) -> None:
    leases = cluster.leases(1)
    released = await _acquire(cluster, 1, "tree-r")
    yielded = await _acquire(cluster, 1, "tree-y")
    finished = await _acquire(cluster, 1, "tree-f")
    assert await leases.release(released)
    assert await leases.yield_lease(yielded)
    assert await leases.finish(finished)
    for lease in (released, yielded, finished):
        assert await leases.renew(lease, LEASE_MS) is None


async def test_an_unknown_lease_moves_nothing(cluster: Instances) -> None:
    ghost = ExecutionLease(TENANT, "tree-x", "instance-1", 1, LEASE_MS)
    leases = cluster.leases(1)
    assert await leases.renew(ghost, LEASE_MS) is None
    assert await leases.release(ghost) is False
    assert await leases.yield_lease(ghost) is False
    assert await leases.reclaim(ghost, LEASE_MS) is None
    assert await leases.finish(ghost) is False


# release, yield, reclaim, finish


async def test_release_once_and_an_expired_lease_nobody_took_can_still_be_released(
    cluster: Instances, clock: VirtualClock
) -> None:
    lease = await _acquire(cluster)
    await clock.advance(LEASE_MS + 1)
    assert await cluster.leases(1).release(lease) is True
    assert await cluster.leases(1).release(lease) is False
    taken = await _acquire(cluster, 2)
    assert taken.taken_over_from is None


async def test_release_races_a_take_past_expiry_both_orders(
    cluster: Instances, clock: VirtualClock
) -> None:
    lease = await _acquire(cluster, 1, "tree-1")
    await clock.advance(LEASE_MS)
    assert await cluster.leases(1).release(lease)
    taken = await _acquire(cluster, 2, "tree-1")
    assert taken.taken_over_from is None

    lease = await _acquire(cluster, 1, "tree-2")
    await clock.advance(LEASE_MS)
    taken = await _acquire(cluster, 2, "tree-2")
    assert taken.taken_over_from == LeaseHolder("instance-1", 1)
    assert await cluster.leases(1).release(lease) is False
    assert await cluster.leases(2).renew(taken, LEASE_MS) == LEASE_MS


@pytest.mark.parametrize(("offset", "yielded"), [(-1, True), (0, False), (1, False)])
async def test_yield_at_the_expiry_boundary(
    cluster: Instances, clock: VirtualClock, offset: int, yielded: bool
) -> None:
    lease = await _acquire(cluster)
    await clock.advance(LEASE_MS + offset)
    assert await cluster.leases(1).yield_lease(lease) is yielded
    assert await cluster.leases(1).yield_lease(lease) is False


async def test_reclaim_takes_a_yielded_lease_back_at_the_next_epoch(
    cluster: Instances, clock: VirtualClock
) -> None:
    lease = await _acquire(cluster)
    assert await cluster.leases(1).yield_lease(lease)
    await clock.advance(1_000)
    back = await cluster.leases(1).reclaim(lease, LEASE_MS)
    assert back == ExecutionLease(TENANT, "tree-1", "instance-1", 2, LEASE_MS, None)
    assert await cluster.leases(1).renew(lease, LEASE_MS) is None
    assert await cluster.leases(1).reclaim(lease, LEASE_MS) is None
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None


async def test_reclaim_needs_a_yielded_lease(cluster: Instances) -> None:
    lease = await _acquire(cluster)
    assert await cluster.leases(1).reclaim(lease, LEASE_MS) is None


@pytest.mark.parametrize(("offset", "reclaimed"), [(-1, True), (0, False), (1, False)])
async def test_reclaim_at_the_expiry_boundary(
    cluster: Instances, clock: VirtualClock, offset: int, reclaimed: bool
) -> None:
    lease = await _acquire(cluster)
    assert await cluster.leases(1).yield_lease(lease)
    await clock.advance(LEASE_MS + offset)
    back = await cluster.leases(1).reclaim(lease, LEASE_MS)
    assert (back is not None) is reclaimed
    if back is not None:
        assert (back.lease_epoch, back.remaining_ms) == (2, LEASE_MS)


async def test_reclaim_after_release_or_finish_is_refused(cluster: Instances) -> None:
    leases = cluster.leases(1)
    released = await _acquire(cluster, 1, "tree-r")
    finished = await _acquire(cluster, 1, "tree-f")
    for lease, end in ((released, leases.release), (finished, leases.finish)):
        assert await leases.yield_lease(lease)
        assert await end(lease)
        assert await leases.reclaim(lease, LEASE_MS) is None


async def test_finish_once_and_not_after_release(cluster: Instances) -> None:
    leases = cluster.leases(1)
    lease = await _acquire(cluster, 1, "tree-1")
    assert await leases.finish(lease) is True
    assert await leases.finish(lease) is False
    assert await leases.release(lease) is False
    other = await _acquire(cluster, 1, "tree-2")
    assert await leases.release(other)
    assert await leases.finish(other) is False


async def test_finish_races_a_take_past_the_lease_both_orders(
    cluster: Instances, clock: VirtualClock
) -> None:
    lease = await _acquire(cluster, 1, "tree-1")
    await clock.advance(LEASE_MS + 1)
    assert await cluster.leases(1).finish(lease) is True
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None

    lease = await _acquire(cluster, 1, "tree-2")
    await clock.advance(LEASE_MS + 1)
    taken = await _acquire(cluster, 2, "tree-2")
    assert await cluster.leases(1).finish(lease) is False
    assert await cluster.leases(2).renew(taken, LEASE_MS) == LEASE_MS


# execution ids


async def test_an_execution_id_is_saved_once_whatever_the_tenant(cluster: Instances) -> None:
    leases = cluster.leases(1)
    assert await leases.save_execution_id_if_absent(TENANT, "run-1") is True
    assert await leases.save_execution_id_if_absent(TENANT, "run-1") is False
    assert await cluster.leases(2).save_execution_id_if_absent("tenant-2", "run-1") is False
    assert await leases.save_execution_id_if_absent("tenant-2", "run-2") is True


async def test_concurrent_saves_of_one_execution_id_insert_it_once(
    cluster: Instances, new_connection: Callable[[], SqlConnection]
) -> None:
    stores = [cluster.leases(i, new_connection()) for i in range(10)]
    saved = await asyncio.gather(*(s.save_execution_id_if_absent(TENANT, "run-1") for s in stores))
    assert saved.count(True) == 1


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


async def test_the_store_never_reads_the_instances_own_clock(sql: SqlConnection) -> None:
    store_time = VirtualClock(START)
    # Only the StoreClock is given; an instance's own (skewed) clock has no way in.
    skewed = store_time.skewed(10 * LEASE_MS)
    one = SqlExecutionLeaseRepository(sql, StoreClock(store_time), ApplicationContext("i-1"))
    two = SqlExecutionLeaseRepository(sql, StoreClock(store_time), ApplicationContext("i-2"))
    assert skewed.now() == START + 10 * LEASE_MS
    lease = await one.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await two.acquire(TENANT, "tree-1", LEASE_MS) is None
    await store_time.advance(LEASE_MS - 1)
    assert await one.renew(lease, LEASE_MS) == LEASE_MS


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


async def test_a_255_character_identifier_is_accepted(cluster: Instances) -> None:
    lease = await cluster.leases(1).acquire("t" * 255, "e" * 255, LEASE_MS)
    assert lease is not None and lease.execution_id == "e" * 255


@pytest.mark.parametrize("lease_ms", [0, -1, True, 1.5])
async def test_a_lease_must_last_a_positive_whole_number_of_ms(
    cluster: Instances, lease_ms: object
) -> None:
    leases = cluster.leases(1)
    with pytest.raises(ValueError):
        await leases.acquire(TENANT, "tree-1", lease_ms)  # type: ignore[arg-type]
    lease = await _acquire(cluster)
    with pytest.raises(ValueError):
        await leases.renew(lease, lease_ms)  # type: ignore[arg-type]
    assert await leases.yield_lease(lease)
    with pytest.raises(ValueError):
        await leases.reclaim(lease, lease_ms)  # type: ignore[arg-type]


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
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE NOT granted"
            if sql.dialect_name == "postgresql"
            else "SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
        )
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
