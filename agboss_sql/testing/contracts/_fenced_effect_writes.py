"""The fenced-effect cases of writes: a first write runs once and a replay returns the
stored result, the key's rules refused before anything runs, and work that raises or a
result that is not JSON leaves nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from agboss_sql.contracts.errors import (
    ExecutionFencedError,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
)
from agboss_sql.contracts.types import FencedEffectResult
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fenced_effect_support import (
    BAD_BUSINESS_KEYS,
    BAD_NAMES,
    VALUE,
    _expect_ran,
    _write,
)
from agboss_sql.testing.contracts._fencing import (
    OTHER_TENANT,
    World,
    expect,
    fail,
    key_of,
    step_of,
    unreplayable_keys,
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


async def _late_write_refused(w: World, late: Any, label: str, what: str) -> None:
    """`late` (a write through a transaction the effect handed its work, attempted after the
    effect returned) is refused, and nothing of it is committed."""
    try:
        await late
    except Exception:
        pass
    else:
        fail(
            "all-or-nothing",
            f"{what}: the work's transaction took a write after the effect returned",
        )
    rows = await w.rows()
    expect(
        label not in rows,
        "all-or-nothing",
        f"{what}: a write through the kept transaction committed outside any effect ({rows})",
    )


async def kept_transaction_ends_with_the_effect(ctx: CaseContext) -> None:
    """Work that keeps the transaction it was handed (a task it started, a closure) cannot
    write through it once the effect returned, whether the effect committed, its work
    raised or its result was refused: the late write fails and nothing of it is stored, and
    the next effects on the store (on the connection the kept one was) run as usual."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    kept: list[Any] = []
    started = asyncio.Event()
    release = asyncio.Event()

    async def keeping(tx: Any) -> Any:
        kept.append(tx)
        await w.insert(tx, "charge")

        async def later() -> None:
            started.set()
            await release.wait()
            await w.insert(tx, "late-task")

        kept.append(asyncio.ensure_future(later()))
        await started.wait()
        return VALUE

    result = await w.effects(0).save_result_if_absent(key_of(lease), keeping)
    await _expect_ran(w, result, VALUE, "the write whose work kept its transaction")
    tx, task = kept
    release.set()
    await _late_write_refused(w, task, "late-task", "a task the work started, after a commit")
    await _late_write_refused(w, w.insert(tx, "late"), "late", "a kept transaction after a commit")

    async def raising(tx: Any) -> Any:
        kept.append(tx)
        await w.insert(tx, "raised")
        raise WorkFailed("the payment API said no")

    try:
        await w.effects(0).save_result_if_absent(key_of(lease, step_key="step-2"), raising)
    except WorkFailed:
        pass
    else:
        fail("all-or-nothing", "work that raised was answered")
    await _late_write_refused(
        w, w.insert(kept[-1], "late-raised"), "late-raised", "a kept transaction after a rollback"
    )

    async def not_json(tx: Any) -> Any:
        kept.append(tx)
        await w.insert(tx, "not-json")
        return {1, 2}

    try:
        await w.effects(0).save_result_if_absent(key_of(lease, step_key="step-3"), not_json)
    except Exception:
        pass
    else:
        fail("all-or-nothing", "a set as the result was accepted")
    await _late_write_refused(
        w,
        w.insert(kept[-1], "late-refused"),
        "late-refused",
        "a kept transaction after its result was refused",
    )
    for step in ("step-2", "step-3", "step-4"):
        again = await _write(w, key_of(lease, step_key=step), f"next-{step}", {"step": step})
        await _expect_ran(w, again, {"step": step}, f"the next effect ({step}) on the store")
    expect(
        await w.rows() == ["charge", "next-step-2", "next-step-3", "next-step-4"],
        "all-or-nothing",
        f"business rows {await w.rows()}",
    )
