"""The lease cases of epochs, finish and zombies: epochs grow by one, finished work is
never granted again, a zombie or a released lease moves nothing, yield and reclaim, only
the holder moves its lease, `taken_over_from`, and execution ids saved once."""

from __future__ import annotations

from agboss_sql.contracts.types import ExecutionLease, LeaseHolder
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._execution_lease_support import _expect_lease, _lease
from agboss_sql.testing.contracts._fencing import (
    LEASE_MS,
    OTHER_TENANT,
    TENANT,
    Round,
    World,
    each_round,
    expect,
    fail,
    race,
)

# --- epochs, finish, zombies --------------------------------------------------------------


async def epochs_grow_by_one(ctx: CaseContext) -> None:
    """Every grant (takeover, hand-over after release or yield, reclaim, takeover from
    itself) is the next epoch: no epoch is granted twice."""
    w = World(ctx)
    tree = w.name()
    leases = [await w.take(tree, 0)]
    await w.at(w.now + LEASE_MS)
    leases.append(await w.take(tree, 1))
    expect(
        await w.leases(1).release(leases[-1]), "no-stale-write", "the holder's release was refused"
    )
    leases.append(await w.take(tree, 0))
    expect(
        await w.leases(0).yield_lease(leases[-1]),
        "no-stale-write",
        "the holder's yield was refused",
    )
    leases.append(await w.take(tree, 1))
    expect(
        await w.leases(1).yield_lease(leases[-1]),
        "no-stale-write",
        "the holder's yield was refused",
    )
    back = await w.leases(1).reclaim(leases[-1], LEASE_MS)
    if back is None:
        fail("no-stale-write", "the holder's reclaim of its live yielded lease was refused")
    leases.append(back)
    await w.at(w.now + LEASE_MS)
    leases.append(await w.take(tree, 1))
    epochs = [lease.lease_epoch for lease in leases]
    expect(
        epochs == [1, 2, 3, 4, 5, 6],
        "one-live-holder",
        f"the grants' epochs were {epochs}, expected 1 to 6: an epoch granted twice or skipped",
    )


async def finished_never_granted_again(ctx: CaseContext) -> None:
    """A finished lease is never granted again, to anyone, at any time; nothing moves it."""
    w = World(ctx)
    tree = w.name()
    lease = await w.take(tree, 0)
    expect(await w.leases(0).finish(lease), "no-stale-write", "the holder's finish was refused")
    for later in (0, LEASE_MS, 10 * LEASE_MS):
        await w.at(w.now + later)
        for instance in (0, 1):
            got = await w.leases(instance).acquire(TENANT, tree, LEASE_MS)
            expect(
                got is None,
                "no-takeover-of-finished-work",
                f"instance-{instance + 1} was granted the finished lease ({got})",
            )
    leases = w.leases(0)
    expect(
        await leases.renew(lease, LEASE_MS) is None,
        "no-stale-write",
        "a finished lease was renewed",
    )
    expect(not await leases.yield_lease(lease), "no-stale-write", "a finished lease was yielded")
    expect(
        await leases.reclaim(lease, LEASE_MS) is None,
        "no-stale-write",
        "a finished lease was reclaimed",
    )
    expect(not await leases.release(lease), "no-stale-write", "a finished lease was released")
    expect(not await leases.finish(lease), "no-stale-write", "a finished lease was finished twice")


async def _zombie_moves_nothing(
    w: World, zombie: ExecutionLease, holder: ExecutionLease, holder_instance: int
) -> None:
    for instance in (0, 1):
        leases = w.leases(instance)
        what = (
            f"instance-{instance + 1} moving zombie epoch {zombie.lease_epoch} of "
            f"{zombie.holder_instance_id} while epoch {holder.lease_epoch} is held"
        )
        expect(await leases.renew(zombie, LEASE_MS) is None, "no-stale-write", f"{what}: renewed")
        expect(not await leases.yield_lease(zombie), "no-stale-write", f"{what}: yielded")
        expect(
            await leases.reclaim(zombie, LEASE_MS) is None, "no-stale-write", f"{what}: reclaimed"
        )
        expect(not await leases.release(zombie), "no-stale-write", f"{what}: released")
        expect(not await leases.finish(zombie), "no-stale-write", f"{what}: finished")
    remaining = await w.leases(holder_instance).renew(holder, LEASE_MS)
    expect(
        remaining == LEASE_MS,
        "no-stale-write",
        f"the holder of epoch {holder.lease_epoch} could not renew after a zombie's moves ({remaining})",
    )


