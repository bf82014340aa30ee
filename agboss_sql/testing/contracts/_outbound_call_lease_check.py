"""The outbound-call cases of the lease check: `lease_state_of` in each state and at
expiry, an intent recorded or an attempt moved at expiry, a zombie's moves refused, and
the store's time deciding whatever the caller's clock says."""

from __future__ import annotations

import dataclasses

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.keys import attempt_owner_of
from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.types import AttemptRef, LeaseHolder, LeaseState, OutboundCallStatus
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fencing import (
    DATABASE_LEASE_MS,
    LEASE_MS,
    TENANT,
    World,
    expect,
    fail,
    key_of,
    on_database_time,
    past_database_lease,
    skew_text,
)
from agboss_sql.testing.contracts._outbound_call_support import (
    INTENT,
    CaseRun,
    _expect_call,
    _expect_fenced,
    _record,
)

# --- lease_state_of -----------------------------------------------------------------------


async def lease_states(ctx: CaseContext) -> None:
    """`lease_state_of` answers LIVE for a live lease at its token, ABSENT with no lease,
    RELEASED after a release, FINISHED after a finish and SUPERSEDED for an older token."""
    w = World(ctx)
    calls = w.calls(1)

    async def state(tree: str, token: int, want: LeaseState, what: str) -> None:
        got = await calls.lease_state_of(TENANT, tree, token)
        expect(
            got == want and isinstance(got, LeaseState),
            "atomic-lease-state",
            f"{what}: answered {got!r}, expected {want}",
        )

    live = w.name()
    await w.take(live, 0)
    await state(live, 1, LeaseState.LIVE, "a live lease")
    await state(w.name("never"), 1, LeaseState.ABSENT, "an execution with no lease")
    released = w.name()
    expect(
        await w.leases(0).release(await w.take(released, 0)), "no-stale-write", "release refused"
    )
    await state(released, 1, LeaseState.RELEASED, "a released lease")
    finished = w.name()
    expect(await w.leases(0).finish(await w.take(finished, 0)), "no-stale-write", "finish refused")
    await state(finished, 1, LeaseState.FINISHED, "a finished lease")
    moved = w.name()
    await w.take(moved, 0)
    await w.at(w.now + LEASE_MS)
    await w.take(moved, 1)
    await state(moved, 1, LeaseState.SUPERSEDED, "an epoch taken over")
    await state(moved, 2, LeaseState.LIVE, "the new epoch")


def _lease_state_at(offset: int, label: str) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        tree = w.name()
        start = w.now
        lease = await w.take(tree, 0)
        await w.at(start + LEASE_MS + offset)
        state = await w.calls(1).lease_state_of(TENANT, tree, 1)
        if offset < 0:
            expect(
                state == LeaseState.LIVE,
                "live-until-expiry",
                f"lease_state_of {label} expiry answered {state}",
            )
            expect(
                await w.leases(0).renew(lease, LEASE_MS) == LEASE_MS,
                "atomic-lease-state",
                f"lease_state_of {label} expiry closed the live lease: its holder could not renew",
            )
            return
        expect(
            state == LeaseState.SUPERSEDED,
            "live-until-expiry",
            f"lease_state_of {label} expiry answered {state}, expected superseded",
        )
        again = await w.calls(0).lease_state_of(TENANT, tree, 1)
        expect(
            again == LeaseState.SUPERSEDED,
            "atomic-lease-state",
            f"asked again, lease_state_of answered {again}: the expired lease was not closed as superseded",
        )
        leases = w.leases(0)
        expect(
            not await leases.release(lease),
            "atomic-lease-state",
            f"after lease_state_of answered superseded {label} expiry, the holder could still release its lease: it was not closed in the same step",
        )
        expect(
            not await leases.finish(lease),
            "atomic-lease-state",
            "after lease_state_of closed it, the holder could still finish its lease",
        )
        expect(
            await leases.renew(lease, LEASE_MS) is None,
            "atomic-lease-state",
            "after lease_state_of closed it, the holder could still renew",
        )
        try:
            written = await _record(w, key_of(lease))
        except ExecutionFencedError as exc:
            expect(
                exc.reason == FenceRefusal.SUPERSEDED,
                "no-stale-write",
                f"a write with a context lease_state_of closed was refused as {exc.reason}, "
                "where the lease was superseded",
            )
        else:
            fail("no-stale-write", f"a write with a context lease_state_of closed: {written}")
        taken = await w.take(tree, 2)
        expect(
            taken.lease_epoch == 2 and taken.taken_over_from == LeaseHolder("instance-1", 1),
            "taken-over-from",
            f"the take of a lease lease_state_of closed answered {taken}: it was taken over from instance-1 at 1",
        )

    run.__doc__ = f"`lease_state_of` {label} expiry: LIVE and nothing closed while live; else SUPERSEDED, closed in the same step, then taken over."
    return run


