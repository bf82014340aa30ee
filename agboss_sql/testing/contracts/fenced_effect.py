"""Contract suite of `FencedEffectRepository` (docs/contracts.md): one effect per key.

Writes and replays, the key's rules, business keys and rollback run for every store. The
cases marked fencing (skipped, with a note, for a store that opts out of the lease check)
are those only an atomic lease check passes: a stale, released, yielded, finished or
expired lease refused 1 ms before / at / after expiry, a zombie's write racing its lease's
hand-over, and the store's time deciding whatever the writer's own clock says.
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
from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.types import (
    ExecutionLease,
    FencedEffectKey,
    FencedEffectResult,
    LeaseHolder,
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
    instance_name,
    key_of,
    on_database_time,
    past_database_lease,
    race,
    skew_text,
    step_of,
    unreplayable_keys,
)
from agboss_sql.testing.contracts._limits import limit_cases
from agboss_sql.testing.contracts._matrix import write_cases

CONTRACT = "fenced_effect"

CaseRun = Callable[[CaseContext], Awaitable[None]]

VALUE = {"charge": "ch_1", "amount": 1250, "items": [1, "two", None, True], "note": "é"}

BAD_NAMES = ("", "has space", "x" * 101, "naïve", "a/b", "semi;colon")
BAD_BUSINESS_KEYS = ("", "   ", "line\nbreak", "nul\x00byte", "k" * 256)


async def _write(
    w: World,
    key: FencedEffectKey,
    label: str,
    value: Any = VALUE,
    *,
    instance: int = 0,
    skew_ms: int = 0,
) -> FencedEffectResult[Any]:
    return await w.effects(instance, skew_ms=skew_ms).save_result_if_absent(
        key, w.work(label, value)
    )


async def _expect_fenced(
    w: World,
    key: FencedEffectKey,
    what: str,
    *,
    instance: int = 0,
    skew_ms: int = 0,
    rule: str = "no-stale-write",
    reason: FenceRefusal | None = None,
) -> None:
    """The write at `key` is refused with `ExecutionFencedError` naming its scope and token
    (and `reason`, when given), without running its work or leaving a business row."""
    work = w.work(f"refused-{w.name('row')}", VALUE)
    before = await w.rows()
    try:
        got = await w.effects(instance, skew_ms=skew_ms).save_result_if_absent(key, work)
    except ExecutionFencedError as exc:
        expect(
            exc.scope_key == key.scope_key and exc.token == key.token,
            "no-stale-write",
            f"{what}: the refusal names scope {exc.scope_key!r} at {exc.token}, expected "
            f"{key.scope_key!r} at {key.token}",
        )
        expect(
            reason is None or exc.reason == reason,
            "no-stale-write",
            f"{what}: refused for {exc.reason!r}, where every store names {reason}",
        )
    else:
        fail(rule, f"{what}: the write was accepted ({got})")
    expect(work.calls == 0, rule, f"{what}: the refused write ran its work")
    after = await w.rows()
    expect(
        after == before,
        rule,
        f"{what}: the refused write left business rows {after[len(before) :]}",
    )


async def _expect_ran(w: World, result: FencedEffectResult[Any], value: Any, what: str) -> None:
    expect(
        result == FencedEffectResult(value, False, None),
        "one-effect-per-key",
        f"{what}: answered {result}, expected the work's value, not replayed",
    )


# --- writes and replays -------------------------------------------------------------------


async def first_write_runs_once(ctx: CaseContext) -> None:
    """The first write runs its work in the transaction, answers its value (not replayed)
    and commits the work's business row with the result."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    work = w.work("charge", VALUE)
    result = await w.effects(0).save_result_if_absent(key_of(lease), work)
    await _expect_ran(w, result, VALUE, "the first write")
    expect(work.calls == 1, "one-effect-per-key", f"the work ran {work.calls} times")
    expect(await w.rows() == ["charge"], "one-effect-per-key", f"business rows {await w.rows()}")


async def replay_returns_stored_result(ctx: CaseContext) -> None:
    """The same key again, from either instance, replays the stored (JSON) result without
    running the work; `replayed_from` is `None` for the step that wrote it."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    key = key_of(lease)
    await _write(w, key, "charge")
    for instance in (0, 1, 0):
        work = w.work("again", {"other": True})
        result = await w.effects(instance).save_result_if_absent(key, work)
        expect(
            result == FencedEffectResult(VALUE, True, None),
            "replay",
            f"a replay on instance-{instance + 1} answered {result}, expected the stored value",
        )
        expect(work.calls == 0, "one-effect-per-key", "a replay ran the work")
    expect(await w.rows() == ["charge"], "one-effect-per-key", f"business rows {await w.rows()}")


async def business_key_replays_with_replayed_from(ctx: CaseContext) -> None:
    """A business key written by one execution's step replays for another execution's step
    (same tenant, name and fingerprint), naming the writer's step in `replayed_from`."""
    w = World(ctx)
    first = await w.take(w.name(), 0)
    second = await w.take(w.name(), 1)
    business = f"order-{w.uid}"
    written = await _write(w, key_of(first, business_key=business, fingerprint="fp-1"), "charge")
    await _expect_ran(w, written, VALUE, "the first write of a business key")
    work = w.work("again", None)
    result = await w.effects(1).save_result_if_absent(
        key_of(second, step_key="step-9", business_key=business, fingerprint="fp-1"), work
    )
    expect(
        result == FencedEffectResult(VALUE, True, step_of(first)),
        "replay",
        f"another execution's write of the business key answered {result}, expected a replay "
        f"from {step_of(first)}",
    )
    expect(
        work.calls == 0 and await w.rows() == ["charge"],
        "one-effect-per-key",
        "the business key's work ran twice",
    )


