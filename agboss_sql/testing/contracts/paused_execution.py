"""Contract suite of `PausedExecutionRepository` (docs/contracts.md): human-in-the-loop pauses.

A pause is answered once whichever instance takes the answer (the second answer is
`NotPausedError`), its tree's resolved pauses are drained in one pass, `take` and
`cancel` are compare-and-set (a retried take by the same taker answers as the first), and `purge` deletes only taken and cancelled pauses that
last moved before the retention.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.errors import DuplicatePauseError, NotPausedError
from agboss_sql.contracts.stores import PausedExecutionRepository
from agboss_sql.contracts.types import JsonValue, PausedExecution, PauseStatus
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._paused_execution_more import more_cases

CONTRACT = "paused_execution"
TENANT = "tenant-1"
ROOT = "root-1"

PENDING = PauseStatus.PENDING
RESOLVED = PauseStatus.RESOLVED
TAKEN = PauseStatus.TAKEN
CANCELLED = PauseStatus.CANCELLED


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _pauses(ctx: CaseContext, instance: int = 0) -> PausedExecutionRepository:
    store: PausedExecutionRepository = ctx.store(CONTRACT, instance)
    return store


def _pause(
    ctx: CaseContext,
    pause_id: str,
    *,
    root: str = ROOT,
    tenant_id: str = TENANT,
    created_at: int | None = None,
    request: JsonValue = None,
) -> PausedExecution:
    return PausedExecution(
        tenant_id=tenant_id,
        pause_id=pause_id,
        execution_id=f"{root}/exec",
        root_execution_id=root,
        thread_id="thread-1",
        status=PENDING,
        request={"question": f"approve {pause_id}?"} if request is None else request,
        decision=None,
        created_at=ctx.clock.now() if created_at is None else created_at,
    )


async def _answer(
    store: PausedExecutionRepository, pause_id: str, decision: JsonValue
) -> PausedExecution | NotPausedError:
    try:
        return await store.resolve(TENANT, pause_id, decision)
    except NotPausedError as refused:
        return refused


async def reads_back_a_saved_pause(ctx: CaseContext) -> None:
    """A saved pause reads back whole on either instance; another tenant's reads `None`."""
    pause = _pause(ctx, "pause-1", request={"question": "refund 42 €?", "options": [1, 2]})
    await _pauses(ctx, 0).save(pause)
    for instance in (0, 1):
        got = await _pauses(ctx, instance).get(TENANT, "pause-1")
        _expect(got == pause, "pause-round-trip", f"saved {pause}, read back {got}")
    other = await _pauses(ctx, 1).get("tenant-2", "pause-1")
    _expect(other is None, "tenant-isolation", f"another tenant reads the pause: {other}")
    unknown = await _pauses(ctx, 1).get(TENANT, "pause-unknown")
    _expect(unknown is None, "pause-round-trip", f"an unknown pause reads {unknown}")


async def refuses_a_duplicate_pause_id(ctx: CaseContext) -> None:
    """A second save of one pause id is `DuplicatePauseError` and changes nothing."""
    pause = _pause(ctx, "pause-1")
    await _pauses(ctx, 0).save(pause)
    try:
        await _pauses(ctx, 1).save(_pause(ctx, "pause-1", request={"question": "other"}))
    except DuplicatePauseError:
        pass
    else:
        raise AssertionError("[duplicate-pause] a second save of pause-1 was accepted")
    got = await _pauses(ctx, 0).get(TENANT, "pause-1")
    _expect(got == pause, "duplicate-pause", f"the refused save changed the pause: {got}")


