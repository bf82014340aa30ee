"""The lease cases of grants and renewals: epoch one of a new lease, a live lease refused
to everyone, tenants apart, identifiers checked, and a renewal that never shortens,
answers its own lease and extends from now."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.types import LeaseHolder
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._execution_lease_support import _expect_lease, _lease
from agboss_sql.testing.contracts._fencing import (
    LEASE_MS,
    OTHER_TENANT,
    TENANT,
    World,
    expect,
    fail,
)

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
