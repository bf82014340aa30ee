"""The outbound-call races: `lease_state_of` against a late renewal, a take and a finish,
two attempts of one intent, two executions recording one business key, and a zombie's
record and claim against its lease's hand-over."""

from __future__ import annotations

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.keys import attempt_owner_of
from agboss_sql.contracts.types import (
    AttemptRef,
    ExecutionLease,
    LeaseHolder,
    LeaseState,
    OutboundCallSaved,
    OutboundCallStatus,
)
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fencing import (
    LEASE_MS,
    TENANT,
    Round,
    World,
    each_round,
    expect,
    fail,
    key_of,
    race,
)
from agboss_sql.testing.contracts._outbound_call_support import _record

# --- races --------------------------------------------------------------------------------


async def lease_state_against_late_renewal(ctx: CaseContext) -> None:
    """1 ms before expiry the holder renews while another instance lets the time reach
    the expiry and asks `lease_state_of`, round after round in both orders: either the
    renewal lands first and the lease is LIVE, or the lease is SUPERSEDED, closed, and the
    renewal refused; never a renewed lease reported superseded."""
    w = World(ctx)

    async def one(round_: Round) -> None:
        tree = w.name()
        start = w.now
        lease = await w.take(tree, 0)
        await w.at(start + LEASE_MS - 1)

        async def reach_expiry_and_ask() -> LeaseState:
            await ctx.clock.advance(1)
            return await w.calls(1).lease_state_of(TENANT, tree, 1)

        renewal, asked = await race(
            round_, lambda: w.leases(0).renew(lease, LEASE_MS), reach_expiry_and_ask
        )
        renewed, state = renewal.answer("renew"), asked.answer("lease_state_of")
        if renewed is not None:
            expect(
                state == LeaseState.LIVE,
                "atomic-lease-state",
                f"{round_}: the holder's renewal was accepted ({renewed} ms left) and lease_state_of "
                f"answered {state}: two senders",
            )
            expect(
                await w.leases(0).renew(lease, LEASE_MS) is not None,
                "atomic-lease-state",
                f"{round_}: the renewed lease was closed",
            )
        else:
            expect(
                state == LeaseState.SUPERSEDED,
                "live-until-expiry",
                f"{round_}: the renewal was refused and lease_state_of at expiry answered {state}",
            )
            expect(
                not await w.leases(0).release(lease),
                "atomic-lease-state",
                f"{round_}: lease_state_of answered superseded but left the lease open",
            )

    await each_round(one)


async def lease_state_against_take(ctx: CaseContext) -> None:
    """Past the lease, `lease_state_of` at its token races a third instance's take, round
    after round in both orders: the old epoch is SUPERSEDED, the take is granted the next
    epoch (taken over from the old one), and the new lease is never closed by the
    question about the old one."""
    w = World(ctx)

    async def one(round_: Round) -> None:
        tree = w.name()
        start = w.now
        await w.take(tree, 0)
        await w.at(start + LEASE_MS)
        asked, take = await race(
            round_,
            lambda: w.calls(1).lease_state_of(TENANT, tree, 1),
            lambda: w.leases(2).acquire(TENANT, tree, LEASE_MS),
        )
        state, taken = asked.answer("lease_state_of"), take.answer("acquire")
        expect(
            state == LeaseState.SUPERSEDED,
            "atomic-lease-state",
            f"{round_}: lease_state_of of an expired epoch answered {state}",
        )
        if taken is None:
            fail(
                "atomic-lease-state",
                f"{round_}: the take of an expired lease was refused while lease_state_of asked about it",
            )
        expect(
            taken.lease_epoch == 2 and taken.taken_over_from == LeaseHolder("instance-1", 1),
            "taken-over-from",
            f"{round_}: the take answered {taken}",
        )
        remaining = await w.leases(2).renew(taken, LEASE_MS)
        expect(
            remaining == LEASE_MS,
            "atomic-lease-state",
            f"{round_}: the new holder's renewal answered {remaining}: lease_state_of about epoch 1 closed epoch 2",
        )
        fresh = await w.calls(0).lease_state_of(TENANT, tree, 2)
        expect(
            fresh == LeaseState.LIVE,
            "atomic-lease-state",
            f"{round_}: the new epoch's state is {fresh}",
        )

    await each_round(one)