async def resolves_a_pause_once(ctx: CaseContext) -> None:
    """`resolve` moves pending -> resolved with the decision and the application clock's
    time; the second answer, on either instance, is `NotPausedError`; so is an unknown
    pause or another tenant's."""
    await _pauses(ctx, 0).save(_pause(ctx, "pause-1"))
    await ctx.clock.advance(250)
    resolved = await _pauses(ctx, 1).resolve(TENANT, "pause-1", {"approved": True, "by": "ana"})
    _expect(
        (resolved.status, resolved.decision, resolved.resolved_at)
        == (RESOLVED, {"approved": True, "by": "ana"}, ctx.clock.now()),
        "resolve-once",
        f"resolve answered {resolved}",
    )
    got = await _pauses(ctx, 0).get(TENANT, "pause-1")
    _expect(got == resolved, "resolve-once", f"get() reads {got}, resolve answered {resolved}")
    for instance in (0, 1):
        second = await _answer(_pauses(ctx, instance), "pause-1", {"approved": False})
        _expect(
            isinstance(second, NotPausedError),
            "resolve-once",
            f"a second answer on instance {instance + 1} gave {second}",
        )
    got = await _pauses(ctx, 1).get(TENANT, "pause-1")
    _expect(got == resolved, "resolve-once", f"the refused answer changed the pause: {got}")
    unknown = await _answer(_pauses(ctx, 0), "pause-unknown", "x")
    _expect(isinstance(unknown, NotPausedError), "not-paused", f"unknown pause: {unknown}")
    await _pauses(ctx, 0).save(_pause(ctx, "pause-2", tenant_id="tenant-2"))
    theirs = await _answer(_pauses(ctx, 1), "pause-2", "x")
    _expect(
        isinstance(theirs, NotPausedError),
        "tenant-isolation",
        f"tenant-1 answered tenant-2's pause: {theirs}",
    )


async def resolves_a_pause_once_across_concurrent_answers(ctx: CaseContext) -> None:
    """Two instances answer one pause at once, round after round, in both orders: exactly
    one answer resolves it, the other is `NotPausedError`, and the winner's decision is
    stored."""
    for round_ in range(10):
        pause_id = f"pause-{round_}"
        await _pauses(ctx, round_ % 2).save(_pause(ctx, pause_id))
        a = _answer(_pauses(ctx, 0), pause_id, {"by": "a"})
        b = _answer(_pauses(ctx, 1), pause_id, {"by": "b"})
        if round_ % 2 == 0:
            got_a, got_b = await asyncio.gather(a, b)
        else:
            got_b, got_a = await asyncio.gather(b, a)
        answers = [got_a, got_b]
        won = [r for r in answers if isinstance(r, PausedExecution)]
        _expect(
            len(won) == 1 and sum(isinstance(r, NotPausedError) for r in answers) == 1,
            "resolve-once",
            f"round {round_ + 1}: two concurrent answers gave {answers}",
        )
        stored = await _pauses(ctx, 0).get(TENANT, pause_id)
        _expect(
            stored is not None and stored.decision == won[0].decision and stored.status is RESOLVED,
            "resolve-once",
            f"round {round_ + 1}: {won[0].decision} won but the pause reads {stored}",
        )


async def drains_a_trees_resolved_pauses_in_one_pass(ctx: CaseContext) -> None:
    """Two branches' pauses answered at once on two instances are both listed by
    `resolved(tenant, root)`, oldest first, with their decisions; pending, taken, another
    tree's and another tenant's pauses are not."""
    start = ctx.clock.now()
    await _pauses(ctx, 0).save(_pause(ctx, "branch-b", created_at=start + 20))
    await _pauses(ctx, 1).save(_pause(ctx, "branch-a", created_at=start + 10))
    await _pauses(ctx, 0).save(_pause(ctx, "branch-c", created_at=start + 30))
    await _pauses(ctx, 1).save(_pause(ctx, "branch-d", created_at=start + 5))
    await _pauses(ctx, 0).save(_pause(ctx, "other-tree", root="root-2"))
    await _pauses(ctx, 1).save(_pause(ctx, "other-tenant", tenant_id="tenant-2"))
    a, b = await asyncio.gather(
        _pauses(ctx, 0).resolve(TENANT, "branch-a", {"branch": "a"}),
        _pauses(ctx, 1).resolve(TENANT, "branch-b", {"branch": "b"}),
    )
    _expect((a.status, b.status) == (RESOLVED, RESOLVED), "drain-resolved", f"answers: {a}, {b}")
    await _pauses(ctx, 1).resolve(TENANT, "branch-d", {"branch": "d"})
    await _pauses(ctx, 0).resolve(TENANT, "other-tree", "x")
    await _pauses(ctx, 1).resolve("tenant-2", "other-tenant", "x")
    taken = await _pauses(ctx, 0).take(TENANT, "branch-d")
    _expect(taken, "take-once", "take of a resolved pause returned False")
    drained = await _pauses(ctx, 0).resolved(TENANT, ROOT)
    got = [(p.pause_id, p.status, p.decision) for p in drained]
    want = [("branch-a", RESOLVED, {"branch": "a"}), ("branch-b", RESOLVED, {"branch": "b"})]
    _expect(got == want, "drain-resolved", f"resolved(tenant-1, root-1) = {got}, want {want}")
    none = await _pauses(ctx, 1).resolved(TENANT, "root-unknown")
    _expect(list(none) == [], "drain-resolved", f"an unknown tree drains {none}")