async def zombie_moves_nothing(ctx: CaseContext) -> None:
    """After a takeover the old epoch renews, yields, reclaims, releases and finishes
    nothing, and the new holder's lease is unharmed; also after a takeover from itself."""
    w = World(ctx)
    tree = w.name()
    first = await w.take(tree, 0)
    await w.at(w.now + LEASE_MS)
    second = await w.take(tree, 1)
    await _zombie_moves_nothing(w, first, second, 1)
    await w.at(w.now + LEASE_MS)
    third = await w.take(tree, 1)
    expect(
        third.taken_over_from == LeaseHolder("instance-2", 2),
        "taken-over-from",
        f"a takeover from itself answered {third}",
    )
    await _zombie_moves_nothing(w, second, third, 1)
    await _zombie_moves_nothing(w, first, third, 1)


async def released_lease_moves_nothing(ctx: CaseContext) -> None:
    """A released lease cannot be renewed, yielded, reclaimed, released or finished."""
    w = World(ctx)
    tree = w.name()
    lease = await w.take(tree, 0)
    leases = w.leases(0)
    expect(await leases.release(lease), "no-stale-write", "the holder's release was refused")
    expect(
        await leases.renew(lease, LEASE_MS) is None,
        "no-stale-write",
        "a released lease was renewed",
    )
    expect(not await leases.yield_lease(lease), "no-stale-write", "a released lease was yielded")
    expect(
        await leases.reclaim(lease, LEASE_MS) is None,
        "no-stale-write",
        "a released lease was reclaimed",
    )
    expect(not await leases.release(lease), "no-stale-write", "a released lease was released twice")
    expect(not await leases.finish(lease), "no-stale-write", "a released lease was finished")


async def yielded_lease_moves(ctx: CaseContext) -> None:
    """A yielded lease is not renewed or yielded again; once another instance takes it, the
    old epoch cannot reclaim or release it."""
    w = World(ctx)
    tree = w.name()
    lease = await w.take(tree, 0)
    leases = w.leases(0)
    expect(await leases.yield_lease(lease), "no-stale-write", "the holder's yield was refused")
    expect(
        await leases.renew(lease, LEASE_MS) is None, "no-stale-write", "a yielded lease was renewed"
    )
    expect(
        not await leases.yield_lease(lease), "no-stale-write", "a yielded lease was yielded twice"
    )
    other = await w.take(tree, 1)
    expect(
        other.taken_over_from is None,
        "taken-over-from",
        f"a yielded lease's take named {other.taken_over_from} as taken over",
    )
    expect(
        await leases.reclaim(lease, LEASE_MS) is None,
        "no-stale-write",
        "the old epoch reclaimed a lease another instance took",
    )
    expect(
        not await leases.release(lease),
        "no-stale-write",
        "the old epoch released a lease another instance took",
    )
    expect(
        await w.leases(1).renew(other, LEASE_MS) == LEASE_MS,
        "no-stale-write",
        "the new holder could not renew",
    )


async def only_the_holder_moves_its_lease(ctx: CaseContext) -> None:
    """Another instance presenting the holder's lease renews, yields, reclaims, releases and
    finishes nothing, live or yielded, and the holder's lease is unharmed; a lease that was
    never granted moves nothing either."""
    w = World(ctx)
    tree = w.name()
    lease = await w.take(tree, 0)
    other = w.leases(1)
    for state in ("live", "yielded"):
        what = f"instance-2 moving instance-1's {state} lease"
        expect(await other.renew(lease, LEASE_MS) is None, "no-stale-write", f"{what}: renewed")
        expect(not await other.yield_lease(lease), "no-stale-write", f"{what}: yielded")
        expect(await other.reclaim(lease, LEASE_MS) is None, "no-stale-write", f"{what}: reclaimed")
        expect(not await other.release(lease), "no-stale-write", f"{what}: released")
        expect(not await other.finish(lease), "no-stale-write", f"{what}: finished")
        if state == "live":
            expect(
                await w.leases(0).renew(lease, LEASE_MS) == LEASE_MS,
                "no-stale-write",
                "the holder could not renew after another instance's moves",
            )
            expect(
                await w.leases(0).yield_lease(lease), "no-stale-write", "the holder's yield refused"
            )
    back = await w.leases(0).reclaim(lease, LEASE_MS)
    _expect_lease(
        back,
        _lease(tree, "instance-1", 2, LEASE_MS),
        "no-stale-write",
        "the holder reclaiming its yielded lease after another instance's moves",
    )
    ghost = _lease(w.name(), "instance-1", 1, LEASE_MS)
    leases = w.leases(0)
    what = "a lease that was never granted"
    expect(await leases.renew(ghost, LEASE_MS) is None, "no-stale-write", f"{what} was renewed")
    expect(not await leases.yield_lease(ghost), "no-stale-write", f"{what} was yielded")
    expect(await leases.reclaim(ghost, LEASE_MS) is None, "no-stale-write", f"{what} was reclaimed")
    expect(not await leases.release(ghost), "no-stale-write", f"{what} was released")
    expect(not await leases.finish(ghost), "no-stale-write", f"{what} was finished")