async def fingerprint_conflict(ctx: CaseContext) -> None:
    """Another fingerprint under a business key is `IdempotencyKeyConflictError`, never a
    replay, from the same or another execution, and writes nothing."""
    w = World(ctx)
    first = await w.take(w.name(), 0)
    second = await w.take(w.name(), 1)
    business = f"order-{w.uid}"
    await _write(w, key_of(first, business_key=business, fingerprint="fp-1"), "charge")
    for lease, instance, fingerprint in (
        (first, 0, "fp-2"),
        (second, 1, "fp-2"),
        (second, 1, None),
    ):
        work = w.work("conflict", None)
        key = key_of(lease, step_key="step-2", business_key=business, fingerprint=fingerprint)
        try:
            got = await w.effects(instance).save_result_if_absent(key, work)
        except IdempotencyKeyConflictError:
            pass
        else:
            fail(
                "idempotency-key-conflict",
                f"fingerprint {fingerprint!r} under the business key answered {got}",
            )
        expect(work.calls == 0, "idempotency-key-conflict", "a conflicting write ran its work")
    expect(
        await w.rows() == ["charge"], "idempotency-key-conflict", f"business rows {await w.rows()}"
    )


async def separate_keys_separate_effects(ctx: CaseContext) -> None:
    """Two steps of one lease, two names of one step, one step key in two executions or two
    tenants, and one business key under two names or in two tenants are separate effects:
    each runs its work."""
    w = World(ctx)
    tree = w.name()
    one = await w.take(tree, 0)
    two = await w.take(w.name(), 1)
    three = await w.take(tree, 1, tenant=OTHER_TENANT)
    business = f"order-{w.uid}"
    keys = [
        ("one step-1 charge", key_of(one)),
        ("one step-2 charge", key_of(one, step_key="step-2")),
        ("one step-1 refund", key_of(one, "refund")),
        ("two step-1 charge", key_of(two)),
        ("other tenant step-1 charge", key_of(three)),
        ("business pay", key_of(one, "pay", step_key="step-3", business_key=business)),
        ("business refund", key_of(one, "refund", step_key="step-4", business_key=business)),
        (
            "other tenant business pay",
            key_of(three, "pay", step_key="step-3", business_key=business),
        ),
    ]
    for index, (label, key) in enumerate(keys):
        result = await _write(w, key, label, {"label": label}, instance=index % 2)
        expect(
            result == FencedEffectResult({"label": label}, False, None),
            "key-identity",
            f"key {label} answered {result}: it was taken for another key's effect",
        )
    expect(
        sorted(await w.rows()) == sorted(label for label, _ in keys),
        "key-identity",
        f"business rows {await w.rows()}",
    )


# --- the key's rules ----------------------------------------------------------------------


async def invalid_names_refused_first(ctx: CaseContext) -> None:
    """A key built by hand with a name that is not 1-100 of `[A-Za-z0-9._-]` is
    `InvalidFencedEffectNameError` before any statement: even on an expired lease, nothing
    runs and nothing is written; a 100-character name is fine."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    good = key_of(lease)
    stale = dataclasses.replace(good, token=good.token + 5)
    for base in (good, stale):
        for name in BAD_NAMES:
            work = w.work("bad-name", None)
            try:
                got = await w.effects(0).save_result_if_absent(
                    dataclasses.replace(base, name=name), work
                )
            except InvalidFencedEffectNameError:
                pass
            except ExecutionFencedError:
                fail(
                    "key-checked-first",
                    f"name {name!r:.30} at a stale token was fenced before its name was checked",
                )
            else:
                fail("key-checked-first", f"name {name!r:.30} was accepted ({got})")
            expect(work.calls == 0, "key-checked-first", f"name {name!r:.30}: the work ran")
    longest = "n" * 100
    result = await _write(w, key_of(lease, longest), "longest", 1)
    await _expect_ran(w, result, 1, "a 100-character name")
    expect(await w.rows() == ["longest"], "key-checked-first", f"business rows {await w.rows()}")


async def invalid_business_keys_refused_first(ctx: CaseContext) -> None:
    """A business key that is not a key's text (empty, blank, control characters, over
    255 characters) is `InvalidBusinessKeyError` before any statement, even on a stale
    token; a 255-character business key is fine."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    good = key_of(lease, business_key="b", fingerprint="fp")
    stale = dataclasses.replace(good, token=good.token + 5)
    for base in (good, stale):
        for business in BAD_BUSINESS_KEYS:
            work = w.work("bad-business-key", None)
            try:
                got = await w.effects(0).save_result_if_absent(
                    dataclasses.replace(base, business_key=business), work
                )
            except InvalidBusinessKeyError:
                pass
            except ExecutionFencedError:
                fail(
                    "key-checked-first",
                    f"business key {business!r:.30} at a stale token was fenced before it was checked",
                )
            else:
                fail("key-checked-first", f"business key {business!r:.30} was accepted ({got})")
            expect(
                work.calls == 0, "key-checked-first", f"business key {business!r:.30}: the work ran"
            )
    longest = (w.uid + "b" * 255)[:255]
    result = await _write(w, key_of(lease, business_key=longest, fingerprint="fp"), "longest", 2)
    await _expect_ran(w, result, 2, "a 255-character business key")
    again = await _write(
        w, key_of(lease, step_key="step-2", business_key=longest, fingerprint="fp"), "again", 3
    )
    expect(
        again.replayed and again.value == 2,
        "replay",
        f"the 255-character business key from another step answered {again}",
    )
    expect(await w.rows() == ["longest"], "one-effect-per-key", f"business rows {await w.rows()}")