async def takes_a_resolved_pause_once(ctx: CaseContext) -> None:
    """`take` moves resolved -> taken once; a pending, taken, cancelled or unknown pause
    gives False. Concurrent takes through both instances: one wins."""
    await _pauses(ctx, 0).save(_pause(ctx, "pause-1"))
    early = await _pauses(ctx, 1).take(TENANT, "pause-1")
    _expect(not early, "take-once", "a pending pause was taken")
    await _pauses(ctx, 0).resolve(TENANT, "pause-1", "yes")
    first = await _pauses(ctx, 1).take(TENANT, "pause-1")
    _expect(first, "take-once", "take of a resolved pause returned False")
    again = await _pauses(ctx, 0).take(TENANT, "pause-1")
    _expect(not again, "take-once", "a taken pause was taken again")
    got = await _pauses(ctx, 0).get(TENANT, "pause-1")
    _expect(
        got is not None and (got.status, got.decision) == (TAKEN, "yes"),
        "take-once",
        f"the taken pause reads {got}",
    )
    unknown = await _pauses(ctx, 0).take(TENANT, "pause-unknown")
    _expect(not unknown, "take-once", "an unknown pause was taken")
    for round_ in range(5):
        pause_id = f"race-{round_}"
        await _pauses(ctx, 0).save(_pause(ctx, pause_id))
        await _pauses(ctx, 1).resolve(TENANT, pause_id, round_)
        takes = await asyncio.gather(
            *(_pauses(ctx, i % 2).take(TENANT, pause_id) for i in range(6))
        )
        _expect(
            takes.count(True) == 1,
            "take-once",
            f"round {round_ + 1}: {takes.count(True)} of 6 concurrent takes won",
        )


async def answers_a_retried_take_by_its_taker_as_the_first(ctx: CaseContext) -> None:
    """A take whose reply was lost is sent again by the same taker: it answers True again,
    on either instance; another taker, or a take without a taker, gets False. Among
    concurrent takers exactly one wins, and only its retry answers True."""
    await _pauses(ctx, 0).save(_pause(ctx, "pause-1"))
    await _pauses(ctx, 1).resolve(TENANT, "pause-1", "yes")
    first = await _pauses(ctx, 0).take(TENANT, "pause-1", taker="taker-a")
    _expect(first, "take-once", "take of a resolved pause returned False")
    for instance in (0, 1):
        retry = await _pauses(ctx, instance).take(TENANT, "pause-1", taker="taker-a")
        _expect(retry, "take-retry", f"the taker's retry on instance {instance + 1} gave False")
        other = await _pauses(ctx, instance).take(TENANT, "pause-1", taker="taker-b")
        _expect(not other, "take-retry", "another taker took a taken pause")
        anonymous = await _pauses(ctx, instance).take(TENANT, "pause-1")
        _expect(not anonymous, "take-retry", "a take without a taker took a taken pause")
    got = await _pauses(ctx, 1).get(TENANT, "pause-1")
    _expect(
        got is not None and (got.status, got.decision) == (TAKEN, "yes"),
        "take-retry",
        f"the taken pause reads {got}",
    )
    pending = await _pauses(ctx, 0).take(TENANT, "pause-unknown", taker="taker-a")
    _expect(not pending, "take-once", "an unknown pause was taken")
    for round_ in range(4):
        pause_id = f"race-{round_}"
        await _pauses(ctx, 0).save(_pause(ctx, pause_id))
        await _pauses(ctx, 1).resolve(TENANT, pause_id, round_)
        takes = await asyncio.gather(
            *(_pauses(ctx, i % 2).take(TENANT, pause_id, taker=f"taker-{i}") for i in range(6))
        )
        _expect(
            takes.count(True) == 1,
            "take-once",
            f"round {round_ + 1}: {takes.count(True)} of 6 concurrent takers won",
        )
        winner = takes.index(True)
        retries = [
            await _pauses(ctx, (i + 1) % 2).take(TENANT, pause_id, taker=f"taker-{i}")
            for i in range(6)
        ]
        _expect(
            retries == [i == winner for i in range(6)],
            "take-retry",
            f"round {round_ + 1}: taker-{winner} won; the retries answered {retries}",
        )


