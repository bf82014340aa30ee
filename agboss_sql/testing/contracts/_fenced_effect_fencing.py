"""The fenced-effect cases only an atomic lease check passes: a stale, ended or ungranted
lease refused 1 ms before / at / after expiry, the races of a zombie's write against its
lease's hand-over and of two writers of one key, and the store's time deciding."""

from __future__ import annotations

import dataclasses
from typing import Any

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.types import ExecutionLease, FencedEffectResult
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fenced_effect_support import (
    VALUE,
    CaseRun,
    _expect_fenced,
    _expect_ran,
    _write,
)
from agboss_sql.testing.contracts._fencing import (
    DATABASE_LEASE_MS,
    LEASE_MS,
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
)

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