async def unreplayable_keys_refused_first(ctx: CaseContext) -> None:
    """A key whose first write would store what no later read gives back (an empty step
    part, a step that is not a `StepRef`, a fingerprint that is not a text, a NUL, a scope
    that is not its lease's) is refused with its typed error before any statement, even at
    a stale token: nothing runs, nothing is written, and the key's valid write then runs
    once and replays, so the tree can still finish."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    for good in (key_of(lease), key_of(lease, business_key=w.name("b"), fingerprint="fp")):
        for base in (good, dataclasses.replace(good, token=good.token + 5)):
            for what, bad, error in unreplayable_keys(base):
                work = w.work("unreplayable", None)
                try:
                    got = await w.effects(0).save_result_if_absent(bad, work)
                except error:
                    pass
                except ExecutionFencedError:
                    fail(
                        "writes-validate-what-reads-require",
                        f"{what} at a stale token was fenced before the key was checked",
                    )
                except Exception as exc:
                    fail(
                        "writes-validate-what-reads-require",
                        f"{what} raised {exc!r:.200}, expected {error.__name__}",
                    )
                else:
                    fail(
                        "writes-validate-what-reads-require",
                        f"{what} was accepted ({got}): every later call of the key would fail",
                    )
                expect(
                    work.calls == 0, "writes-validate-what-reads-require", f"{what}: the work ran"
                )
        label = "valid-" + ("business" if good.business_key else "step")
        first = await _write(w, good, label, 1)
        await _expect_ran(w, first, 1, f"the valid key after its refused variants ({label})")
        again = await _write(w, good, label + "-again", 2)
        expect(
            again == FencedEffectResult(1, True, None),
            "writes-validate-what-reads-require",
            f"the valid key's replay after its refused variants answered {again}",
        )
    expect(
        await w.rows() == ["valid-step", "valid-business"],
        "writes-validate-what-reads-require",
        f"business rows {await w.rows()}",
    )


# --- all or nothing -----------------------------------------------------------------------


class WorkFailed(Exception):
    """What the suite's failing work raises."""


async def raising_work_leaves_nothing(ctx: CaseContext) -> None:
    """Work that raises propagates its exception and leaves no result and no business row:
    the next write of the key runs its work again."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    key = key_of(lease)
    error = WorkFailed("the payment API said no")
    try:
        got = await w.effects(0).save_result_if_absent(key, w.work("failed", None, error=error))
    except WorkFailed as exc:
        expect(exc is error, "all-or-nothing", f"the work's exception came back as {exc!r}")
    else:
        fail("all-or-nothing", f"work that raised answered {got}")
    expect(
        await w.rows() == [],
        "all-or-nothing",
        f"work that raised left business rows {await w.rows()}",
    )
    result = await _write(w, key, "retried", {"ok": 1}, instance=1)
    await _expect_ran(w, result, {"ok": 1}, "the write after a raising work (a result was stored)")
    expect(await w.rows() == ["retried"], "all-or-nothing", f"business rows {await w.rows()}")


async def result_json_refuses_leaves_nothing(ctx: CaseContext) -> None:
    """A result JSON cannot hold fails the effect and leaves no result and no business row."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    key = key_of(lease)
    try:
        got = await w.effects(0).save_result_if_absent(key, w.work("not-json", {1, 2}))
    except Exception:
        pass
    else:
        fail("all-or-nothing", f"a set as the result was accepted ({got})")
    expect(
        await w.rows() == [],
        "all-or-nothing",
        f"a failed result left business rows {await w.rows()}",
    )
    result = await _write(w, key, "json", [1, 2])
    await _expect_ran(w, result, [1, 2], "the write after a failed result")


# --- reading a stored result ----------------------------------------------------------------


async def _read(
    w: World, key: FencedEffectKey, instance: int = 0
) -> FencedEffectResult[Any] | None:
    return await w.effects(instance).get_result(key)


async def _expect_read(
    w: World, key: FencedEffectKey, expected: FencedEffectResult[Any] | None, what: str
) -> None:
    """`key` reads `expected` from every instance."""
    for instance in (0, 1):
        got = await _read(w, key, instance)
        expect(
            got == expected,
            "read",
            f"{what}: {instance_name(instance)} read {got}, expected {expected}",
        )


