"""The child-queue cases of the batch finish (`finish_many`): each entry fenced by its own
attempt and answered as finishes one after another would answer, a retried batch answered
as the first, exactly one finisher of a parent's last children among concurrent batches
and single finishes, a waiting parent queued again, tenants apart."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from agboss_sql.contracts.types import (
    ChildFinish,
    ChildStatus,
    ClaimedChild,
    FinishResult,
    QueuedChild,
)
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._child_queue_support import (
    PARENT,
    ROOT,
    TENANT,
    _child,
    _expect,
    _queue,
)


async def _claim_all(ctx: CaseContext, instance: int, n: int) -> dict[str, ClaimedChild]:
    claimed = await _queue(ctx, instance).claim_many(ctx.instance_id(instance), n)
    _expect(len(claimed) == n, "claim-marks-running", f"claimed {len(claimed)} of {n} children")
    return {c.child_execution_id: c for c in claimed}


async def finishes_a_batch_each_at_its_own_attempt(ctx: CaseContext) -> None:
    """A batch finishes each running child at its entry's attempt and answers, in its
    order, what finishes one after another would: the parent's count falling entry by
    entry, the superseded attempt's entry refused (its child left running at the new
    attempt), a queued child's and an unknown child's entries refused (one whose parent
    has no finish in the batch answers that parent's count); each finished child keeps its
    outcome. The same batch sent again answers the same and changes
    nothing; an empty batch answers []; a batch naming a child twice is a `ValueError`."""
    first, second = _queue(ctx, 0), _queue(ctx, 1)
    await first.enqueue_many(
        [_child(f"c{i}") for i in range(4)] + [_child("other", parent="parent-2")]
    )
    claimed = await _claim_all(ctx, 0, 5)
    await first.enqueue(_child("late"))  # queued, never claimed
    await first.enqueue(_child("alone", parent="parent-3"))  # its parent's only child, queued
    restarted = await second.restart("c1", claimed["c1"].attempt)
    _expect(restarted is not None, "restart-cas", "the restart of c1 was refused")
    assert restarted is not None
    batch = [
        ChildFinish("c0", claimed["c0"].attempt, {"n": 0}),
        ChildFinish("c1", claimed["c1"].attempt, "superseded"),
        ChildFinish("other", claimed["other"].attempt, [2]),
        ChildFinish("c2", claimed["c2"].attempt, "two"),
        ChildFinish("late", 1, "too early"),
        ChildFinish("nobody", 1, None),
        ChildFinish("alone", 1, "too early"),
        ChildFinish("c3", claimed["c3"].attempt, None),
    ]
    want = [
        FinishResult(True, 4),
        FinishResult(False, 4),
        FinishResult(True, 0),
        FinishResult(True, 3),
        FinishResult(False, 3),
        FinishResult(False, 0),
        FinishResult(False, 1),
        FinishResult(True, 2),
    ]
    got = list(await second.finish_many(batch))
    _expect(
        got == want,
        "finish-many",
        f"the batch answered {got}, expected {want} (parent-1 had 5 unfinished children)",
    )
    retry = list(await first.finish_many(batch))
    # The finished entries answer what they first answered; the refused ones the count now.
    want_retry = [r if r.finished else FinishResult(False, 2) for r in want]
    want_retry[5:7] = [FinishResult(False, 0), FinishResult(False, 1)]
    _expect(
        retry == want_retry,
        "finish-retry",
        f"the same batch sent again answered {retry}, expected {want_retry}: each finished "
        "entry what it first answered, each refused one parent-1's count now (2)",
    )
    listed = {c.child_execution_id: c for c in await first.children(TENANT, PARENT)}
    states = {k: (c.status, c.attempt, c.outcome) for k, c in listed.items()}
    want_states = {
        "c0": (ChildStatus.FINISHED, claimed["c0"].attempt, {"n": 0}),
        "c1": (ChildStatus.RUNNING, restarted.attempt, None),
        "c2": (ChildStatus.FINISHED, claimed["c2"].attempt, "two"),
        "c3": (ChildStatus.FINISHED, claimed["c3"].attempt, None),
        "late": (ChildStatus.QUEUED, 0, None),
    }
    _expect(
        states == want_states,
        "finish-many",
        f"after the batch parent-1's children read {states}, expected {want_states}",
    )
    empty = await first.finish_many([])
    _expect(list(empty) == [], "finish-many", f"an empty batch answered {empty}")
    try:
        await first.finish_many([ChildFinish("c1", restarted.attempt), ChildFinish("c1", 9)])
    except ValueError:
        pass
    else:
        raise AssertionError("[finish-many] a batch naming child c1 twice was accepted")
    last = list(await first.finish_many([ChildFinish("c1", restarted.attempt, "rescued")]))
    _expect(
        last == [FinishResult(True, 1)],
        "finish-many",
        f"the rescued attempt's finish of c1 answered {last}, expected [(True, 1)] ('late' "
        "is unfinished): the refused entries and the duplicate batch changed nothing",
    )
    owed = sorted(c.child_execution_id for c in await first.unwoken(10))
    _expect(owed == ["other"], "one-wake", f"unwoken(10) = {owed}, expected ['other']")


async def wakes_the_parent_exactly_once_among_concurrent_batch_finishers(
    ctx: CaseContext,
) -> None:
    """A parent's children finished at once by batches of both instances and by single
    finishes: every child finishes once, and exactly one of all the answers sees none
    left (its finish owes the parent's wake)."""
    count = 24
    await _queue(ctx, 0).enqueue_many([_child(f"k{i:02}") for i in range(count)])
    claimed = {
        **await _claim_all(ctx, 0, count // 2),
        **await _claim_all(ctx, 1, count // 2),
    }
    names = sorted(claimed)
    calls: list[Awaitable[list[FinishResult]]] = []

    async def single(instance: int, name: str) -> list[FinishResult]:
        c = claimed[name]
        return [await _queue(ctx, instance).finish(name, None, attempt=c.attempt)]

    async def many(instance: int, part: list[str]) -> list[FinishResult]:
        entries = [ChildFinish(n, claimed[n].attempt) for n in part]
        return list(await _queue(ctx, instance).finish_many(entries))

    at = 0
    for i, size in enumerate((5, 1, 3, 1, 7, 1, 2, 4)):
        part = names[at : at + size]
        at += size
        calls.append(single(i % 2, part[0]) if size == 1 else many(i % 2, part))
    answers = [r for rs in await asyncio.gather(*calls) for r in rs]
    finished = sum(1 for r in answers if r.finished)
    _expect(
        finished == count,
        "finish-once",
        f"{finished} of {count} children finished by concurrent batches and finishes",
    )
    zero = [r for r in answers if r.remaining == 0]
    _expect(
        len(zero) == 1,
        "one-wake",
        f"{len(zero)} of the {count} concurrent finishes saw none left, expected exactly one",
    )
    seen = sorted(r.remaining for r in answers)
    _expect(
        seen == list(range(count)),
        "finish-count",
        f"the finishes saw {seen} left, expected each of 0..{count - 1} once",
    )


async def queues_a_waiting_parent_again_from_a_batch(ctx: CaseContext) -> None:
    """A child waiting for its own children is queued again by the batch that finishes its
    last children, in that batch's step: the next claim takes it."""
    await _queue(ctx, 0).enqueue(_child("mid"))
    mid = await _queue(ctx, 0).claim(ctx.instance_id(0))
    _expect(mid is not None, "claim-marks-running", "mid was not claimed")
    assert mid is not None
    await _queue(ctx, 1).enqueue_many([_child(f"mid/{x}", 2, parent="mid") for x in "abc"])
    kids = await _claim_all(ctx, 1, 3)
    waited = await _queue(ctx, 0).wait_for_children("mid", attempt=mid.attempt)
    _expect(waited is not None and waited.waiting, "wait-state", f"the wait gave {waited}")
    one = await _queue(ctx, 1).finish_many([ChildFinish("mid/a", kids["mid/a"].attempt)])
    _expect(list(one) == [FinishResult(True, 2)], "finish-many", f"the first batch gave {one}")
    nothing = await _queue(ctx, 0).claim(ctx.instance_id(0))
    _expect(nothing is None, "wait-state", f"a waiting child was claimed: {nothing}")
    rest = await _queue(ctx, 0).finish_many(
        [ChildFinish(n, kids[n].attempt, n) for n in ("mid/c", "mid/b")]
    )
    _expect(
        list(rest) == [FinishResult(True, 1), FinishResult(True, 0)],
        "one-wake",
        f"the batch of mid's last two children gave {rest}",
    )
    again = await _queue(ctx, 1).claim(ctx.instance_id(1))
    _expect(
        again is not None and again.child_execution_id == "mid",
        "wait-wake",
        f"after the batch finished its last children, the claim took {again}, expected mid",
    )


async def keeps_tenants_apart_in_a_batch(ctx: CaseContext) -> None:
    """One batch finishing children of two tenants under one parent id counts each tenant's
    parent on its own: each tenant's last child sees none left."""
    await _queue(ctx, 0).enqueue_many(
        [
            _child("t1-a"),
            _child("t1-b"),
            QueuedChild("tenant-2", ROOT, PARENT, "t2-a", 1, None),
        ]
    )
    claimed = await _claim_all(ctx, 0, 3)
    got = await _queue(ctx, 1).finish_many(
        [ChildFinish(n, claimed[n].attempt) for n in ("t1-a", "t2-a", "t1-b")]
    )
    want = [FinishResult(True, 1), FinishResult(True, 0), FinishResult(True, 0)]
    _expect(
        list(got) == want,
        "tenant-apart",
        f"the batch over two tenants' parents {PARENT!r} gave {got}, expected {want}",
    )
    owed = sorted(c.child_execution_id for c in await _queue(ctx, 0).unwoken(10))
    _expect(owed == ["t1-b", "t2-a"], "tenant-apart", f"unwoken(10) = {owed}")


async def lowers_each_parents_count_by_its_own_finishes_in_a_batch(ctx: CaseContext) -> None:
    """One batch finishing children of two parents in two tenants (the same two parent ids
    in each), a different number of each parent's, lowers each parent's count by its own
    finishes only: the next finish of each parent's child sees that parent's children left.
    (Answers within the batch can be right while a count is lowered by another parent's
    number: a store that joins the batch's counts to its parents by the tenant or the
    parent id alone.)"""
    taken = {
        (TENANT, PARENT): 2,
        (TENANT, "parent-2"): 1,
        ("tenant-2", PARENT): 1,
        ("tenant-2", "parent-2"): 2,
    }

    def kid(tenant: str, parent: str, i: int) -> str:
        return f"{tenant}/{parent}/{i}"

    await _queue(ctx, 0).enqueue_many(
        [QueuedChild(t, ROOT, p, kid(t, p, i), 1, None) for (t, p) in taken for i in range(3)]
    )
    claimed = await _claim_all(ctx, 0, 12)
    batch = [kid(t, p, i) for i in range(2) for (t, p), n in taken.items() if i < n]
    got = await _queue(ctx, 1).finish_many([ChildFinish(c, claimed[c].attempt) for c in batch])
    _expect(
        len(got) == len(batch) and all(r.finished for r in got),
        "finish-many",
        f"the batch of {batch} gave {got}",
    )
    for (t, p), n in taken.items():
        child_id = kid(t, p, n)
        one = await _queue(ctx, 0).finish(child_id, None, attempt=claimed[child_id].attempt)
        want = FinishResult(True, 3 - n - 1)
        _expect(
            one == want,
            "finish-count",
            f"after a batch finished {n} of the 3 children of {p!r} in {t!r}, the finish of "
            f"{child_id} gave {one}, expected {want} (a count lowered by another parent's "
            "finishes)",
        )
