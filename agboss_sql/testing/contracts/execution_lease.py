"""Contract suite of `ExecutionLeaseRepository` (docs/contracts.md): one owner at a time.

Every case runs on the case's virtual store time with two (or three) instances on one
backing store. A lease is live while `expires_at > now` and only then: the boundary
cases pin 1 ms before, exactly at and 1 ms after expiry for acquire, renew, yield and
reclaim. Epochs are never granted twice, a finished lease never again, a renewal never
shortens, a zombie moves nothing, `taken_over_from` tells a takeover from a hand-over,
and the races (two takes, finish or release against a take) run round after round in
both orders. The other instance's own clock is skewed by +-lease/2, +-lease and
+-10 x lease in "the store's time is the authority" cases, with unchanged outcomes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.types import ExecutionLease, LeaseHolder
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import (
    BOUNDARIES,
    DATABASE_LEASE_MS,
    LEASE_MS,
    OTHER_TENANT,
    SKEWS,
    TENANT,
    Round,
    World,
    each_round,
    expect,
    fail,
    on_database_time,
    past_database_lease,
    race,
    rounds,
    skew_text,
)
from agboss_sql.testing.contracts._limits import limit_cases
from agboss_sql.testing.contracts._matrix import move_cases

CONTRACT = "execution_lease"

CaseRun = Callable[[CaseContext], Awaitable[None]]


def _lease(
    tree: str,
    holder: str,
    epoch: int,
    remaining: int,
    taken_over_from: LeaseHolder | None = None,
    tenant: str = TENANT,
) -> ExecutionLease:
    return ExecutionLease(tenant, tree, holder, epoch, remaining, taken_over_from)


def _expect_lease(
    got: ExecutionLease | None, want: ExecutionLease, rule: str, what: str
) -> ExecutionLease:
    if got is None:
        fail(rule, f"{what}: refused, expected {want}")
    expect(got == want, rule, f"{what}: got {got}, expected {want}")
    return got


# --- grants -------------------------------------------------------------------------------


async def acquire_grants_epoch_one(ctx: CaseContext) -> None:
    """A new lease is granted at epoch 1 for `lease_ms`, to the calling instance, with no
    previous holder."""
    w = World(ctx)
    tree = w.name()
    lease = await w.leases(0).acquire(TENANT, tree, LEASE_MS)
    _expect_lease(lease, _lease(tree, "instance-1", 1, LEASE_MS), "lease-granted", "a new lease")


async def live_lease_refused_to_everyone(ctx: CaseContext) -> None:
    """A live lease is refused to every instance, its holder included, until it expires."""
    w = World(ctx)
    tree = w.name()
    start = w.now
    await w.take(tree, 0)
    for when in (start, start + LEASE_MS // 2, start + LEASE_MS - 1):
        await w.at(when)
        for instance in (1, 0):
            got = await w.leases(instance).acquire(TENANT, tree, LEASE_MS)
            expect(
                got is None,
                "one-live-holder",
                f"instance-{instance + 1} was granted {got} {start + LEASE_MS - when} ms before "
                "the live lease of instance-1 expired: two live holders",
            )


async def other_tenant_is_another_lease(ctx: CaseContext) -> None:
    """One lease per (tenant, execution): the same execution id in another tenant is
    another lease."""
    w = World(ctx)
    tree = w.name()
    await w.take(tree, 0)
    other = await w.leases(1).acquire(OTHER_TENANT, tree, LEASE_MS)
    _expect_lease(
        other,
        _lease(tree, "instance-2", 1, LEASE_MS, tenant=OTHER_TENANT),
        "lease-granted",
        "the same execution id in another tenant",
    )


async def long_identifiers_round_trip(ctx: CaseContext) -> None:
    """Identifiers of 255 characters (and non-ASCII ones) are kept whole: taken, refused to
    another instance, renewed and released by their exact texts."""
    w = World(ctx)
    tenant = (w.uid + "t" * 255)[:255]
    tree = (w.name() + "é" * 255)[:255]
    lease = await w.leases(0).acquire(tenant, tree, LEASE_MS)
    _expect_lease(
        lease,
        _lease(tree, "instance-1", 1, LEASE_MS, tenant=tenant),
        "lease-granted",
        "a lease of 255-character ids",
    )
    assert lease is not None
    expect(
        await w.leases(1).acquire(tenant, tree, LEASE_MS) is None,
        "one-live-holder",
        "a live lease of 255-character ids was granted twice",
    )
    shorter = tree[:-1]
    expect(
        await w.leases(1).acquire(tenant, shorter, LEASE_MS) is not None,
        "lease-granted",
        "an id one character shorter is another lease, but it was refused",
    )
    expect(
        await w.leases(0).renew(lease, LEASE_MS) == LEASE_MS,
        "live-until-expiry",
        "the holder's renewal of a live lease was refused",
    )
    expect(await w.leases(0).release(lease), "no-stale-write", "the holder's release was refused")


async def invalid_identifiers_refused(ctx: CaseContext) -> None:
    """An empty or over-long tenant or execution id is `InvalidIdentifierError`, and takes
    nothing."""
    w = World(ctx)
    tree = w.name()
    for tenant, execution in (("", tree), (TENANT, ""), ("t" * 256, tree), (TENANT, "e" * 256)):
        try:
            got = await w.leases(0).acquire(tenant, execution, LEASE_MS)
        except InvalidIdentifierError:
            continue
        fail(
            "identifiers",
            f"acquire({tenant[:20]!r}…, {execution[:20]!r}…) answered {got} instead of InvalidIdentifierError",
        )
    for tenant, execution in (("", tree), (TENANT, ""), (TENANT, "e" * 256)):
        try:
            saved = await w.leases(0).save_execution_id_if_absent(tenant, execution)
        except InvalidIdentifierError:
            continue
        fail(
            "identifiers",
            f"save_execution_id_if_absent({tenant[:20]!r}, {execution[:20]!r}…) answered {saved} instead of InvalidIdentifierError",
        )
    await w.take(tree, 1)


async def handed_back_leases_checked(ctx: CaseContext) -> None:
    """A lease handed back to renew, release, yield, reclaim or finish that is not an
    `ExecutionLease` of an identified execution at an int epoch (a text or bool epoch, an
    empty id, a tuple) is refused (`ValueError`, `InvalidIdentifierError`, `TypeError`)
    before anything moves: the real lease is still held, and renews."""
    w = World(ctx)
    tree = w.name()
    lease = await w.take(tree, 0)
    leases = w.leases(0)
    hand: Any = dataclasses.replace
    wrong: list[object] = [
        hand(lease, lease_epoch=str(lease.lease_epoch)),
        hand(lease, lease_epoch=True),
        hand(lease, execution_id=""),
        hand(lease, tenant_id=None),
        (lease.tenant_id, lease.execution_id, lease.lease_epoch),
    ]
    moves: list[tuple[str, Callable[[Any], Awaitable[object]]]] = [
        ("renew", lambda bad: leases.renew(bad, LEASE_MS)),
        ("release", leases.release),
        ("yield_lease", leases.yield_lease),
        ("reclaim", lambda bad: leases.reclaim(bad, LEASE_MS)),
        ("finish", leases.finish),
    ]
    for bad in wrong:
        for method, move in moves:
            try:
                got = await move(bad)
            except (ValueError, TypeError, InvalidIdentifierError):
                continue
            fail("arguments-checked", f"{method}({bad!r:.120}) answered {got}, expected a refusal")
    renewed = await leases.renew(lease, LEASE_MS)
    expect(
        renewed is not None,
        "arguments-checked",
        "the real lease could not be renewed after the refused moves",
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


# --- renewals -----------------------------------------------------------------------------


async def renewal_never_shortens(ctx: CaseContext) -> None:
    """A renewal for less than the time left keeps the longer expiry."""
    w = World(ctx)
    tree = w.name()
    start = w.now
    lease = await w.take(tree, 0)
    await w.at(start + 1_000)
    remaining = await w.leases(0).renew(lease, 1_000)
    expect(
        remaining == LEASE_MS - 1_000,
        "renewal-never-shortens",
        f"renewing for 1000 ms with {LEASE_MS - 1_000} ms left answered {remaining}",
    )
    await w.at(start + LEASE_MS - 1)
    got = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
    expect(
        got is None,
        "renewal-never-shortens",
        f"a short renewal shortened the lease: instance-2 took it 1 ms before its original expiry ({got})",
    )
    await w.at(start + LEASE_MS)
    got = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
    expect(
        got is not None,
        "renewal-from-now",
        "a renewal for 1000 ms kept the lease live past its original expiry",
    )


async def renewal_answers_its_own_lease(ctx: CaseContext) -> None:
    """A renewal answers the time left of the lease it renewed, whatever other leases exist:
    the same execution id's lease in another tenant, another execution's lease in the same
    tenant (each taken earlier, so with less time left)."""
    w = World(ctx)
    first, second = w.name(), w.name()
    start = w.now
    # The other leases, taken first: (OTHER_TENANT, first) and (TENANT, second).
    await w.take(first, 1, tenant=OTHER_TENANT)
    await w.take(second, 1, tenant=TENANT)
    await w.at(start + 10_000)
    # The renewed ones, each beside a lease of its execution id and one of its tenant.
    ours = [await w.take(first, 0, tenant=TENANT), await w.take(second, 0, tenant=OTHER_TENANT)]
    await w.at(start + 11_000)
    for lease in ours:
        remaining = await w.leases(0).renew(lease, 1_000)
        expect(
            remaining == LEASE_MS - 1_000,
            "renewal-never-shortens",
            f"renewing {lease.tenant_id}/{lease.execution_id} for 1000 ms with "
            f"{LEASE_MS - 1_000} ms left answered {remaining}: not its own lease's time left "
            "(its execution id has a lease in another tenant, its tenant another lease)",
        )


async def renewal_extends_from_now(ctx: CaseContext) -> None:
    """A renewal sets `expires_at = max(expires_at, now + lease_ms)`: from now, not from the
    old expiry, and answers exactly the time left."""
    w = World(ctx)
    tree = w.name()
    start = w.now
    lease = await w.take(tree, 0)
    await w.at(start + 10_000)
    remaining = await w.leases(0).renew(lease, LEASE_MS)
    expect(
        remaining == LEASE_MS,
        "renewal-from-now",
        f"renewing for {LEASE_MS} ms 10000 ms after the take answered {remaining} ms left, "
        f"expected {LEASE_MS} (now + lease_ms; {2 * LEASE_MS - 10_000} would be the old end + lease_ms)",
    )
    renewed_until = start + 10_000 + LEASE_MS
    await w.at(renewed_until - 1)
    got = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
    expect(
        got is None,
        "renewal-from-now",
        f"the renewed lease was taken 1 ms before its new expiry ({got})",
    )
    longer = await w.leases(0).renew(lease, 2 * LEASE_MS)
    expect(
        longer == 2 * LEASE_MS,
        "renewal-from-now",
        f"renewing for {2 * LEASE_MS} ms answered {longer}",
    )
    await w.at(renewed_until - 1 + 2 * LEASE_MS)
    got = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
    _expect_lease(
        got,
        _lease(tree, "instance-2", 2, LEASE_MS, LeaseHolder("instance-1", 1)),
        "renewal-from-now",
        "a take at the renewed lease's expiry",
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


# --- races --------------------------------------------------------------------------------


async def concurrent_takes_of_a_new_lease(ctx: CaseContext) -> None:
    """Three instances acquiring one new lease at once: exactly one holder, at epoch 1."""
    w = World(ctx)

    async def one(round_: Round) -> None:
        tree = w.name()
        outcomes = await race(
            round_, *(lambda i=i: w.leases(i).acquire(TENANT, tree, LEASE_MS) for i in range(3))
        )
        granted = [o.answer("acquire") for o in outcomes]
        holders = [g for g in granted if g is not None]
        expect(
            len(holders) == 1,
            "one-live-holder",
            f"{round_}: three takes of one new lease granted {holders}: two live holders",
        )
        expect(
            holders[0].lease_epoch == 1,
            "one-live-holder",
            f"{round_}: the first grant was epoch {holders[0].lease_epoch}",
        )

    await each_round(one)


async def concurrent_takeovers_of_an_expired_lease(ctx: CaseContext) -> None:
    """Three instances (its holder among them) taking one expired lease at once: exactly one
    holder, at the next epoch, taken over from the expired one."""
    w = World(ctx)

    async def one(round_: Round) -> None:
        tree = w.name()
        await w.take(tree, 0)
        await w.at(w.now + LEASE_MS)
        outcomes = await race(
            round_, *(lambda i=i: w.leases(i).acquire(TENANT, tree, LEASE_MS) for i in range(3))
        )
        granted = [o.answer("acquire") for o in outcomes]
        holders = [g for g in granted if g is not None]
        expect(
            len(holders) == 1,
            "one-live-holder",
            f"{round_}: three takeovers of one expired lease granted {holders}: two live holders",
        )
        expect(
            holders[0].lease_epoch == 2
            and holders[0].taken_over_from == LeaseHolder("instance-1", 1),
            "one-live-holder",
            f"{round_}: the takeover answered {holders[0]}",
        )

    await each_round(one)


async def finish_against_take_past_the_lease(ctx: CaseContext) -> None:
    """The holder's finish racing another instance's take of its expired lease: exactly one
    of them wins; a finished lease is not taken, a taken one is not finished."""
    w = World(ctx)

    async def one(round_: Round) -> None:
        tree = w.name()
        lease = await w.take(tree, 0)
        await w.at(w.now + LEASE_MS)
        finish, take = await race(
            round_,
            lambda: w.leases(0).finish(lease),
            lambda: w.leases(1).acquire(TENANT, tree, LEASE_MS),
        )
        finished, taken = finish.answer("finish"), take.answer("acquire")
        if finished and taken is not None:
            fail(
                "no-takeover-of-finished-work",
                f"{round_}: the finish was accepted and the take granted {taken}: finished work taken over",
            )
        expect(
            finished or taken is not None,
            "no-stale-write",
            f"{round_}: neither the finish nor the take of an expired lease was accepted",
        )
        late = await w.leases(2).acquire(TENANT, tree, LEASE_MS)
        expect(
            late is None,
            "one-live-holder",
            f"{round_}: after the race a third instance was granted {late}",
        )

    await each_round(one)


async def _release_against_take_round(w: World, round_: Round, past: bool) -> None:
    tree = w.name()
    start = w.now
    lease = await w.take(tree, 0)
    await w.at(start + LEASE_MS - (0 if past else 1))
    release, take = await race(
        round_,
        lambda: w.leases(0).release(lease),
        lambda: w.leases(1).acquire(TENANT, tree, LEASE_MS),
    )
    released, taken = release.answer("release"), take.answer("acquire")
    when = f"{round_}, {'past' if past else '1 ms before the end of'} the lease"
    if not past:
        expect(
            released,
            "no-stale-write",
            f"{when}: the holder's release of its live lease was refused",
        )
        if taken is None:
            taken = await w.leases(1).acquire(TENANT, tree, LEASE_MS)
        if taken is None or taken.taken_over_from is not None:
            fail(
                "taken-over-from",
                f"{when}: the take after the release answered {taken}, expected a hand-over",
            )
    elif taken is None:
        fail("live-until-expiry", f"{when}: the take of an expired lease was refused")
    elif released:
        expect(
            taken.taken_over_from is None,
            "no-stale-write",
            f"{when}: the release was accepted yet the take names a takeover "
            f"{taken.taken_over_from}: the release landed after the take",
        )
    else:
        expect(
            taken.taken_over_from == LeaseHolder("instance-1", 1),
            "taken-over-from",
            f"{when}: the release lost, yet the take named {taken.taken_over_from}",
        )
    remaining = await w.leases(1).renew(taken, LEASE_MS)
    expect(
        remaining == LEASE_MS,
        "no-stale-write",
        f"{when}: the new holder's renewal answered {remaining}: the old epoch's release reached its lease",
    )


async def release_against_take(ctx: CaseContext) -> None:
    """The holder's release racing another instance's take, on a live lease and past it:
    the take wins only after the release on a live lease; past it the release counts only
    before the take, and the take names a takeover exactly when the release lost."""
    w = World(ctx)
    for past in (False, True):
        for round_ in rounds():
            await _release_against_take_round(w, round_, past)


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


def cases() -> list[Case]:
    """The lease cases (the lease store has no opt-out: none is marked fencing)."""
    named: list[tuple[str, CaseRun]] = [
        ("acquire grants epoch 1 of a new lease", acquire_grants_epoch_one),
        (
            "a live lease is refused to every instance, its holder included",
            live_lease_refused_to_everyone,
        ),
        ("the same execution in another tenant is another lease", other_tenant_is_another_lease),
        ("255-character identifiers round-trip", long_identifiers_round_trip),
        ("invalid identifiers are refused", invalid_identifiers_refused),
        (
            "a lease handed back that is not one is refused before anything moves",
            handed_back_leases_checked,
        ),
    ]
    for offset, label in BOUNDARIES:
        outcome = "is refused" if offset < 0 else "takes the lease over"
        named.append((f"acquire {label} expiry {outcome}", _acquire_at(offset, label)))
    for offset, label in BOUNDARIES:
        outcome = "renews" if offset < 0 else "is refused"
        named.append((f"renew {label} expiry {outcome}", _renew_at(offset, label)))
    for offset, label in BOUNDARIES:
        outcome = "yields" if offset < 0 else "is refused"
        named.append((f"yield {label} expiry {outcome}", _yield_at(offset, label)))
    for offset, label in BOUNDARIES:
        outcome = "takes the next epoch" if offset < 0 else "is refused"
        named.append((f"reclaim {label} expiry {outcome}", _reclaim_at(offset, label)))
    named += [
        ("a renewal never shortens", renewal_never_shortens),
        ("a renewal answers its own lease's time left", renewal_answers_its_own_lease),
        ("a renewal extends from now, not from the old expiry", renewal_extends_from_now),
        ("epochs grow by one and are never granted twice", epochs_grow_by_one),
        ("a finished lease is never granted again", finished_never_granted_again),
        ("a zombie renews, yields, reclaims, releases and finishes nothing", zombie_moves_nothing),
        ("a released lease moves no more", released_lease_moves_nothing),
        ("a yielded lease is taken by another, not reclaimed", yielded_lease_moves),
        (
            "only the holder moves its lease, and a lease never granted moves nothing",
            only_the_holder_moves_its_lease,
        ),
        ("reclaim needs a lease its holder yielded and still holds", reclaim_needs_a_yielded_lease),
        (
            "lease_ms is a positive whole number of milliseconds",
            lease_ms_is_a_positive_whole_number,
        ),
        ("taken_over_from names a takeover, also from itself", taken_over_from_names_takeovers),
        (
            "save_execution_id_if_absent inserts an id once across tenants",
            execution_ids_once_across_tenants,
        ),
        ("race: three takes of a new lease give one holder", concurrent_takes_of_a_new_lease),
        (
            "race: three takeovers of an expired lease give one holder",
            concurrent_takeovers_of_an_expired_lease,
        ),
        ("race: finish against a take past the lease", finish_against_take_past_the_lease),
        ("race: release against a take", release_against_take),
    ]
    for skew in SKEWS:
        named.append(
            (
                f"the store's time is the authority with the other clock {skew_text(skew)}",
                _store_time(skew),
            )
        )
    named.append(("database time decides, whatever the instances' clocks", database_time_decides))
    return [Case(CONTRACT, name, run) for name, run in named] + move_cases() + limit_cases(CONTRACT)


__all__ = ["CONTRACT", "cases"]