# --- the lease check ----------------------------------------------------------------------


def _record_at(offset: int, label: str) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        start = w.now
        lease = await w.take(w.name(), 0)
        key = key_of(lease)
        await w.at(start + LEASE_MS + offset)
        if offset < 0:
            saved = await _record(w, key)
            expect(
                saved.created,
                "live-until-expiry",
                f"recording an intent {label} expiry was refused",
            )
            return
        await _expect_fenced(
            f"recording an intent {label} expiry", key, _record(w, key), "live-until-expiry"
        )
        expect(
            await w.calls(1).get(key) is None,
            "live-until-expiry",
            f"a refused record {label} expiry left an intent",
        )

    run.__doc__ = (
        f"Recording an intent {label} expiry: accepted while live, else `ExecutionFencedError`."
    )
    return run


async def attempts_refused_at_expiry(ctx: CaseContext) -> None:
    """Claiming, completing and failing an attempt exactly at the lease's expiry are
    refused, and the call stays as it was."""
    w = World(ctx)
    start = w.now
    lease = await w.take(w.name(), 0)
    key = key_of(lease)
    recorded = (await _record(w, key)).call
    calls = w.calls(0)
    expect(
        await calls.mark_pending(key, recorded.attempt_ref, "owner-a"),
        "live-until-expiry",
        "a claim on a live lease was refused",
    )
    ref1 = AttemptRef(OutboundCallStatus.PENDING, 1, "owner-a")
    await w.at(start + LEASE_MS)
    await _expect_fenced(
        "claiming the next attempt at expiry",
        key,
        calls.mark_pending(key, ref1, "owner-b"),
        "live-until-expiry",
    )
    await _expect_fenced(
        "completing the attempt at expiry",
        key,
        calls.mark_completed(key, ref1, {"ok": 1}),
        "live-until-expiry",
    )
    await _expect_fenced(
        "failing the attempt at expiry",
        key,
        calls.mark_failed(key, ref1, {"no": 1}),
        "live-until-expiry",
    )
    want = dataclasses.replace(recorded, attempt=1, attempt_owner="owner-a")
    _expect_call(
        await calls.get(key), want, "live-until-expiry", "the call after refused moves", moved=True
    )


async def zombie_moves_no_call(ctx: CaseContext) -> None:
    """After a takeover the old epoch records, claims, completes and fails nothing; the new
    holder takes the intent over by claiming the next attempt and completes it."""
    w = World(ctx)
    tree = w.name()
    old = await w.take(tree, 0)
    key = key_of(old)
    recorded = (await _record(w, key)).call
    owner = attempt_owner_of(key)
    calls = w.calls(0)
    expect(
        await calls.mark_pending(key, recorded.attempt_ref, owner),
        "one-attempt-claim",
        "claim refused",
    )
    ref1 = AttemptRef(OutboundCallStatus.PENDING, 1, owner)
    await w.at(w.now + LEASE_MS)
    new = await w.take(tree, 1)
    await _expect_fenced(
        "the zombie recording a new intent", key, _record(w, key_of(old, step_key="step-2"))
    )
    await _expect_fenced(
        "the zombie claiming the next attempt", key, calls.mark_pending(key, ref1, owner)
    )
    await _expect_fenced(
        "the zombie completing its attempt", key, calls.mark_completed(key, ref1, {"ok": 1})
    )
    await _expect_fenced(
        "the zombie failing its attempt", key, calls.mark_failed(key, ref1, {"no": 1})
    )
    expect(
        await w.calls(1).get(key_of(old, step_key="step-2")) is None,
        "no-stale-write",
        "the zombie's refused record left an intent",
    )
    state = await w.calls(1).lease_state_of(TENANT, tree, 1)
    expect(
        state == LeaseState.SUPERSEDED,
        "atomic-lease-state",
        f"the zombie's lease state answered {state}",
    )
    new_key = key_of(new)
    current = await w.calls(1).get(new_key)
    if current is None:
        fail(
            "intent-recorded",
            "the new holder could not read the intent recorded under the old epoch",
        )
    expect(
        current.attempt_ref == ref1,
        "no-stale-write",
        f"the zombie's refused moves changed the call: {current}",
    )
    new_owner = attempt_owner_of(new_key)
    expect(
        await w.calls(1).mark_pending(new_key, ref1, new_owner),
        "one-attempt-claim",
        "the new holder's claim of the next attempt was refused",
    )
    ref2 = AttemptRef(OutboundCallStatus.PENDING, 2, new_owner)
    expect(
        await w.calls(1).mark_completed(new_key, ref2, {"ok": 2}),
        "one-attempt-claim",
        "the new holder's completion was refused",
    )
    await _expect_fenced(
        "the zombie completing after the new holder",
        key,
        calls.mark_completed(key, ref1, {"ok": 1}),
    )