async def read_of_nothing_stored(ctx: CaseContext) -> None:
    """A key nothing is stored under (a step key, a business key) reads `None`, and the
    read claims nothing: the key's first write then runs its work, and the next read
    answers its result."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    business = key_of(lease, step_key="step-2", business_key=f"order-{w.uid}", fingerprint="fp")
    keys = (("a step key", key_of(lease)), ("a business key", business))
    for what, key in keys:
        await _expect_read(w, key, None, f"{what} nothing was stored under")
    for index, (what, key) in enumerate(keys):
        value = {"n": index}
        written = await _write(w, key, f"after-read-{index}", value)
        await _expect_ran(w, written, value, f"the first write of {what} after reads of it")
        await _expect_read(
            w, key, FencedEffectResult(value, True, None), f"{what}, after its first write"
        )
    expect(
        await w.rows() == ["after-read-0", "after-read-1"],
        "read",
        f"business rows {await w.rows()}",
    )


async def read_answers_as_a_replay(ctx: CaseContext) -> None:
    """A stored result reads as `save_result_if_absent` replays it: the stored (JSON)
    value, replayed, `replayed_from` `None` for the step that wrote it and the writer's step
    for another execution's step under a business key; a stored `null` reads as a replay of
    `None`, not as nothing stored. The read runs no work and writes nothing."""
    w = World(ctx)
    first = await w.take(w.name(), 0)
    second = await w.take(w.name(), 1)
    business = f"order-{w.uid}"
    await _write(w, key_of(first), "charge")
    await _write(
        w,
        key_of(first, step_key="step-2", business_key=business, fingerprint="fp-1"),
        "order",
        {"order": 1},
    )
    await _write(w, key_of(first, step_key="step-3"), "nothing", None)
    reads: list[tuple[str, FencedEffectKey, int, FencedEffectResult[Any]]] = [
        ("the writer's step", key_of(first), 0, FencedEffectResult(VALUE, True, None)),
        (
            "another execution's step under the business key",
            key_of(second, step_key="step-9", business_key=business, fingerprint="fp-1"),
            1,
            FencedEffectResult({"order": 1}, True, step_of(first, "step-2")),
        ),
        (
            "a stored null",
            key_of(first, step_key="step-3"),
            0,
            FencedEffectResult(None, True, None),
        ),
    ]
    for what, key, instance, expected in reads:
        await _expect_read(w, key, expected, what)
        replay = await w.effects(instance).save_result_if_absent(key, w.work("replayed", None))
        expect(
            replay == expected,
            "read",
            f"{what}: the read answered {expected}, the replay of the key {replay}",
        )
    expect(
        await w.rows() == ["charge", "order", "nothing"], "read", f"business rows {await w.rows()}"
    )


async def read_fingerprint_conflict(ctx: CaseContext) -> None:
    """Another fingerprint (or none) under a stored business key reads as
    `IdempotencyKeyConflictError`, from the same or another execution, never as a result."""
    w = World(ctx)
    first = await w.take(w.name(), 0)
    second = await w.take(w.name(), 1)
    business = f"order-{w.uid}"
    await _write(w, key_of(first, business_key=business, fingerprint="fp-1"), "charge")
    for lease, instance, fingerprint in (
        (first, 0, "fp-2"),
        (second, 1, "fp-2"),
        (second, 1, None),
    ):
        key = key_of(lease, step_key="step-2", business_key=business, fingerprint=fingerprint)
        try:
            got = await _read(w, key, instance)
        except IdempotencyKeyConflictError:
            continue
        fail(
            "idempotency-key-conflict",
            f"a read with fingerprint {fingerprint!r} under the business key answered {got}",
        )


async def read_nothing_after_raising_work(ctx: CaseContext) -> None:
    """Work that raised, and a result JSON cannot hold, leave nothing to read."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    raised, refused = key_of(lease), key_of(lease, step_key="step-2")
    error = WorkFailed("the payment API said no")
    try:
        await w.effects(0).save_result_if_absent(raised, w.work("failed", None, error=error))
    except WorkFailed:
        pass
    else:
        fail("all-or-nothing", "work that raised was answered")
    try:
        await w.effects(0).save_result_if_absent(refused, w.work("not-json", {1, 2}))
    except Exception:
        pass
    else:
        fail("all-or-nothing", "a set as the result was accepted")
    await _expect_read(w, raised, None, "the key of a work that raised")
    await _expect_read(w, refused, None, "the key of a result JSON cannot hold")
    expect(await w.rows() == [], "all-or-nothing", f"business rows {await w.rows()}")


async def read_nothing_after_refused_write(ctx: CaseContext) -> None:
    """A refused write leaves nothing to read: a zombie's after a takeover, a write on a
    lease that ran out."""
    w = World(ctx)
    tree = w.name()
    old = await w.take(tree, 0)
    lapsed = await w.take(w.name(), 0)
    await w.at(w.now + LEASE_MS)
    new = await w.take(tree, 1)
    zombie = key_of(old, step_key="zombie-step")
    await _expect_fenced(w, zombie, "the zombie's write after a takeover")
    await _expect_fenced(w, key_of(lapsed), "a write on a lease that ran out")
    await _expect_read(w, zombie, None, "the key of the zombie's refused write")
    await _expect_read(
        w, key_of(new, step_key="zombie-step"), None, "the new holder's key of that step"
    )
    await _expect_read(w, key_of(lapsed), None, "the key of the write on a lease that ran out")


