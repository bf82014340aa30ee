"""The lease cases of time: acquire, renew, yield and reclaim 1 ms before / at / after
expiry, and the store's time deciding whatever the instances' clocks say."""

from __future__ import annotations

from agboss_sql.contracts.types import LeaseHolder
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._execution_lease_support import CaseRun, _expect_lease, _lease
from agboss_sql.testing.contracts._fencing import (
    DATABASE_LEASE_MS,
    LEASE_MS,
    TENANT,
    World,
    expect,
    on_database_time,
    past_database_lease,
    skew_text,
)

# --- boundaries ---------------------------------------------------------------------------


def _acquire_at(offset: int, label: str) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        tree = w.name()
        start = w.now
        await w.take(tree, 0)
        await w.at(start + LEASE_MS + offset)
        got = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
        if offset < 0:
            expect(
                got is None,
                "live-until-expiry",
                f"instance-2 took the lease {label} its expiry ({got}): it is live until "
                "expires_at > now no longer holds",
            )
            own = await w.leases(0).acquire(TENANT, tree, LEASE_MS)
            expect(
                own is None,
                "live-until-expiry",
                f"its holder re-took its own live lease {label} its expiry ({own})",
            )
            return
        _expect_lease(
            got,
            _lease(tree, "instance-2", 2, LEASE_MS, LeaseHolder("instance-1", 1)),
            "live-until-expiry",
            f"instance-2 taking the lease {label} its expiry (a lease is over at now >= expires_at)",
        )

    run.__doc__ = f"Another instance's acquire {label} expiry: refused while live, else a takeover at the next epoch."
    return run


def _renew_at(offset: int, label: str) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        tree = w.name()
        start = w.now
        lease = await w.take(tree, 0)
        await w.at(start + LEASE_MS + offset)
        remaining = await w.leases(0).renew(lease, LEASE_MS)
        if offset < 0:
            expect(
                remaining == LEASE_MS,
                "live-until-expiry" if remaining is None else "renewal-from-now",
                f"renew {label} expiry answered {remaining}, expected {LEASE_MS} ms left "
                "(expires_at = max(expires_at, now + lease_ms))",
            )
            return
        expect(
            remaining is None,
            "live-until-expiry",
            f"renew {label} expiry answered {remaining} ms left: a lease is over at "
            "now >= expires_at, for its holder too",
        )
        other = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
        expect(
            other is not None and other.lease_epoch == 2,
            "live-until-expiry",
            f"after a refused renewal {label} expiry, another instance's take answered {other}",
        )

    run.__doc__ = f"The holder's renew {label} expiry: the time left while live, else `None`."
    return run


def _yield_at(offset: int, label: str) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        tree = w.name()
        start = w.now
        lease = await w.take(tree, 0)
        await w.at(start + LEASE_MS + offset)
        yielded = await w.leases(0).yield_lease(lease)
        if offset < 0:
            expect(yielded, "live-until-expiry", f"yield {label} expiry was refused")
            other = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
            _expect_lease(
                other,
                _lease(tree, "instance-2", 2, LEASE_MS),
                "taken-over-from",
                "a take of a yielded lease (a hand-over, no takeover)",
            )
            return
        expect(
            not yielded,
            "live-until-expiry",
            f"yield {label} expiry was accepted: a lease is over at now >= expires_at",
        )
        back = await w.leases(0).reclaim(lease, LEASE_MS)
        expect(
            back is None,
            "live-until-expiry",
            f"reclaim after a refused yield {label} expiry answered {back}",
        )

    run.__doc__ = f"The holder's yield {label} expiry: accepted while live, else refused."
    return run


def _reclaim_at(offset: int, label: str) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        tree = w.name()
        start = w.now
        lease = await w.take(tree, 0)
        expect(
            await w.leases(0).yield_lease(lease),
            "live-until-expiry",
            "yield of a fresh lease refused",
        )
        await w.at(start + LEASE_MS + offset)
        back = await w.leases(0).reclaim(lease, LEASE_MS)
        if offset < 0:
            _expect_lease(
                back,
                _lease(tree, "instance-1", 2, LEASE_MS),
                "live-until-expiry",
                f"reclaim of a yielded lease {label} expiry",
            )
            return
        expect(
            back is None,
            "live-until-expiry",
            f"reclaim {label} expiry answered {back}: a lease is over at now >= expires_at",
        )
        other = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
        _expect_lease(
            other,
            _lease(tree, "instance-2", 2, LEASE_MS),
            "taken-over-from",
            f"a take after the refused reclaim {label} expiry (a yielded lease: no takeover)",
        )

    run.__doc__ = f"The holder's reclaim of its yielded lease {label} expiry: the next epoch while live, else `None`."
    return run