async def reclaim_needs_a_yielded_lease(ctx: CaseContext) -> None:
    """Reclaim takes back only a lease its holder yielded and still holds: not a live lease
    that was never yielded, not a yielded lease its holder then released or finished. After
    a reclaim the old epoch is over and the new one is live and not yielded. A yielded lease
    may still be released, and is then handed over, not taken over."""
    w = World(ctx)
    leases = w.leases(0)
    live = await w.take(w.name(), 0)
    expect(
        await leases.reclaim(live, LEASE_MS) is None,
        "no-stale-write",
        "a live lease that was never yielded was reclaimed",
    )
    expect(
        await leases.renew(live, LEASE_MS) == LEASE_MS,
        "no-stale-write",
        "the holder could not renew after a refused reclaim",
    )
    tree = w.name()
    lease = await w.take(tree, 0)
    expect(await leases.yield_lease(lease), "no-stale-write", "the holder's yield was refused")
    back = await leases.reclaim(lease, LEASE_MS)
    if back is None:
        fail("no-stale-write", "the holder's reclaim of its live yielded lease was refused")
    expect(
        await leases.renew(lease, LEASE_MS) is None,
        "no-stale-write",
        "the epoch before a reclaim was renewed after it",
    )
    expect(
        await leases.reclaim(back, LEASE_MS) is None,
        "no-stale-write",
        "a reclaimed lease (not yielded any more) was reclaimed again",
    )
    got = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
    expect(got is None, "one-live-holder", f"another instance took a reclaimed live lease ({got})")
    for end in ("release", "finish"):
        lease = await w.take(w.name(), 0)
        expect(await leases.yield_lease(lease), "no-stale-write", "the holder's yield was refused")
        ended = await (leases.release(lease) if end == "release" else leases.finish(lease))
        expect(ended, "no-stale-write", f"the holder's {end} of its yielded lease was refused")
        expect(
            await leases.reclaim(lease, LEASE_MS) is None,
            "no-stale-write",
            f"a yielded lease was reclaimed after its holder's {end}",
        )
        if end == "release":
            handed = await w.take(lease.execution_id, 1)
            expect(
                handed.taken_over_from is None,
                "taken-over-from",
                f"a take after a yielded lease's release named {handed.taken_over_from}",
            )


