"""The in-memory lease store keeps every promise of `ExecutionLeaseRepository` (SPEC 3.1)."""

from __future__ import annotations

import asyncio

import pytest
from memory_cluster import LEASE_MS, START, TENANT, Cluster

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionLease,
    InvalidIdentifierError,
    LeaseHolder,
    StoreClock,
    SystemClock,
    VirtualClock,
)
from agboss_sql.memory import InMemoryBackend, InMemoryExecutionLeaseRepository


async def test_first_acquire_grants_epoch_one_for_the_whole_lease(cluster: Cluster) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease == ExecutionLease(TENANT, "tree-1", "instance-1", 1, LEASE_MS, None)


async def test_a_live_lease_is_refused_to_everyone_its_holder_included(cluster: Cluster) -> None:
    assert await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS) is not None
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None
    assert await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS) is None


async def test_leases_are_per_tenant_and_execution(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    assert await leases.acquire(TENANT, "tree-1", LEASE_MS) is not None
    assert await leases.acquire(TENANT, "tree-2", LEASE_MS) is not None
    assert await leases.acquire("tenant-2", "tree-1", LEASE_MS) is not None


@pytest.mark.parametrize(("offset", "granted"), [(-1, False), (0, True), (1, True)])
async def test_acquire_at_the_expiry_boundary(cluster: Cluster, offset: int, granted: bool) -> None:
    await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    await cluster.clock.advance(LEASE_MS + offset)
    taken = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    if not granted:
        assert taken is None
        return
    assert taken is not None
    assert (taken.holder_instance_id, taken.lease_epoch, taken.remaining_ms) == (
        "instance-2",
        2,
        LEASE_MS,
    )
    assert taken.taken_over_from == LeaseHolder("instance-1", 1)


async def test_a_takeover_from_itself_names_itself(cluster: Cluster) -> None:
    await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    await cluster.clock.advance(LEASE_MS)
    again = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert again is not None
    assert again.lease_epoch == 2
    assert again.taken_over_from == LeaseHolder("instance-1", 1)


async def test_a_released_lease_is_free_and_not_a_takeover(cluster: Cluster) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await cluster.leases(1).release(lease)
    taken = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    assert taken is not None
    assert (taken.lease_epoch, taken.taken_over_from) == (2, None)


async def test_a_yielded_lease_is_free_to_anyone_and_not_a_takeover(cluster: Cluster) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await cluster.leases(1).yield_lease(lease)
    taken = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    assert taken is not None
    assert (taken.holder_instance_id, taken.lease_epoch, taken.taken_over_from) == (
        "instance-2",
        2,
        None,
    )
    # The yielding holder's epoch is over: it can no longer reclaim it.
    assert await cluster.leases(1).reclaim(lease, LEASE_MS) is None


async def test_a_finished_lease_is_never_granted_again(cluster: Cluster) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await cluster.leases(1).finish(lease)
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None
    await cluster.clock.advance(10 * LEASE_MS)
    assert await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS) is None
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None


async def test_epochs_grow_by_one_per_grant(cluster: Cluster) -> None:
    epochs = []
    for instance in (1, 2, 1, 3):
        lease = await cluster.leases(instance).acquire(TENANT, "tree-1", LEASE_MS)
        assert lease is not None
        epochs.append(lease.lease_epoch)
        assert await cluster.leases(instance).release(lease)
    assert epochs == [1, 2, 3, 4]


async def test_fifty_concurrent_acquires_of_a_free_lease_grant_exactly_one(
    cluster: Cluster,
) -> None:
    stores = [cluster.leases(i) for i in range(50)]
    granted = await asyncio.gather(*(s.acquire(TENANT, "tree-1", LEASE_MS) for s in stores))
    winners = [lease for lease in granted if lease is not None]
    assert len(winners) == 1
    assert winners[0].lease_epoch == 1


async def test_fifty_concurrent_takeovers_of_an_expired_lease_grant_exactly_one(
    cluster: Cluster,
) -> None:
    await cluster.leases(0).acquire(TENANT, "tree-1", LEASE_MS)
    await cluster.clock.advance(LEASE_MS)
    stores = [cluster.leases(i) for i in range(1, 51)]
    granted = await asyncio.gather(*(s.acquire(TENANT, "tree-1", LEASE_MS) for s in stores))
    winners = [lease for lease in granted if lease is not None]
    assert len(winners) == 1
    assert winners[0].lease_epoch == 2
    assert winners[0].taken_over_from == LeaseHolder("instance-0", 1)


