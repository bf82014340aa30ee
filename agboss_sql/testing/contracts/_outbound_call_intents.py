"""The outbound-call cases of intents and attempts: recorded once, claimed by
compare-and-set, ended only at the current attempt, one intent per business key, bad keys
refused first, and a move that changes its own call only."""

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
from agboss_sql.contracts.stores import OutboundCallRepository
from agboss_sql.contracts.types import AttemptRef, FencedEffectKey, LeaseState, OutboundCallStatus
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fencing import (
    LEASE_MS,
    OTHER_TENANT,
    TENANT,
    World,
    expect,
    fail,
    key_of,
    unreplayable_keys,
)
from agboss_sql.testing.contracts._outbound_call_support import (
    BAD_BUSINESS_KEYS,
    BAD_NAMES,
    INTENT,
    _expect_call,
    _record,
)

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