async def cancels_only_a_pending_pause(ctx: CaseContext) -> None:
    """`cancel` moves pending -> cancelled once; a cancelled pause cannot be answered
    (`NotPausedError`) or taken, and a resolved one cannot be cancelled."""
    await _pauses(ctx, 0).save(_pause(ctx, "pause-1"))
    await _pauses(ctx, 1).save(_pause(ctx, "pause-2"))
    first = await _pauses(ctx, 1).cancel(TENANT, "pause-1")
    _expect(first, "cancel-cas", "cancel of a pending pause returned False")
    again = await _pauses(ctx, 0).cancel(TENANT, "pause-1")
    _expect(not again, "cancel-cas", "a cancelled pause was cancelled again")
    answer = await _answer(_pauses(ctx, 0), "pause-1", "too late")
    _expect(isinstance(answer, NotPausedError), "not-paused", f"answering a cancelled: {answer}")
    _expect(not await _pauses(ctx, 0).take(TENANT, "pause-1"), "take-once", "took a cancelled")
    got = await _pauses(ctx, 1).get(TENANT, "pause-1")
    _expect(
        got is not None and got.status is CANCELLED and got.decision is None,
        "cancel-cas",
        f"the cancelled pause reads {got}",
    )
    await _pauses(ctx, 0).resolve(TENANT, "pause-2", "yes")
    late = await _pauses(ctx, 1).cancel(TENANT, "pause-2")
    _expect(not late, "cancel-cas", "a resolved pause was cancelled")
    unknown = await _pauses(ctx, 1).cancel(TENANT, "pause-unknown")
    _expect(not unknown, "cancel-cas", "an unknown pause was cancelled")


async def lets_an_answer_or_a_cancel_win_not_both(ctx: CaseContext) -> None:
    """An answer and a cancel of one pause at once, in both orders: exactly one moves it."""
    for round_ in range(8):
        pause_id = f"pause-{round_}"
        await _pauses(ctx, 0).save(_pause(ctx, pause_id))
        answer = _answer(_pauses(ctx, 0), pause_id, "yes")
        cancel = _pauses(ctx, 1).cancel(TENANT, pause_id)
        if round_ % 2 == 0:
            answered, cancelled = await asyncio.gather(answer, cancel)
        else:
            cancelled, answered = await asyncio.gather(cancel, answer)
        resolved = isinstance(answered, PausedExecution)
        _expect(
            resolved != cancelled,
            "resolve-once",
            f"round {round_ + 1}: the answer gave {answered}, the cancel {cancelled}",
        )
        stored = await _pauses(ctx, 1).get(TENANT, pause_id)
        want = RESOLVED if resolved else CANCELLED
        _expect(
            stored is not None and stored.status is want,
            "resolve-once",
            f"round {round_ + 1}: the pause reads {stored}, expected {want}",
        )