# --- the store's time ---------------------------------------------------------------------


def _store_time(skew_ms: int) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        start = w.now
        mine = w.name()
        theirs = w.name()
        lease = await w.take(mine, 1, skew_ms=skew_ms)
        await w.take(theirs, 0)
        calls = w.calls(1, skew_ms=skew_ms)
        what = f"instance-2, its own clock {skew_text(skew_ms)}"
        key = key_of(lease)
        await w.at(start + LEASE_MS - 1)
        saved = await calls.save_if_absent(key, INTENT, w.now)
        expect(
            saved.created,
            "store-time",
            f"{what}, recording 1 ms before its lease's expiry by the store's time was refused",
        )
        state = await calls.lease_state_of(TENANT, theirs, 1)
        expect(
            state == LeaseState.LIVE,
            "store-time",
            f"{what}, asking about a lease 1 ms before its expiry got {state}",
        )
        await w.at(start + LEASE_MS)
        await _expect_fenced(
            f"{what}, claiming at its lease's expiry",
            key,
            calls.mark_pending(key, saved.call.attempt_ref, "owner"),
            "store-time",
        )
        state = await calls.lease_state_of(TENANT, theirs, 1)
        expect(
            state == LeaseState.SUPERSEDED,
            "store-time",
            f"{what}, asking about a lease at its expiry got {state}",
        )

    run.__doc__ = f"With the caller's own clock off by {skew_text(skew_ms)}, the store's time decides its calls and lease states."
    return run


async def database_time_decides(ctx: CaseContext) -> None:
    """On the database's own time (`StoreClock()`), whatever the caller's own clock says
    (10 x lease ahead or behind): an intent is recorded and a lease is LIVE while the lease
    lasts; once it ran out the lease is SUPERSEDED, closed, and a claim refused."""
    await on_database_time(ctx)
    w = World(ctx)
    ahead, behind = 10 * DATABASE_LEASE_MS, -10 * DATABASE_LEASE_MS
    tree = w.name()
    lease = await w.leases(0).acquire(TENANT, tree, DATABASE_LEASE_MS)
    if lease is None:
        fail("live-until-expiry", "a new lease was refused on database time")
    key = key_of(lease)
    saved = await _record(w, key, instance=1, skew_ms=ahead)
    expect(
        saved.created,
        "store-time",
        f"recording on a live lease, the caller's clock {skew_text(ahead)}, was refused",
    )
    state = await w.calls(1, skew_ms=ahead).lease_state_of(TENANT, tree, 1)
    expect(
        state == LeaseState.LIVE,
        "store-time",
        f"a live lease on database time, asked with the caller's clock {skew_text(ahead)}, is {state}",
    )
    await past_database_lease()
    state = await w.calls(1, skew_ms=behind).lease_state_of(TENANT, tree, 1)
    expect(
        state == LeaseState.SUPERSEDED,
        "store-time",
        f"a lease that ran out on database time, asked with the caller's clock {skew_text(behind)}, is {state}",
    )
    expect(
        not await w.leases(0).release(lease),
        "atomic-lease-state",
        "lease_state_of answered superseded on database time but left the lease open",
    )
    await _expect_fenced(
        "claiming after the lease ran out on database time",
        key,
        w.calls(1, skew_ms=behind).mark_pending(key, saved.call.attempt_ref, "owner"),
        "store-time",
    )
