"""The fenced-effect cases of reading a stored result: nothing stored, a replay's answer,
a fingerprint conflict, nothing after a failed write, one tenant's rows only, a zombie's
read, and a read that waits for no write."""

from __future__ import annotations

import dataclasses
from typing import Any

from agboss_sql.contracts.errors import IdempotencyKeyConflictError
from agboss_sql.contracts.types import FencedEffectKey, FencedEffectResult, LeaseHolder
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fenced_effect_support import (
    VALUE,
    _expect_fenced,
    _expect_ran,
    _write,
)
from agboss_sql.testing.contracts._fenced_effect_writes import WorkFailed
from agboss_sql.testing.contracts._fencing import (
    LEASE_MS,
    OTHER_TENANT,
    World,
    expect,
    fail,
    instance_name,
    key_of,
    step_of,
)

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