async def purges_only_taken_and_cancelled_pauses_past_retention(ctx: CaseContext) -> None:
    """`purge(older_than)` deletes taken and cancelled pauses that last moved before
    `older_than`, answers how many, and keeps pending and resolved pauses however old."""
    created = ctx.clock.now()
    for pause_id in ["pending-old", "resolved-old", "taken-old", "cancelled-old"]:
        await _pauses(ctx, 0).save(_pause(ctx, pause_id, created_at=created))
    for pause_id in ["taken-new", "cancelled-new"]:
        await _pauses(ctx, 1).save(_pause(ctx, pause_id, created_at=created))
    await ctx.clock.advance(1_000)
    moved_old = ctx.clock.now()
    await _pauses(ctx, 0).resolve(TENANT, "resolved-old", "yes")
    await _pauses(ctx, 1).resolve(TENANT, "taken-old", "yes")
    await _pauses(ctx, 0).take(TENANT, "taken-old")
    await _pauses(ctx, 1).cancel(TENANT, "cancelled-old")
    await ctx.clock.advance(10_000)
    moved_new = ctx.clock.now()
    await _pauses(ctx, 0).resolve(TENANT, "taken-new", "yes")
    await _pauses(ctx, 1).take(TENANT, "taken-new")
    await _pauses(ctx, 0).cancel(TENANT, "cancelled-new")
    await ctx.clock.advance(60_000)
    at_edge = await _pauses(ctx, 1).purge(moved_old)
    _expect(at_edge == 0, "purge-retention", f"purge({moved_old}) of pauses moved at it: {at_edge}")
    purged = await _pauses(ctx, 0).purge(moved_old + 1)
    _expect(
        purged == 2,
        "purge-retention",
        f"purge answered {purged}, expected 2 (the taken and the cancelled pause that last "
        f"moved at {moved_old}; created at {created} is not when they last moved)",
    )
    for pause_id, present in [
        ("pending-old", True),
        ("resolved-old", True),
        ("taken-old", False),
        ("cancelled-old", False),
        ("taken-new", True),
        ("cancelled-new", True),
    ]:
        got = await _pauses(ctx, 1).get(TENANT, pause_id)
        _expect(
            (got is not None) == present,
            "purge-retention",
            f"{pause_id} {'was purged' if present else 'survived the purge'}",
        )
    again = await _pauses(ctx, 1).purge(moved_old + 1)
    _expect(again == 0, "purge-retention", f"a second purge answered {again}")
    rest = await _pauses(ctx, 0).purge(moved_new + 1)
    _expect(rest == 2, "purge-retention", f"purging the newer ones answered {rest}, want 2")
    left = [p for p in ["pending-old", "resolved-old"] if await _pauses(ctx, 0).get(TENANT, p)]
    _expect(len(left) == 2, "purge-retention", f"pending and resolved pauses left: {left}")


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("reads back a saved pause", reads_back_a_saved_pause),
    ("refuses a duplicate pause id", refuses_a_duplicate_pause_id),
    ("resolves a pause once", resolves_a_pause_once),
    (
        "resolves a pause once across concurrent answers on two instances",
        resolves_a_pause_once_across_concurrent_answers,
    ),
    (
        "drains a tree's resolved pauses in one pass",
        drains_a_trees_resolved_pauses_in_one_pass,
    ),
    ("takes a resolved pause once", takes_a_resolved_pause_once),
    (
        "answers a retried take by its taker as the first",
        answers_a_retried_take_by_its_taker_as_the_first,
    ),
    ("cancels only a pending pause", cancels_only_a_pending_pause),
    ("lets an answer or a cancel win, not both", lets_an_answer_or_a_cancel_win_not_both),
    (
        "purges only taken and cancelled pauses past retention",
        purges_only_taken_and_cancelled_pauses_past_retention,
    ),
]


def cases() -> list[Case]:
    """The pauses' cases (none is a fencing case: pauses are not fenced)."""
    return [Case(CONTRACT, name, run) for name, run in CASES] + more_cases()


__all__ = ["CONTRACT", "cases"]