async def read_in_own_tenant_only(ctx: CaseContext) -> None:
    """A tenant reads its own results only: another tenant's equal execution, step and name,
    or equal name and business key (with any fingerprint: conflicts are per tenant too),
    reads `None`."""
    w = World(ctx)
    tree = w.name()
    mine = await w.take(tree, 0)
    theirs = await w.take(tree, 1, tenant=OTHER_TENANT)
    business = f"order-{w.uid}"
    await _write(w, key_of(mine), "step")
    await _write(
        w, key_of(mine, step_key="step-2", business_key=business, fingerprint="fp"), "business"
    )
    await _expect_read(w, key_of(theirs), None, "another tenant's equal step key")
    for fingerprint in ("fp", "other"):
        key = key_of(theirs, step_key="step-2", business_key=business, fingerprint=fingerprint)
        await _expect_read(
            w, key, None, f"another tenant's equal business key, fingerprint {fingerprint!r}"
        )
    await _expect_read(w, key_of(mine), FencedEffectResult(VALUE, True, None), "the tenant's own")


async def zombie_read_answers_and_writes_nothing(ctx: CaseContext) -> None:
    """A read has no lease check: a holder whose lease ran out, the same holder after a
    takeover (a zombie) and a token never granted read what the holder reads. It writes
    nothing: a lease it read under that ran out is still taken over from its holder (the
    read moved no lease), the new holder's write of a key the zombie read as absent runs its
    work (nothing claimed), and a write after a read at a token above the epoch is accepted
    (no mark raised)."""
    w = World(ctx)
    tree = w.name()
    old = await w.take(tree, 0)
    await _write(w, key_of(old), "epoch-1")
    await w.at(w.now + LEASE_MS)
    stored = FencedEffectResult(VALUE, True, None)
    await _expect_read(w, key_of(old), stored, "the holder's key, its lease run out")
    await _expect_read(w, key_of(old, step_key="step-2"), None, "an absent key, the lease run out")
    new = await w.take(tree, 1)
    expect(
        new.taken_over_from == LeaseHolder(instance_name(0), old.lease_epoch),
        "read",
        f"the lease read under after it ran out was taken with taken_over_from="
        f"{new.taken_over_from}, expected a takeover from {instance_name(0)} at "
        f"{old.lease_epoch}: the read moved the lease",
    )
    await _expect_read(w, key_of(old), stored, "the zombie's key after a takeover")
    await _expect_read(w, key_of(old, step_key="step-2"), None, "the zombie's absent key")
    ahead = dataclasses.replace(key_of(new, step_key="step-3"), token=new.lease_epoch + 5)
    await _expect_read(w, ahead, None, "a key at a token never granted")
    for step, value in (("step-2", 2), ("step-3", 3)):
        fresh = await _write(w, key_of(new, step_key=step), f"epoch-2-{step}", value, instance=1)
        await _expect_ran(w, fresh, value, f"the new holder's write of {step} after reads of it")
    replay = await _write(w, key_of(new), "epoch-2", instance=1)
    expect(replay == stored, "replay", f"the new holder's replay answered {replay}")
    await _expect_read(
        w,
        key_of(old, step_key="step-2"),
        FencedEffectResult(2, True, None),
        "the zombie's key the new holder wrote",
    )
    expect(
        await w.rows() == ["epoch-1", "epoch-2-step-2", "epoch-2-step-3"],
        "read",
        f"business rows {await w.rows()}",
    )