async def lease_state_against_finish(ctx: CaseContext) -> None:
    """Past the lease, the holder's finish races `lease_state_of`, round after round in
    both orders: either the finish lands and the answer is FINISHED, or the lease is
    SUPERSEDED and the finish refused."""
    w = World(ctx)

    async def one(round_: Round) -> None:
        tree = w.name()
        start = w.now
        lease = await w.take(tree, 0)
        await w.at(start + LEASE_MS)
        finish, asked = await race(
            round_,
            lambda: w.leases(0).finish(lease),
            lambda: w.calls(1).lease_state_of(TENANT, tree, 1),
        )
        finished, state = finish.answer("finish"), asked.answer("lease_state_of")
        expect(
            (finished and state == LeaseState.FINISHED)
            or (not finished and state == LeaseState.SUPERSEDED),
            "atomic-lease-state",
            f"{round_}: finish answered {finished} and lease_state_of {state}",
        )
        late = await w.leases(2).acquire(TENANT, tree, LEASE_MS)
        if finished:
            expect(
                late is None,
                "no-takeover-of-finished-work",
                f"{round_}: the finished lease was granted ({late})",
            )
        else:
            expect(
                late is not None and late.lease_epoch == 2,
                "atomic-lease-state",
                f"{round_}: the superseded lease's take answered {late}",
            )

    await each_round(one)