async def lease_ms_is_a_positive_whole_number(ctx: CaseContext) -> None:
    """`lease_ms` of acquire, renew and reclaim is a positive `int` (not a bool, not a
    float): anything else is `ValueError`, and takes or moves nothing."""
    w = World(ctx)
    tree = w.name()
    bad_values: tuple[object, ...] = (0, -1, True, 1.5)
    for bad in bad_values:
        try:
            got = await w.leases(0).acquire(TENANT, tree, bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        fail("lease-ms", f"acquire with lease_ms={bad!r} answered {got} instead of ValueError")
    lease = await w.take(tree, 0)
    expect(lease.lease_epoch == 1, "lease-ms", f"a refused acquire took the lease ({lease})")
    for move in ("renew", "reclaim"):
        if move == "reclaim":
            expect(
                await w.leases(0).yield_lease(lease), "no-stale-write", "the holder's yield refused"
            )
        for bad in bad_values:
            try:
                if move == "renew":
                    answer: object = await w.leases(0).renew(lease, bad)  # type: ignore[arg-type]
                else:
                    answer = await w.leases(0).reclaim(lease, bad)  # type: ignore[arg-type]
            except ValueError:
                continue
            fail(
                "lease-ms", f"{move} with lease_ms={bad!r} answered {answer} instead of ValueError"
            )
    back = await w.leases(0).reclaim(lease, LEASE_MS)
    expect(
        back is not None and back.lease_epoch == 2,
        "lease-ms",
        f"after refused reclaims the holder's reclaim answered {back}",
    )


async def taken_over_from_names_takeovers(ctx: CaseContext) -> None:
    """`taken_over_from` names the previous holder and epoch when that epoch expired
    unreleased, also when the taker is that holder itself; it is `None` after a release, a
    yield, and on a reclaim."""
    w = World(ctx)
    tree = w.name()
    first = await w.take(tree, 0)
    await w.at(w.now + LEASE_MS)
    again = await w.take(tree, 0)
    expect(
        again.taken_over_from == LeaseHolder("instance-1", 1),
        "taken-over-from",
        f"a takeover from itself named {again.taken_over_from}, expected instance-1 at 1",
    )
    expect(
        first.taken_over_from is None, "taken-over-from", "a first grant named a previous holder"
    )
    await w.at(w.now + LEASE_MS)
    other = await w.take(tree, 1)
    expect(
        other.taken_over_from == LeaseHolder("instance-1", 2),
        "taken-over-from",
        f"a takeover named {other.taken_over_from}, expected instance-1 at 2",
    )
    expect(await w.leases(1).release(other), "no-stale-write", "release refused")
    handed = await w.take(tree, 0)
    expect(
        handed.taken_over_from is None,
        "taken-over-from",
        f"a take after a release named {handed.taken_over_from}: a hand-over is no takeover",
    )
    expect(await w.leases(0).yield_lease(handed), "no-stale-write", "yield refused")
    yielded_to = await w.take(tree, 1)
    expect(
        yielded_to.taken_over_from is None,
        "taken-over-from",
        f"a take after a yield named {yielded_to.taken_over_from}",
    )
    expect(await w.leases(1).yield_lease(yielded_to), "no-stale-write", "yield refused")
    back = await w.leases(1).reclaim(yielded_to, LEASE_MS)
    expect(
        back is not None and back.taken_over_from is None,
        "taken-over-from",
        f"a reclaim answered {back}",
    )
    assert back is not None
    await w.at(w.now + LEASE_MS)
    own = await w.take(tree, 1)
    expect(
        own.taken_over_from == LeaseHolder("instance-2", back.lease_epoch),
        "taken-over-from",
        f"a takeover from itself named {own.taken_over_from}, expected instance-2 at {back.lease_epoch}",
    )


async def execution_ids_once_across_tenants(ctx: CaseContext) -> None:
    """`save_execution_id_if_absent` inserts an id once, by the id alone whatever the
    tenant, from any instance; at once from three instances, exactly one inserts it."""
    w = World(ctx)
    execution = w.name("execution")
    first = await w.leases(0).save_execution_id_if_absent(TENANT, execution)
    expect(first is True, "execution-id-once", f"a new id answered {first}")
    expect(
        await w.leases(1).save_execution_id_if_absent(TENANT, execution) is False,
        "execution-id-once",
        "the same id was inserted twice",
    )
    expect(
        await w.leases(1).save_execution_id_if_absent(OTHER_TENANT, execution) is False,
        "execution-id-once",
        "the same id was inserted again for another tenant: one id is one execution, whatever the tenant",
    )
    expect(
        await w.leases(0).save_execution_id_if_absent(OTHER_TENANT, w.name("execution")) is True,
        "execution-id-once",
        "another tenant's new id was refused",
    )

    async def one(round_: Round) -> None:
        execution = w.name("execution")
        outcomes = await race(
            round_,
            lambda: w.leases(0).save_execution_id_if_absent(TENANT, execution),
            lambda: w.leases(1).save_execution_id_if_absent(OTHER_TENANT, execution),
            lambda: w.leases(2).save_execution_id_if_absent(TENANT, execution),
        )
        inserted = [o.answer("save_execution_id_if_absent") for o in outcomes]
        expect(
            inserted.count(True) == 1,
            "execution-id-once",
            f"{round_}: three instances saving one id at once answered {inserted}",
        )

    await each_round(one)
