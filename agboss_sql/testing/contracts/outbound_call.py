"""Contract suite of `OutboundCallRepository` (docs/contracts.md): one send per key.

An intent is recorded once per key and moved by compare-and-set on the attempt the
caller read; every fenced method checks the lease and the scope's mark in the step that
reads or writes the intent, and `lease_state_of` closes an expired lease in the step
that reads it. The cases marked fencing (skipped, with a note, for a store that opts out
of the lease check) are those only an atomic lease check passes: a stale or expired
lease refused 1 ms before / at / after expiry, the zombie's record and claim racing its
lease's hand-over, `lease_state_of` racing a late renewal, a take and a finish, and the
store's time deciding whatever the caller's own clock says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from agboss_sql.contracts.errors import (
    ExecutionFencedError,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
)
from agboss_sql.contracts.keys import attempt_owner_of, pending_outbound_call_of
from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.stores import OutboundCallRepository
from agboss_sql.contracts.types import (
    AttemptRef,
    ExecutionLease,
    FencedEffectKey,
    LeaseHolder,
    LeaseState,
    OutboundCall,
    OutboundCallSaved,
    OutboundCallStatus,
)
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
    key_of,
    on_database_time,
    past_database_lease,
    race,
    skew_text,
    unreplayable_keys,
)
from agboss_sql.testing.contracts._matrix import write_cases

CONTRACT = "outbound_call"

CaseRun = Callable[[CaseContext], Awaitable[None]]

INTENT = {"charge": {"amount": 1250, "currency": "EUR"}, "to": "acct-ü", "tags": [1, None]}
BAD_NAMES = ("", "has space", "x" * 101, "a/b")
BAD_BUSINESS_KEYS = ("", "   ", "tab\there", "k" * 256)


def _call_problem(got: object, want: OutboundCall, *, moved: bool) -> str | None:
    """The first field of `got` that differs from `want` (`updated_at` is not compared once
    the call has moved), or `None`."""
    if type(got) is not OutboundCall:
        return f"read back a {type(got).__name__}, not an OutboundCall"
    for field in dataclasses.fields(OutboundCall):
        if moved and field.name == "updated_at":
            continue
        g, v = getattr(got, field.name), getattr(want, field.name)
        if g != v:
            return f"{field.name} is {g!r:.200}, expected {v!r:.200}"
    status: object = got.status
    if not isinstance(status, OutboundCallStatus):
        return f"status is a {type(status).__name__}, not an OutboundCallStatus"
    return None


def _expect_call(
    got: object, want: OutboundCall, rule: str, what: str, *, moved: bool = False
) -> None:
    problem = _call_problem(got, want, moved=moved)
    if problem is not None:
        fail(rule, f"{what}: {problem}")


async def _record(
    w: World, key: FencedEffectKey, intent: Any = INTENT, *, instance: int = 0, skew_ms: int = 0
) -> OutboundCallSaved:
    return await w.calls(instance, skew_ms=skew_ms).save_if_absent(key, intent, w.now)


async def _expect_fenced(
    what: str, key: FencedEffectKey, call: Awaitable[Any], rule: str = "no-stale-write"
) -> None:
    try:
        got = await call
    except ExecutionFencedError as exc:
        expect(
            exc.scope_key == key.scope_key and exc.token == key.token,
            "no-stale-write",
            f"{what}: the refusal names {exc.scope_key!r} at {exc.token}",
        )
        return
    fail(rule, f"{what}: accepted ({got})")


# --- intents and attempts -----------------------------------------------------------------


async def records_pending_intent_once(ctx: CaseContext) -> None:
    """`save_if_absent` records `pending_outbound_call_of(key, intent, recorded_at)` exactly
    (JSON intent, attempt 0 under the key's lease and token); the same key again, from
    either instance, answers the stored row unchanged; `get` reads it from any instance,
    also after the lease is released."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    key = key_of(lease)
    recorded_at = w.now
    want = pending_outbound_call_of(key, INTENT, recorded_at)
    saved = await _record(w, key)
    expect(
        saved.created is True,
        "intent-recorded",
        f"the first record answered created={saved.created}",
    )
    _expect_call(saved.call, want, "intent-recorded", "the recorded intent")
    await w.at(w.now + 5)
    for instance in (1, 0):
        again = await _record(w, key, {"other": "intent"}, instance=instance)
        expect(
            again.created is False,
            "one-effect-per-key",
            f"the same key recorded twice (instance-{instance + 1})",
        )
        _expect_call(again.call, want, "intent-recorded", "the row answered to a second record")
    expect(await w.leases(0).release(lease), "no-stale-write", "release refused")
    for instance in (0, 1):
        _expect_call(
            await w.calls(instance).get(key),
            want,
            "intent-recorded",
            f"get by instance-{instance + 1}",
        )
    expect(
        await w.calls(1).get(key_of(lease, step_key="step-2")) is None,
        "intent-recorded",
        "get of a key never recorded answered a call",
    )


async def claims_attempts_by_compare_and_set(ctx: CaseContext) -> None:
    """`mark_pending` claims the next attempt only at the (status, attempt, owner) the
    caller read; a stale expectation changes nothing."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    key = key_of(lease)
    recorded = (await _record(w, key)).call
    ref0 = recorded.attempt_ref
    expect(
        await w.calls(1).mark_pending(key, ref0, "owner-b"),
        "one-attempt-claim",
        "the claim at the row's attempt was refused",
    )
    want = dataclasses.replace(recorded, attempt=1, attempt_owner="owner-b")
    _expect_call(
        await w.calls(0).get(key), want, "one-attempt-claim", "the claimed call", moved=True
    )
    for stale in (
        ref0,
        AttemptRef(OutboundCallStatus.PENDING, 1, "owner-x"),
        AttemptRef(OutboundCallStatus.FAILED, 1, "owner-b"),
    ):
        expect(
            not await w.calls(0).mark_pending(key, stale, "owner-c"),
            "one-attempt-claim",
            f"a claim expecting {stale} was accepted",
        )
    _expect_call(
        await w.calls(1).get(key),
        want,
        "one-attempt-claim",
        "the call after refused claims",
        moved=True,
    )


async def ends_only_the_current_attempt(ctx: CaseContext) -> None:
    """`mark_completed` and `mark_failed` end only the pending attempt of its owner, once;
    a failed attempt is claimed again at the next attempt; responses and errors are kept
    as JSON."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    calls = w.calls(0)
    key = key_of(lease)
    recorded = (await _record(w, key)).call
    expect(
        await calls.mark_pending(key, recorded.attempt_ref, "owner-a"),
        "one-attempt-claim",
        "claim refused",
    )
    ref1 = AttemptRef(OutboundCallStatus.PENDING, 1, "owner-a")
    response = {"id": "ch_1", "ok": True, "amount": 12.5}
    for wrong in (recorded.attempt_ref, AttemptRef(OutboundCallStatus.PENDING, 1, "owner-b")):
        expect(
            not await calls.mark_completed(key, wrong, response),
            "one-attempt-claim",
            f"completing {wrong} was accepted",
        )
    expect(
        await w.calls(1).mark_completed(key, ref1, response),
        "one-attempt-claim",
        "completing the current attempt was refused",
    )
    done = dataclasses.replace(
        recorded,
        status=OutboundCallStatus.COMPLETED,
        attempt=1,
        attempt_owner="owner-a",
        response=response,
    )
    _expect_call(await calls.get(key), done, "one-attempt-claim", "the completed call", moved=True)
    expect(
        not await calls.mark_completed(key, ref1, response),
        "one-attempt-claim",
        "an attempt was completed twice",
    )
    expect(
        not await calls.mark_failed(key, ref1, {"late": True}),
        "one-attempt-claim",
        "a completed attempt was failed",
    )

    other = key_of(lease, step_key="step-2")
    recorded = (await _record(w, other)).call
    expect(
        await calls.mark_pending(other, recorded.attempt_ref, "owner-a"),
        "one-attempt-claim",
        "claim refused",
    )
    error = {"code": 502, "message": "bad gateway ☂"}
    expect(
        await w.calls(1).mark_failed(other, ref1, error),
        "one-attempt-claim",
        "failing the current attempt was refused",
    )
    failed = dataclasses.replace(
        recorded, status=OutboundCallStatus.FAILED, attempt=1, attempt_owner="owner-a", error=error
    )
    _expect_call(await calls.get(other), failed, "one-attempt-claim", "the failed call", moved=True)
    expect(
        not await calls.mark_failed(other, ref1, error),
        "one-attempt-claim",
        "an attempt was failed twice",
    )
    retry = AttemptRef(OutboundCallStatus.FAILED, 1, "owner-a")
    expect(
        await calls.mark_pending(other, retry, "owner-b"),
        "one-attempt-claim",
        "the retry of a failed attempt was refused",
    )
    retried = dataclasses.replace(recorded, attempt=2, attempt_owner="owner-b")
    _expect_call(
        await calls.get(other), retried, "one-attempt-claim", "the retried call", moved=True
    )


async def business_key_shared_across_executions(ctx: CaseContext) -> None:
    """Under a business key, another execution's record answers the stored intent (created
    false); another fingerprint is `IdempotencyKeyConflictError`."""
    w = World(ctx)
    first = await w.take(w.name(), 0)
    second = await w.take(w.name(), 1)
    business = f"payment-{w.uid}"
    key = key_of(first, "pay", business_key=business, fingerprint="fp-1")
    saved = await _record(w, key)
    want = pending_outbound_call_of(key, INTENT, saved.call.recorded_at)
    _expect_call(saved.call, want, "intent-recorded", "the recorded business-key intent")
    other = key_of(second, "pay", step_key="step-7", business_key=business, fingerprint="fp-1")
    again = await _record(w, other, {"another": "intent"}, instance=1)
    expect(
        again.created is False,
        "one-effect-per-key",
        "one business key recorded twice by two executions",
    )
    _expect_call(again.call, want, "one-effect-per-key", "the row another execution got")
    _expect_call(
        await w.calls(1).get(other),
        want,
        "one-effect-per-key",
        "get through the other execution's key",
    )
    for fingerprint in ("fp-2", None):
        conflicting = dataclasses.replace(other, fingerprint=fingerprint)
        try:
            got = await _record(w, conflicting, instance=1)
        except IdempotencyKeyConflictError:
            continue
        fail(
            "idempotency-key-conflict",
            f"fingerprint {fingerprint!r} under the business key answered {got}",
        )


async def _expect_key_refused(
    w: World,
    calls: OutboundCallRepository,
    key: FencedEffectKey,
    ref: AttemptRef,
    error: type[Exception],
    *,
    what: str = "",
    rule: str = "key-checked-first",
) -> None:
    operations: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("save_if_absent", lambda: calls.save_if_absent(key, INTENT, w.now)),
        ("mark_pending", lambda: calls.mark_pending(key, ref, "owner")),
        ("mark_completed", lambda: calls.mark_completed(key, ref, None)),
        ("mark_failed", lambda: calls.mark_failed(key, ref, None)),
    ]
    what = what or f"name {key.name!r:.30} / business key {key.business_key!r:.30}"
    for method, operation in operations:
        try:
            got = await operation()
        except error:
            continue
        except ExecutionFencedError:
            fail(
                rule,
                f"{method} with {what} at a stale token was fenced before the key was checked",
            )
        except Exception as exc:
            fail(rule, f"{method} with {what} raised {exc!r:.200}, expected {error.__name__}")
        fail(rule, f"{method} with {what} answered {got}, expected {error.__name__}")


