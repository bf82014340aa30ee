"""The lease races, round after round in both orders: takes of a new lease, takeovers of
an expired one, and a finish or a release against a take."""

from __future__ import annotations

from agboss_sql.contracts.types import LeaseHolder
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fencing import (
    LEASE_MS,
    TENANT,
    Round,
    World,
    each_round,
    expect,
    fail,
    race,
    rounds,
)

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