# renew


async def test_renew_extends_and_answers_the_time_left(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(10_000)
    assert await leases.renew(lease, LEASE_MS) == LEASE_MS
    await cluster.clock.advance(LEASE_MS - 1)
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None


async def test_renew_never_shortens(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(1_000)
    assert await leases.renew(lease, 5_000) == LEASE_MS - 1_000
    await cluster.clock.advance(LEASE_MS - 1_001)
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None


@pytest.mark.parametrize(("offset", "renewed"), [(-1, True), (0, False), (1, False)])
async def test_renew_at_the_expiry_boundary(cluster: Cluster, offset: int, renewed: bool) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(LEASE_MS + offset)
    remaining = await leases.renew(lease, LEASE_MS)
    assert (remaining == LEASE_MS) if renewed else (remaining is None)


async def test_a_zombie_renews_nothing(cluster: Cluster) -> None:
    old = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert old is not None
    await cluster.clock.advance(LEASE_MS)
    new = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    assert new is not None
    assert await cluster.leases(1).renew(old, LEASE_MS) is None
    assert await cluster.leases(1).release(old) is False
    assert await cluster.leases(1).yield_lease(old) is False
    assert await cluster.leases(1).reclaim(old, LEASE_MS) is None
    assert await cluster.leases(1).finish(old) is False
    # The new holder is untouched.
    assert await cluster.leases(2).renew(new, LEASE_MS) == LEASE_MS


async def test_a_zombie_of_its_own_earlier_epoch_moves_nothing(cluster: Cluster) -> None:
    old = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert old is not None
    await cluster.clock.advance(LEASE_MS)
    new = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert new is not None
    assert await cluster.leases(1).renew(old, LEASE_MS) is None
    assert await cluster.leases(1).release(old) is False
    assert await cluster.leases(1).finish(old) is False
    assert await cluster.leases(1).renew(new, LEASE_MS) == LEASE_MS


async def test_another_instance_cannot_move_a_lease_it_does_not_hold(cluster: Cluster) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    other = cluster.leases(2)
    assert await other.renew(lease, LEASE_MS) is None
    assert await other.yield_lease(lease) is False
    assert await other.release(lease) is False
    assert await other.finish(lease) is False
    assert await cluster.leases(1).renew(lease, LEASE_MS) == LEASE_MS


async def test_renew_refuses_released_yielded_and_finished_leases(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    released = await leases.acquire(TENANT, "tree-r", LEASE_MS)
    yielded = await leases.acquire(TENANT, "tree-y", LEASE_MS)
    finished = await leases.acquire(TENANT, "tree-f", LEASE_MS)
    assert released is not None and yielded is not None and finished is not None
    assert await leases.release(released)
    assert await leases.yield_lease(yielded)
    assert await leases.finish(finished)
    for lease in (released, yielded, finished):
        assert await leases.renew(lease, LEASE_MS) is None


async def test_renewing_an_unknown_lease_is_refused(cluster: Cluster) -> None:
    ghost = ExecutionLease(TENANT, "tree-x", "instance-1", 1, LEASE_MS)
    leases = cluster.leases(1)
    assert await leases.renew(ghost, LEASE_MS) is None
    assert await leases.release(ghost) is False
    assert await leases.yield_lease(ghost) is False
    assert await leases.reclaim(ghost, LEASE_MS) is None
    assert await leases.finish(ghost) is False


# release


async def test_release_once(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await leases.release(lease) is True
    assert await leases.release(lease) is False


@pytest.mark.parametrize("offset", [-1, 0, 1])
async def test_an_expired_lease_nobody_took_can_still_be_released(
    cluster: Cluster, offset: int
) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(LEASE_MS + offset)
    assert await leases.release(lease) is True
    taken = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    assert taken is not None and taken.taken_over_from is None


async def test_release_of_a_yielded_lease_works_but_not_of_a_finished_one(
    cluster: Cluster,
) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await leases.yield_lease(lease)
    assert await leases.release(lease) is True
    other = await leases.acquire(TENANT, "tree-2", LEASE_MS)
    assert other is not None
    assert await leases.finish(other)
    assert await leases.release(other) is False


async def test_release_races_a_take_past_expiry_both_orders(cluster: Cluster) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(LEASE_MS)
    # release first: the take follows at the next epoch, not as a takeover
    assert await cluster.leases(1).release(lease)
    taken = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    assert taken is not None and taken.taken_over_from is None

    lease = await cluster.leases(1).acquire(TENANT, "tree-2", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(LEASE_MS)
    # take first: the late release changes nothing
    taken = await cluster.leases(2).acquire(TENANT, "tree-2", LEASE_MS)
    assert taken is not None and taken.taken_over_from == LeaseHolder("instance-1", 1)
    assert await cluster.leases(1).release(lease) is False
    assert await cluster.leases(2).renew(taken, LEASE_MS) == LEASE_MS


# yield and reclaim


async def test_yield_once_while_live(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await leases.yield_lease(lease) is True
    assert await leases.yield_lease(lease) is False


@pytest.mark.parametrize(("offset", "yielded"), [(-1, True), (0, False), (1, False)])
async def test_yield_at_the_expiry_boundary(cluster: Cluster, offset: int, yielded: bool) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(LEASE_MS + offset)
    assert await leases.yield_lease(lease) is yielded


async def test_yield_refuses_released_and_finished_leases(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    released = await leases.acquire(TENANT, "tree-r", LEASE_MS)
    finished = await leases.acquire(TENANT, "tree-f", LEASE_MS)
    assert released is not None and finished is not None
    assert await leases.release(released)
    assert await leases.finish(finished)
    assert await leases.yield_lease(released) is False
    assert await leases.yield_lease(finished) is False


async def test_reclaim_takes_a_yielded_lease_back_at_the_next_epoch(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(20_000)
    assert await leases.yield_lease(lease)
    back = await leases.reclaim(lease, 5_000)
    assert back == ExecutionLease(TENANT, "tree-1", "instance-1", 2, 5_000, None)
    # Not yielded any more: nobody else may take it, and the old epoch is dead.
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None
    assert await leases.renew(lease, LEASE_MS) is None
    assert await leases.reclaim(back, LEASE_MS) is None
    await cluster.clock.advance(5_000)
    taken = await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS)
    assert taken is not None and taken.taken_over_from == LeaseHolder("instance-1", 2)


async def test_reclaim_needs_a_yielded_lease(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await leases.reclaim(lease, LEASE_MS) is None


@pytest.mark.parametrize(("offset", "reclaimed"), [(-1, True), (0, False), (1, False)])
async def test_reclaim_at_the_expiry_boundary(
    cluster: Cluster, offset: int, reclaimed: bool
) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await leases.yield_lease(lease)
    await cluster.clock.advance(LEASE_MS + offset)
    back = await leases.reclaim(lease, LEASE_MS)
    assert (back is not None) is reclaimed


async def test_reclaim_after_release_or_finish_is_refused(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    for execution, end in (("tree-r", leases.release), ("tree-f", leases.finish)):
        lease = await leases.acquire(TENANT, execution, LEASE_MS)
        assert lease is not None
        assert await leases.yield_lease(lease)
        assert await end(lease)
        assert await leases.reclaim(lease, LEASE_MS) is None


# finish


async def test_finish_once(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await leases.finish(lease) is True
    assert await leases.finish(lease) is False
    assert await leases.release(lease) is False


async def test_finish_after_release_is_refused(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await leases.release(lease)
    assert await leases.finish(lease) is False
    # Released, not finished: it can be taken again.
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is not None


async def test_finish_races_a_take_past_the_lease_both_orders(cluster: Cluster) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(LEASE_MS + 1)
    # finish first: the work is done and never taken over
    assert await cluster.leases(1).finish(lease) is True
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is None

    lease = await cluster.leases(1).acquire(TENANT, "tree-2", LEASE_MS)
    assert lease is not None
    await cluster.clock.advance(LEASE_MS + 1)
    # take first: the late finish is refused, the new holder keeps its lease
    taken = await cluster.leases(2).acquire(TENANT, "tree-2", LEASE_MS)
    assert taken is not None
    assert await cluster.leases(1).finish(lease) is False
    assert await cluster.leases(2).renew(taken, LEASE_MS) == LEASE_MS


# execution ids


async def test_an_execution_id_is_saved_once_whatever_the_tenant(cluster: Cluster) -> None:
    leases = cluster.leases(1)
    assert await leases.save_execution_id_if_absent(TENANT, "run-1") is True
    assert await leases.save_execution_id_if_absent(TENANT, "run-1") is False
    assert await cluster.leases(2).save_execution_id_if_absent("tenant-2", "run-1") is False
    assert await leases.save_execution_id_if_absent("tenant-2", "run-2") is True


async def test_concurrent_saves_of_one_execution_id_insert_it_once(cluster: Cluster) -> None:
    stores = [cluster.leases(i) for i in range(20)]
    saved = await asyncio.gather(*(s.save_execution_id_if_absent(TENANT, "run-1") for s in stores))
    assert saved.count(True) == 1


# time


async def test_the_store_decides_by_the_store_clock_not_the_instances_clock() -> None:
    backend = InMemoryBackend()
    store_time = VirtualClock(START)
    # Each instance's own clock is off, but stores are built on the store's time.
    leases_1 = InMemoryExecutionLeaseRepository(
        backend, StoreClock(store_time), ApplicationContext("instance-1")
    )
    leases_2 = InMemoryExecutionLeaseRepository(
        backend, StoreClock(store_time), ApplicationContext("instance-2")
    )
    lease = await leases_1.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    assert await leases_2.acquire(TENANT, "tree-1", LEASE_MS) is None
    await store_time.advance(LEASE_MS - 1)
    assert await leases_1.renew(lease, LEASE_MS) == LEASE_MS


async def test_database_time_is_this_hosts_clock_in_memory() -> None:
    leases = InMemoryExecutionLeaseRepository(
        InMemoryBackend(), StoreClock(), ApplicationContext("instance-1")
    )
    before = SystemClock().now()
    lease = await leases.acquire(TENANT, "tree-1", 60_000)
    assert lease is not None
    assert 59_000 <= lease.remaining_ms <= 60_000
    remaining = await leases.renew(lease, 120_000)
    assert remaining is not None and 119_000 <= remaining <= 120_000
    row = leases.memory.leases[(TENANT, "tree-1")]
    assert before + 120_000 <= row.expires_at <= SystemClock().now() + 120_000


# arguments


@pytest.mark.parametrize("bad", ["", "x" * 256, None, 7])
async def test_identifiers_are_checked_before_anything(cluster: Cluster, bad: object) -> None:
    leases = cluster.leases(1)
    with pytest.raises(InvalidIdentifierError):
        await leases.acquire(bad, "tree-1", LEASE_MS)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        await leases.acquire(TENANT, bad, LEASE_MS)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        await leases.save_execution_id_if_absent(TENANT, bad)  # type: ignore[arg-type]
    assert cluster.backend.leases == {}
    assert cluster.backend.execution_ids == set()


async def test_a_255_character_identifier_is_accepted(cluster: Cluster) -> None:
    assert await cluster.leases(1).acquire("t" * 255, "e" * 255, LEASE_MS) is not None


@pytest.mark.parametrize("lease_ms", [0, -1, True, 1.5])
async def test_a_lease_must_last_a_positive_whole_number_of_ms(
    cluster: Cluster, lease_ms: object
) -> None:
    leases = cluster.leases(1)
    with pytest.raises(ValueError):
        await leases.acquire(TENANT, "tree-1", lease_ms)  # type: ignore[arg-type]
    lease = await leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    with pytest.raises(ValueError):
        await leases.renew(lease, lease_ms)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await leases.reclaim(lease, lease_ms)  # type: ignore[arg-type]


def test_the_lease_store_needs_the_stores_clock_and_an_application() -> None:
    backend = InMemoryBackend()
    with pytest.raises(TypeError, match="StoreClock"):
        InMemoryExecutionLeaseRepository(backend, VirtualClock(), ApplicationContext("a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ApplicationContext"):
        InMemoryExecutionLeaseRepository(backend, StoreClock(), "a")  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        InMemoryExecutionLeaseRepository(backend, StoreClock(), ApplicationContext(""))