async def invalid_keys_refused_first(ctx: CaseContext) -> None:
    """Every fenced method refuses a key built by hand with an invalid name
    (`InvalidFencedEffectNameError`) or business key (`InvalidBusinessKeyError`) before any
    statement, even at a stale token, and records nothing."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    good = key_of(lease, business_key="b-1", fingerprint="fp")
    calls = w.calls(0)
    ref = AttemptRef(OutboundCallStatus.PENDING, 0, attempt_owner_of(good))
    bad: list[tuple[FencedEffectKey, type[Exception]]] = []
    for base in (good, dataclasses.replace(good, token=good.token + 5)):
        bad += [
            (dataclasses.replace(base, name=name), InvalidFencedEffectNameError)
            for name in BAD_NAMES
        ]
        bad += [
            (dataclasses.replace(base, business_key=b), InvalidBusinessKeyError)
            for b in BAD_BUSINESS_KEYS
        ]
    for key, error in bad:
        await _expect_key_refused(w, calls, key, ref, error)
    expect(await calls.get(good) is None, "key-checked-first", "an invalid key recorded an intent")


async def unreplayable_keys_refused_first(ctx: CaseContext) -> None:
    """Every fenced method refuses, with its typed error and before any statement (even at
    a stale token), a key whose record no later read could give back (an empty step part,
    a step that is not a `StepRef`, a fingerprint that is not a text, a NUL, a scope that is
    not its lease's); `save_if_absent` refuses a `recorded_at` that is not an int, and
    `mark_pending` an owner that is not a non-empty text. Nothing is recorded, and the valid
    key then records its intent once."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    calls = w.calls(0)
    rule = "writes-validate-what-reads-require"
    goods = (key_of(lease), key_of(lease, business_key=w.name("b"), fingerprint="fp"))
    for good in goods:
        ref = AttemptRef(OutboundCallStatus.PENDING, 0, attempt_owner_of(good))
        for base in (good, dataclasses.replace(good, token=good.token + 5)):
            for what, bad, error in unreplayable_keys(base):
                await _expect_key_refused(w, calls, bad, ref, error, what=what, rule=rule)
        for recorded_at in (1.5, "1", True, None):
            try:
                got: Any = await calls.save_if_absent(good, INTENT, recorded_at)  # type: ignore[arg-type]
            except ValueError:
                continue
            fail(rule, f"save_if_absent at recorded_at {recorded_at!r} answered {got}")
        expect(await calls.get(good) is None, rule, "a refused write recorded an intent")
        saved = await calls.save_if_absent(good, INTENT, w.now)
        expect(saved.created, rule, f"the valid key after its refused variants: {saved}")
        for owner in ("", 7, None, "a\x00b"):
            try:
                got = await calls.mark_pending(good, saved.call.attempt_ref, owner)  # type: ignore[arg-type]
            except ValueError:
                continue
            fail(rule, f"mark_pending for owner {owner!r} answered {got}")
        again = await calls.save_if_absent(good, INTENT, w.now)
        expect(
            not again.created and again.call == saved.call,
            rule,
            f"the valid key's second record answered {again}, expected {saved}",
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


async def moves_only_its_own_call(ctx: CaseContext) -> None:
    """A claim and an end change the call of their key and no other, also when two calls of
    one lease stand at the same attempt; an end with the reference of an attempt that has
    already ended (status completed) is refused and changes nothing, and so is an end of a
    call never recorded; `lease_state_of` at a token never granted answers ABSENT, and for
    the same execution id in another tenant answers ABSENT, whatever this tenant's lease."""
    w = World(ctx)
    tree = w.name()
    lease = await w.take(tree, 0)
    calls = w.calls(0)
    first, second = key_of(lease), key_of(lease, step_key="step-2")
    one = (await _record(w, first)).call
    two = (await _record(w, second)).call
    expect(
        await calls.mark_pending(first, one.attempt_ref, "owner-a"),
        "one-attempt-claim",
        "the claim of the first of two calls at attempt 0 was refused",
    )
    _expect_call(await calls.get(second), two, "one-attempt-claim", "the other call, after a claim")
    expect(
        await calls.mark_pending(second, two.attempt_ref, "owner-a"),
        "one-attempt-claim",
        "the claim of the second call was refused",
    )
    ref1 = AttemptRef(OutboundCallStatus.PENDING, 1, "owner-a")
    expect(
        await w.calls(1).mark_completed(first, ref1, {"ok": True}),
        "one-attempt-claim",
        "the end of the first of two calls at attempt 1 was refused",
    )
    pending = dataclasses.replace(
        two, status=OutboundCallStatus.PENDING, attempt=1, attempt_owner="owner-a"
    )
    _expect_call(
        await calls.get(second), pending, "one-attempt-claim", "the other call", moved=True
    )
    ended = AttemptRef(OutboundCallStatus.COMPLETED, 1, "owner-a")
    expect(
        not await calls.mark_failed(first, ended, {"late": True}),
        "one-attempt-claim",
        "an end with the reference of the completed attempt was accepted",
    )
    done = dataclasses.replace(
        one,
        status=OutboundCallStatus.COMPLETED,
        attempt=1,
        attempt_owner="owner-a",
        response={"ok": True},
    )
    _expect_call(await calls.get(first), done, "one-attempt-claim", "the ended call", moved=True)
    never = key_of(lease, step_key="step-never-recorded")
    expect(
        not await calls.mark_completed(never, ref1, {"ok": True}),
        "one-attempt-claim",
        "an end of a call never recorded was accepted",
    )
    above = await w.calls(1).lease_state_of(TENANT, tree, lease.lease_epoch + 1)
    expect(
        above == LeaseState.ABSENT,
        "lease-state",
        f"lease_state_of at a token never granted (above the live epoch) answered {above}",
    )
    expect(
        await w.leases(0).renew(lease, LEASE_MS) == LEASE_MS,
        "atomic-lease-state",
        "lease_state_of at a token never granted closed the live lease: its holder could not renew",
    )
    state = await w.calls(1).lease_state_of(OTHER_TENANT, tree, lease.lease_epoch)
    expect(
        state == LeaseState.ABSENT,
        "tenant-apart",
        f"lease_state_of in {OTHER_TENANT}, which has no lease of {tree!r}, answered {state}",
    )


def cases() -> list[Case]:
    """The outbound call's cases; those only an atomic lease check passes are fencing."""
    named: list[tuple[str, CaseRun, bool]] = [
        (
            "save_if_absent records the pending intent exactly, once",
            records_pending_intent_once,
            False,
        ),
        (
            "mark_pending claims the next attempt by compare-and-set",
            claims_attempts_by_compare_and_set,
            False,
        ),
        (
            "mark_completed and mark_failed end only the current attempt",
            ends_only_the_current_attempt,
            False,
        ),
        ("a claim or an end moves its own call only", moves_only_its_own_call, False),
        (
            "a business key is one intent across executions",
            business_key_shared_across_executions,
            False,
        ),
        (
            "invalid names and business keys are refused before anything is written",
            invalid_keys_refused_first,
            False,
        ),
        (
            "keys, times and owners no later read could give back are refused first",
            unreplayable_keys_refused_first,
            False,
        ),
        ("lease_state_of answers each state", lease_states, False),
    ]
    for offset, label in BOUNDARIES:
        outcome = "is live" if offset < 0 else "closes the lease as superseded"
        named.append(
            (f"lease_state_of {label} expiry {outcome}", _lease_state_at(offset, label), False)
        )
    for offset, label in BOUNDARIES:
        outcome = "is accepted" if offset < 0 else "is refused"
        named.append(
            (f"recording an intent {label} expiry {outcome}", _record_at(offset, label), True)
        )
    named += [
        ("claiming and ending an attempt at expiry are refused", attempts_refused_at_expiry, True),
        ("a zombie records, claims and ends nothing", zombie_moves_no_call, True),
        ("race: lease_state_of against a late renewal", lease_state_against_late_renewal, True),
        ("race: lease_state_of against a take", lease_state_against_take, True),
        ("race: lease_state_of against a finish", lease_state_against_finish, True),
        (
            "race: a zombie's record and claim against its lease's hand-over",
            zombie_record_and_claim_race_hand_over,
            True,
        ),
        ("race: two attempts of one intent", two_attempts_of_one_intent, False),
        (
            "race: two executions recording one business key",
            two_executions_record_one_business_key,
            False,
        ),
    ]
    for skew in SKEWS:
        named.append(
            (
                f"the store's time is the authority with the caller's clock {skew_text(skew)}",
                _store_time(skew),
                True,
            )
        )
    named.append(
        ("database time decides, whatever the caller's clock", database_time_decides, True)
    )
    return [
        Case(CONTRACT, name, run, fencing=fencing) for name, run, fencing in named
    ] + write_cases(CONTRACT)


__all__ = ["CONTRACT", "cases"]