async def read_waits_for_no_write(ctx: CaseContext) -> None:
    """A read of a key whose write is in flight (inside its work: its lease row locked, its
    key claimed) answers `None` without waiting for anything that write holds; the write
    then commits, and the next read answers its result."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    key = key_of(lease)
    seen: list[FencedEffectResult[Any] | None] = []

    async def work(tx: Any) -> Any:
        await w.insert(tx, "in-flight")
        seen.append(await _read(w, key, 1))
        return VALUE

    written = await w.effects(0).save_result_if_absent(key, work)
    expect(seen == [None], "read", f"the read inside the key's own write answered {seen}")
    await _expect_ran(w, written, VALUE, "the write the read ran inside")
    await _expect_read(w, key, FencedEffectResult(VALUE, True, None), "the key after its write")
    expect(await w.rows() == ["in-flight"], "read", f"business rows {await w.rows()}")


# --- the lease check ----------------------------------------------------------------------


def _write_at(offset: int, label: str) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        start = w.now
        lease = await w.take(w.name(), 0)
        await w.at(start + LEASE_MS + offset)
        key = key_of(lease)
        if offset < 0:
            result = await _write(w, key, "in-time")
            await _expect_ran(w, result, VALUE, f"a write {label} expiry")
            expect(
                await w.rows() == ["in-time"],
                "live-until-expiry",
                f"business rows {await w.rows()}",
            )
            return
        await _expect_fenced(
            w, key, f"a write {label} the lease's expiry", rule="live-until-expiry"
        )

    run.__doc__ = f"The holder's fenced write {label} expiry: accepted while live, else `ExecutionFencedError`."
    return run


async def zombie_write_refused(ctx: CaseContext) -> None:
    """After a takeover the old epoch's write is refused, its replay too, while the new
    holder writes and replays."""
    w = World(ctx)
    tree = w.name()
    old = await w.take(tree, 0)
    written = await _write(w, key_of(old), "epoch-1")
    await _expect_ran(w, written, VALUE, "the holder's write")
    await w.at(w.now + LEASE_MS)
    new = await w.take(tree, 1)
    await _expect_fenced(w, key_of(old), "the zombie's replay of its own key after a takeover")
    await _expect_fenced(
        w, key_of(old, step_key="step-2"), "the zombie's new write after a takeover"
    )
    await _expect_fenced(
        w, key_of(old, step_key="step-2"), "the zombie's write through instance-2", instance=1
    )
    replay = await _write(w, key_of(new), "epoch-2", instance=1)
    expect(
        replay == FencedEffectResult(VALUE, True, None),
        "replay",
        f"the new holder's replay answered {replay}",
    )
    fresh = await _write(w, key_of(new, step_key="step-2"), "epoch-2-step-2", 2, instance=1)
    await _expect_ran(w, fresh, 2, "the new holder's write")
    await _expect_fenced(
        w, key_of(old, step_key="step-3"), "the zombie's write after the new holder wrote"
    )
    expect(
        await w.rows() == ["epoch-1", "epoch-2-step-2"],
        "no-stale-write",
        f"business rows {await w.rows()}",
    )


async def ended_leases_refused(ctx: CaseContext) -> None:
    """A write on a released, a yielded or a finished lease is refused."""
    w = World(ctx)
    for end in ("release", "yield_lease", "finish"):
        lease = await w.take(w.name(), 0)
        moved = await getattr(w.leases(0), end)(lease)
        expect(moved, "no-stale-write", f"the holder's {end} was refused")
        await _expect_fenced(w, key_of(lease), f"a write after {end}")
    expect(await w.rows() == [], "no-stale-write", f"business rows {await w.rows()}")


async def ungranted_tokens_refused(ctx: CaseContext) -> None:
    """A write at a token never granted (above the lease's epoch), or with no lease at all,
    is refused."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    ahead = dataclasses.replace(lease, lease_epoch=lease.lease_epoch + 1)
    await _expect_fenced(w, key_of(ahead), "a write at a token above the lease's epoch")
    nobody = dataclasses.replace(lease, execution_id=w.name("never-leased"))
    await _expect_fenced(w, key_of(nobody), "a write on an execution that has no lease")
    result = await _write(w, key_of(lease), "held")
    await _expect_ran(w, result, VALUE, "the holder's write after the refused ones")


async def holder_decided_before_lease_state(ctx: CaseContext) -> None:
    """A key naming another instance than the one its epoch was granted to (a context built
    by hand) is refused as `superseded` on every store, also when its lease was released,
    yielded or finished, or ran out, since: who holds the token is decided before what
    became of the lease. The granted holder's own key is refused for that state."""
    w = World(ctx)
    ended: list[tuple[str, ExecutionLease, FenceRefusal]] = []
    for end, reason in (
        ("release", FenceRefusal.RELEASED),
        ("yield_lease", FenceRefusal.YIELDED),
        ("finish", FenceRefusal.FINISHED),
    ):
        lease = await w.take(w.name(), 0)
        moved = await getattr(w.leases(0), end)(lease)
        expect(moved, "no-stale-write", f"the holder's {end} was refused")
        ended.append((f"after its {end}", lease, reason))
    lapsed = await w.take(w.name(), 0)
    # Every lease runs out here; the ended ones still name how they ended.
    await w.at(w.now + LEASE_MS)
    ended.append(("after its expiry", lapsed, FenceRefusal.EXPIRED))
    for what, lease, reason in ended:
        named_for_another = dataclasses.replace(lease, holder_instance_id=instance_name(1))
        await _expect_fenced(
            w,
            key_of(named_for_another),
            f"a key naming {instance_name(1)} for {instance_name(0)}'s epoch, {what}",
            instance=1,
            reason=FenceRefusal.SUPERSEDED,
        )
        await _expect_fenced(w, key_of(lease), f"the holder's own key, {what}", reason=reason)
    expect(await w.rows() == [], "no-stale-write", f"business rows {await w.rows()}")


# --- races --------------------------------------------------------------------------------


async def zombie_write_races_hand_over(ctx: CaseContext) -> None:
    """A zombie's write of a step's key races its lease's release, the next take and the
    new holder's write of the same key, round after round in both orders: one business row.
    The zombie's write either lands before the release (the new holder replays it) or is
    refused; it is never answered with a replay of the new holder's write."""
    w = World(ctx)

    async def one(round_: Round) -> None:
        tree = w.name()
        old = await w.take(tree, 0)
        label = f"r{round_.number}{'s' if round_.swapped else ''}"

        async def zombie() -> FencedEffectResult[Any]:
            return await _write(w, key_of(old), f"{label}-zombie", {"by": "zombie"})

        async def hand_over() -> tuple[ExecutionLease, FencedEffectResult[Any]]:
            if not await w.leases(0).release(old):
                fail(
                    "no-stale-write",
                    f"{round_}: the holder's release of its live lease was refused",
                )
            new = await w.take(tree, 1)
            return new, await _write(
                w, key_of(new), f"{label}-holder", {"by": "holder"}, instance=1
            )

        zombie_outcome, holder_outcome = await race(round_, zombie, hand_over)
        new, holder_result = holder_outcome.answer("the new holder's hand-over and write")
        rows = [row for row in await w.rows() if row.startswith(f"{label}-")]
        if zombie_outcome.raised:
            if not isinstance(zombie_outcome.error, ExecutionFencedError):
                fail("store-error", f"{round_}: the zombie's write raised {zombie_outcome.error!r}")
            expect(
                holder_result == FencedEffectResult({"by": "holder"}, False, None),
                "one-effect-per-key",
                f"{round_}: the zombie was refused, yet the new holder's write answered {holder_result}",
            )
            expect(
                rows == [f"{label}-holder"], "one-effect-per-key", f"{round_}: business rows {rows}"
            )
            return
        zombie_result = zombie_outcome.value
        expect(
            not zombie_result.replayed,
            "no-stale-write",
            f"{round_}: the zombie's write was answered with a replay ({zombie_result}): it "
            "passed the lease check after its lease was handed over",
        )
        expect(
            holder_result == FencedEffectResult({"by": "zombie"}, True, None),
            "no-stale-write" if not holder_result.replayed else "one-effect-per-key",
            f"{round_}: the zombie's write was accepted and the new holder's answered "
            f"{holder_result}: the zombie wrote after epoch {new.lease_epoch} was taken",
        )
        expect(rows == [f"{label}-zombie"], "one-effect-per-key", f"{round_}: business rows {rows}")

    await each_round(one)


async def two_instances_one_key(ctx: CaseContext) -> None:
    """Two instances writing one key at once (one lease, one token), round after round in
    both orders: one runs its work, the other replays its result; one business row."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)

    async def one(round_: Round) -> None:
        key = key_of(lease, step_key=f"step-{round_.number}-{round_.swapped}")
        label = f"r{round_.number}{'s' if round_.swapped else ''}"
        outcomes = await race(
            round_,
            lambda: _write(w, key, f"{label}-a", {"by": "a"}, instance=0),
            lambda: _write(w, key, f"{label}-b", {"by": "b"}, instance=1),
        )
        results = [o.answer("a write of one key") for o in outcomes]
        _expect_one_ran(results, round_, "two instances writing one key")
        rows = [row for row in await w.rows() if row.startswith(f"{label}-")]
        expect(
            len(rows) == 1,
            "one-effect-per-key",
            f"{round_}: two instances writing one key committed business rows {rows}",
        )

    await each_round(one)


def _expect_one_ran(results: list[FencedEffectResult[Any]], round_: object, what: str) -> None:
    ran = [r for r in results if not r.replayed]
    expect(
        len(ran) == 1,
        "one-effect-per-key",
        f"{round_}: {what}: {len(ran)} ran their work ({results})",
    )
    winner = ran[0]
    for result in results:
        if result.replayed:
            expect(
                result.value == winner.value,
                "replay",
                f"{round_}: {what}: the replay answered {result.value}, the write {winner.value}",
            )


async def two_executions_one_business_key(ctx: CaseContext) -> None:
    """Two executions (two leases, two instances) writing one business key at once, round
    after round in both orders: one runs its work, the other replays it, naming the
    winner's step; one business row."""
    w = World(ctx)
    first = await w.take(w.name(), 0)
    second = await w.take(w.name(), 1)

    async def one(round_: Round) -> None:
        business = f"order-{w.uid}-{round_.number}-{round_.swapped}"
        label = f"r{round_.number}{'s' if round_.swapped else ''}"
        keys = (
            key_of(first, business_key=business, fingerprint="fp"),
            key_of(second, step_key="step-b", business_key=business, fingerprint="fp"),
        )
        outcomes = await race(
            round_,
            lambda: _write(w, keys[0], f"{label}-a", {"by": "a"}, instance=0),
            lambda: _write(w, keys[1], f"{label}-b", {"by": "b"}, instance=1),
        )
        results = [o.answer("a write of one business key") for o in outcomes]
        _expect_one_ran(results, round_, "two executions writing one business key")
        for index, result in enumerate(results):
            if result.replayed:
                other = keys[1 - index].step
                expect(
                    result.replayed_from == other,
                    "replay",
                    f"{round_}: the replay names {result.replayed_from}, expected {other}",
                )
        rows = [row for row in await w.rows() if row.startswith(f"{label}-")]
        expect(
            len(rows) == 1,
            "one-effect-per-key",
            f"{round_}: two executions writing one business key committed business rows {rows}",
        )

    await each_round(one)


# --- the store's time ---------------------------------------------------------------------


def _store_time(skew_ms: int) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        tree = w.name()
        start = w.now
        lease = await w.take(tree, 1, skew_ms=skew_ms)
        what = f"instance-2, its own clock {skew_text(skew_ms)}"
        await w.at(start + LEASE_MS - 1)
        result = await _write(w, key_of(lease), "in-time", instance=1, skew_ms=skew_ms)
        expect(
            result == FencedEffectResult(VALUE, False, None),
            "store-time",
            f"{what}, writing 1 ms before its lease's expiry by the store's time, got {result}",
        )
        await w.at(start + LEASE_MS)
        await _expect_fenced(
            w,
            key_of(lease, step_key="step-2"),
            f"{what}, writing at its lease's expiry by the store's time",
            instance=1,
            skew_ms=skew_ms,
            rule="store-time",
        )
        holder = await w.take(tree, 0)
        fresh = await _write(w, key_of(holder, step_key="step-3"), "holder", 3)
        await _expect_ran(w, fresh, 3, "the next holder's write")
        await _expect_fenced(
            w,
            key_of(lease, step_key="step-4"),
            f"{what}, writing as a zombie",
            instance=1,
            skew_ms=skew_ms,
            rule="store-time",
        )
        expect(
            await w.rows() == ["in-time", "holder"], "store-time", f"business rows {await w.rows()}"
        )

    run.__doc__ = f"With the writer's own clock off by {skew_text(skew_ms)}, the store's time decides its writes."
    return run


async def database_time_decides(ctx: CaseContext) -> None:
    """On the database's own time (`StoreClock()`), whatever the writer's own clock says
    (10 x lease ahead or behind): a write on a live lease is accepted, one after it ran out
    refused."""
    await on_database_time(ctx)
    w = World(ctx)
    ahead, behind = 10 * DATABASE_LEASE_MS, -10 * DATABASE_LEASE_MS
    lease = await w.leases(1).acquire(TENANT, w.name(), DATABASE_LEASE_MS)
    if lease is None:
        fail("live-until-expiry", "a new lease was refused on database time")
    result = await _write(w, key_of(lease), "in-time", instance=1, skew_ms=ahead)
    expect(
        result == FencedEffectResult(VALUE, False, None),
        "store-time",
        f"a write on a live lease, the writer's clock {skew_text(ahead)}, answered {result}",
    )
    await past_database_lease()
    await _expect_fenced(
        w,
        key_of(lease, step_key="step-2"),
        f"a write after the lease ran out on database time, the writer's clock {skew_text(behind)}",
        instance=1,
        skew_ms=behind,
        rule="store-time",
    )
    expect(await w.rows() == ["in-time"], "store-time", f"business rows {await w.rows()}")


def cases() -> list[Case]:
    """The fenced effect's cases; those only an atomic lease check passes are fencing."""
    named: list[tuple[str, CaseRun, bool]] = [
        (
            "the first write runs its work once and commits its business row",
            first_write_runs_once,
            False,
        ),
        (
            "a replay returns the stored result without running the work",
            replay_returns_stored_result,
            False,
        ),
        (
            "a business key from another execution replays naming its step",
            business_key_replays_with_replayed_from,
            False,
        ),
        (
            "another fingerprint under a business key is IdempotencyKeyConflictError",
            fingerprint_conflict,
            False,
        ),
        (
            "separate steps, names, executions and tenants are separate effects",
            separate_keys_separate_effects,
            False,
        ),
        (
            "invalid effect names are refused before anything is written",
            invalid_names_refused_first,
            False,
        ),
        (
            "invalid business keys are refused before anything is written",
            invalid_business_keys_refused_first,
            False,
        ),
        (
            "keys no later read could give back are refused before anything is written",
            unreplayable_keys_refused_first,
            False,
        ),
        (
            "work that raises leaves no result and no business row",
            raising_work_leaves_nothing,
            False,
        ),
        (
            "a result JSON cannot hold leaves no result and no business row",
            result_json_refuses_leaves_nothing,
            False,
        ),
        (
            "a key nothing is stored under reads None and claims nothing",
            read_of_nothing_stored,
            False,
        ),
        ("a stored result reads as its replay", read_answers_as_a_replay, False),
        (
            "a read with another fingerprint under a business key is IdempotencyKeyConflictError",
            read_fingerprint_conflict,
            False,
        ),
        (
            "a write whose work raised leaves nothing to read",
            read_nothing_after_raising_work,
            False,
        ),
        ("a refused write leaves nothing to read", read_nothing_after_refused_write, True),
        ("another tenant's equal keys read nothing", read_in_own_tenant_only, False),
        (
            "a zombie's read answers and writes nothing",
            zombie_read_answers_and_writes_nothing,
            False,
        ),
        ("a read waits for no write in flight", read_waits_for_no_write, False),
    ]
    for offset, label in BOUNDARIES:
        outcome = "is accepted" if offset < 0 else "is refused"
        named.append((f"a write {label} expiry {outcome}", _write_at(offset, label), True))
    named += [
        (
            "a zombie's write after a takeover is refused, its replay too",
            zombie_write_refused,
            True,
        ),
        ("a write on a released, yielded or finished lease is refused", ended_leases_refused, True),
        ("a write at a token never granted is refused", ungranted_tokens_refused, True),
        (
            "a key naming another holder is refused as superseded, whatever the lease became",
            holder_decided_before_lease_state,
            True,
        ),
        (
            "race: a zombie's write against its lease's hand-over and the new holder's write",
            zombie_write_races_hand_over,
            True,
        ),
        ("race: two instances writing one key", two_instances_one_key, False),
        ("race: two executions writing one business key", two_executions_one_business_key, False),
    ]
    for skew in SKEWS:
        named.append(
            (
                f"the store's time is the authority with the writer's clock {skew_text(skew)}",
                _store_time(skew),
                True,
            )
        )
    named.append(
        ("database time decides, whatever the writer's clock", database_time_decides, True)
    )
    return (
        [Case(CONTRACT, name, run, fencing=fencing) for name, run, fencing in named]
        + write_cases(CONTRACT)
        + limit_cases(CONTRACT)
    )


__all__ = ["CONTRACT", "cases"]