# --- the store's time ---------------------------------------------------------------------


def _store_time(skew_ms: int) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        tree = w.name()
        start = w.now
        await w.take(tree, 0)
        skewed = w.leases(1, skew_ms=skew_ms)
        what = f"instance-2, its own clock {skew_text(skew_ms)}"
        await w.at(start + LEASE_MS - 1)
        got = await skewed.acquire(TENANT, tree, LEASE_MS)
        expect(
            got is None,
            "store-time",
            f"{what}, took the lease 1 ms before it expired by the store's time ({got}): it decided by its own clock",
        )
        await w.at(start + LEASE_MS)
        got = await skewed.acquire(TENANT, tree, LEASE_MS)
        _expect_lease(
            got,
            _lease(tree, "instance-2", 2, LEASE_MS, LeaseHolder("instance-1", 1)),
            "store-time",
            f"{what}, taking the lease at its expiry by the store's time",
        )
        assert got is not None
        await w.at(start + 2 * LEASE_MS - 1)
        remaining = await skewed.renew(got, LEASE_MS)
        expect(
            remaining == LEASE_MS,
            "store-time",
            f"{what}, renewing 1 ms before its lease's expiry answered {remaining}",
        )
        await w.at(start + 3 * LEASE_MS - 1)
        remaining = await skewed.renew(got, LEASE_MS)
        expect(
            remaining is None,
            "store-time",
            f"{what}, renewing at its lease's expiry by the store's time answered {remaining}",
        )
        expect(
            not await skewed.yield_lease(got), "store-time", f"{what}, yielded its lease at expiry"
        )
        back = await w.leases(0).acquire(TENANT, tree, LEASE_MS)
        _expect_lease(
            back,
            _lease(tree, "instance-1", 3, LEASE_MS, LeaseHolder("instance-2", 2)),
            "store-time",
            "instance-1 taking back the lease the skewed instance let expire",
        )

    run.__doc__ = f"With the other instance's own clock off by {skew_text(skew_ms)}, every outcome is decided by the store's time."
    return run


async def database_time_decides(ctx: CaseContext) -> None:
    """On the database's own time (`StoreClock()`), whatever the instances' own clocks say
    (10 x lease ahead or behind): a live lease is refused and renewed, an expired one is
    refused to its holder and taken over, and the old epoch moves nothing."""
    await on_database_time(ctx)
    w = World(ctx)
    tree = w.name()
    ahead, behind = 10 * DATABASE_LEASE_MS, -10 * DATABASE_LEASE_MS
    lease = await w.leases(0).acquire(TENANT, tree, DATABASE_LEASE_MS)
    expect(
        lease is not None and 0 < lease.remaining_ms <= DATABASE_LEASE_MS,
        "remaining-exact",
        f"a take on database time answered {lease}",
    )
    assert lease is not None
    got = await w.leases(1, skew_ms=ahead).acquire(TENANT, tree, DATABASE_LEASE_MS)
    expect(
        got is None,
        "store-time",
        f"instance-2, its clock {skew_text(ahead)}, took a live lease on database time ({got})",
    )
    remaining = await w.leases(0).renew(lease, DATABASE_LEASE_MS)
    expect(
        remaining is not None and 0 < remaining <= DATABASE_LEASE_MS,
        "live-until-expiry",
        f"the holder's renewal of its live lease on database time answered {remaining}",
    )
    await past_database_lease()
    late = await w.leases(0).renew(lease, DATABASE_LEASE_MS)
    expect(
        late is None,
        "live-until-expiry",
        f"a renewal after the lease ran out on database time answered {late}",
    )
    taken = await w.leases(1, skew_ms=behind).acquire(TENANT, tree, DATABASE_LEASE_MS)
    expect(
        taken is not None
        and taken.lease_epoch == 2
        and taken.taken_over_from == LeaseHolder("instance-1", 1),
        "store-time",
        f"instance-2, its clock {skew_text(behind)}, taking the expired lease on database time got {taken}",
    )
    expect(
        not await w.leases(0).release(lease),
        "no-stale-write",
        "the old epoch released the new holder's lease",
    )