async def two_attempts_of_one_intent(ctx: CaseContext) -> None:
    """Two instances claim the next attempt of one intent at once, and then an ending races
    a newer claim, round after round in both orders: exactly one of each pair wins."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)

    async def one(round_: Round) -> None:
        key = key_of(lease, step_key=f"step-{round_.number}-{round_.swapped}")
        recorded = (await _record(w, key)).call
        claims = await race(
            round_,
            lambda: w.calls(0).mark_pending(key, recorded.attempt_ref, "owner-a"),
            lambda: w.calls(1).mark_pending(key, recorded.attempt_ref, "owner-b"),
        )
        won = [o.answer("mark_pending") for o in claims]
        expect(
            won.count(True) == 1,
            "one-attempt-claim",
            f"{round_}: two claims of attempt 1 answered {won}: two senders",
        )
        winner = "owner-a" if won[0] else "owner-b"
        current = await w.calls(1).get(key)
        expect(
            current is not None
            and current.attempt_ref == AttemptRef(OutboundCallStatus.PENDING, 1, winner),
            "one-attempt-claim",
            f"{round_}: after the claims the call is {current}",
        )
        ref1 = AttemptRef(OutboundCallStatus.PENDING, 1, winner)
        ending, newer = await race(
            round_,
            lambda: w.calls(0).mark_completed(key, ref1, {"ok": True}),
            lambda: w.calls(1).mark_pending(key, ref1, "owner-c"),
        )
        ended, claimed = ending.answer("mark_completed"), newer.answer("mark_pending")
        expect(
            ended != claimed,
            "one-attempt-claim",
            f"{round_}: an ending and a newer claim of attempt 1 answered {ended} and {claimed}",
        )

    await each_round(one)


async def two_executions_record_one_business_key(ctx: CaseContext) -> None:
    """Two executions record one business key at once, round after round in both orders:
    one intent is created, and both get that row."""
    w = World(ctx)
    first = await w.take(w.name(), 0)
    second = await w.take(w.name(), 1)

    async def one(round_: Round) -> None:
        business = f"payment-{w.uid}-{round_.number}-{round_.swapped}"
        keys = (
            key_of(first, "pay", business_key=business, fingerprint="fp"),
            key_of(second, "pay", step_key="step-b", business_key=business, fingerprint="fp"),
        )
        outcomes = await race(
            round_,
            lambda: _record(w, keys[0], {"by": "a"}, instance=0),
            lambda: _record(w, keys[1], {"by": "b"}, instance=1),
        )
        saved = [o.answer("save_if_absent") for o in outcomes]
        created = [s.created for s in saved]
        expect(
            created.count(True) == 1,
            "one-effect-per-key",
            f"{round_}: two records of one business key answered created={created}",
        )
        stored = await w.calls(0).get(keys[0])
        for s in saved:
            expect(
                s.call == stored,
                "one-effect-per-key",
                f"{round_}: a record answered {s.call}, the stored row is {stored}",
            )

    await each_round(one)


async def zombie_record_and_claim_race_hand_over(ctx: CaseContext) -> None:
    """A zombie's record, then a zombie's claim, race its lease's release, the next take and
    the new holder's record or claim of the same key, round after round in both orders: one
    record, one claim; the zombie is either first or refused, never answered as if it
    passed the lease check after the hand-over."""
    w = World(ctx)

    async def one(round_: Round) -> None:
        await _zombie_record_race(w, round_)
        await _zombie_claim_race(w, round_)

    await each_round(one)


async def _hand_over(w: World, round_: Round, tree: str, old: ExecutionLease) -> ExecutionLease:
    if not await w.leases(0).release(old):
        fail("no-stale-write", f"{round_}: the holder's release of its live lease was refused")
    return await w.take(tree, 1)


async def _zombie_record_race(w: World, round_: Round) -> None:
    tree = w.name()
    old = await w.take(tree, 0)

    async def holder() -> tuple[ExecutionLease, OutboundCallSaved]:
        new = await _hand_over(w, round_, tree, old)
        return new, await _record(w, key_of(new), {"by": "holder"}, instance=1)

    zombie, handed = await race(round_, lambda: _record(w, key_of(old), {"by": "zombie"}), holder)
    new, saved = handed.answer("the new holder's record")
    if zombie.raised:
        if not isinstance(zombie.error, ExecutionFencedError):
            fail("store-error", f"{round_}: the zombie's record raised {zombie.error!r}")
        expect(
            saved.created and saved.call.token == new.lease_epoch,
            "one-effect-per-key",
            f"{round_}: the zombie was refused and the new holder's record answered {saved}",
        )
        return
    mine: OutboundCallSaved = zombie.value
    expect(
        mine.created,
        "no-stale-write",
        f"{round_}: the zombie's record answered the new holder's row ({mine.call.intent}): it "
        "passed the lease check after its lease was handed over",
    )
    expect(
        not saved.created
        and saved.call.intent == {"by": "zombie"}
        and saved.call.token == old.lease_epoch,
        "one-effect-per-key",
        f"{round_}: the zombie recorded first, yet the new holder's record answered {saved}",
    )


async def _zombie_claim_race(w: World, round_: Round) -> None:
    tree = w.name()
    old = await w.take(tree, 0)
    old_key = key_of(old)
    ref0 = (await _record(w, old_key)).call.attempt_ref

    async def holder() -> bool:
        new = await _hand_over(w, round_, tree, old)
        new_key = key_of(new)
        return await w.calls(1).mark_pending(new_key, ref0, attempt_owner_of(new_key))

    zombie, handed = await race(
        round_, lambda: w.calls(0).mark_pending(old_key, ref0, attempt_owner_of(old_key)), holder
    )
    holder_won = handed.answer("the new holder's claim")
    if zombie.raised:
        if not isinstance(zombie.error, ExecutionFencedError):
            fail("store-error", f"{round_}: the zombie's claim raised {zombie.error!r}")
        expect(
            holder_won,
            "one-attempt-claim",
            f"{round_}: the zombie was refused, and so was the new holder's claim",
        )
        return
    expect(
        zombie.value is True,
        "no-stale-write",
        f"{round_}: the zombie's claim answered False without a refusal: it passed the lease "
        "check after its lease was handed over",
    )
    expect(
        not holder_won,
        "one-attempt-claim",
        f"{round_}: the zombie's and the new holder's claims of attempt 1 both won",
    )
