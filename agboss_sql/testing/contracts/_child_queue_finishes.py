"""The child-queue cases of restarts and finishes: compare-and-set on the attempt, one
finish of a running child, exactly one finisher that sees no sibling left, a superseded
attempt's late finish ignored, and a retried finish answered as the first."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from agboss_sql.contracts.types import ChildStatus, ClaimedChild, FinishResult, QueuedChild
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._child_queue_support import (
    PARENT,
    ROOT,
    TENANT,
    _child,
    _claim,
    _expect,
    _queue,
)


async def restarts_a_running_child_by_compare_and_set(ctx: CaseContext) -> None:
    """`restart` takes a running child at the attempt read, for this store's instance, at
    the next attempt; a stale attempt, a queued, finished or unknown child gives `None`."""
    await _queue(ctx, 0).enqueue(_child("child-1"))
    await _queue(ctx, 0).enqueue(_child("child-2"))
    before = await _queue(ctx, 0).restart("child-1", 0)
    _expect(before is None, "restart-cas", f"restart of a queued child gave {before!r}")
    claimed = await _claim(ctx, 0)
    restarted = await _queue(ctx, 1).restart(claimed.child_execution_id, claimed.attempt)
    _expect(restarted is not None, "restart-cas", "restart at the attempt read was refused")
    assert restarted is not None
    got = (restarted.child_execution_id, restarted.attempt, restarted.claimed_by)
    want = (claimed.child_execution_id, claimed.attempt + 1, ctx.instance_id(1))
    _expect(
        got == want, "restart-cas", f"restart gave (child, attempt, claimed_by) {got}, want {want}"
    )
    _expect(
        (restarted.depth, restarted.payload, restarted.parent_execution_id)
        == (claimed.depth, claimed.payload, claimed.parent_execution_id),
        "restart-cas",
        f"restart gave another child's facts: {restarted}",
    )
    stale = await _queue(ctx, 0).restart(claimed.child_execution_id, claimed.attempt)
    _expect(stale is None, "restart-cas", f"a second restart at the old attempt gave {stale!r}")
    listed = {c.child_execution_id: c for c in await _queue(ctx, 0).children(TENANT, PARENT)}
    row = listed[claimed.child_execution_id]
    _expect(
        (row.status, row.attempt, row.claimed_by)
        == (ChildStatus.RUNNING, claimed.attempt + 1, ctx.instance_id(1)),
        "restart-cas",
        f"after the restart children() shows {row}",
    )
    finished = await _queue(ctx, 1).finish(claimed.child_execution_id, "done")
    _expect(finished.finished, "finish-once", "finishing the restarted child was refused")
    after = await _queue(ctx, 0).restart(claimed.child_execution_id, claimed.attempt + 1)
    _expect(after is None, "restart-cas", f"restart of a finished child gave {after!r}")
    unknown = await _queue(ctx, 0).restart("nobody", 1)
    _expect(unknown is None, "restart-cas", f"restart of an unknown child gave {unknown!r}")


async def lets_one_of_concurrent_restarts_of_one_attempt_win(ctx: CaseContext) -> None:
    """Sweepers on both instances restart one attempt at once, round after round: exactly
    one wins each round."""
    await _queue(ctx, 0).enqueue(_child("child-1"))
    claimed = await _claim(ctx, 0)
    attempt = claimed.attempt
    for round_ in range(5):
        results = await asyncio.gather(
            *(_queue(ctx, i % 2).restart("child-1", attempt) for i in range(8))
        )
        winners = [r for r in results if r is not None]
        _expect(
            len(winners) == 1,
            "restart-cas",
            f"round {round_ + 1}: {len(winners)} of 8 concurrent restarts of attempt {attempt} won",
        )
        attempt = winners[0].attempt
        _expect(
            attempt == claimed.attempt + round_ + 1,
            "restart-cas",
            f"round {round_ + 1}: the winner got attempt {attempt}",
        )


async def finishes_a_running_child_once(ctx: CaseContext) -> None:
    """running -> finished once, with the outcome; a second finish, a queued child's finish
    and an unknown child's finish change nothing."""
    await _queue(ctx, 0).enqueue(_child("child-1"))
    await _queue(ctx, 0).enqueue(_child("child-2"))
    queued = await _queue(ctx, 1).finish("child-2", "too early")
    _expect(not queued.finished, "finish-once", "a queued (never claimed) child was finished")
    claimed = await _claim(ctx, 0)
    first = await _queue(ctx, 1).finish(claimed.child_execution_id, {"answer": 42})
    _expect(
        first == FinishResult(True, 1),
        "finish-once",
        f"the first finish gave {first}, expected FinishResult(finished=True, remaining=1)",
    )
    again = await _queue(ctx, 0).finish(claimed.child_execution_id, {"answer": "again"})
    _expect(not again.finished, "finish-once", "a second finish of one child was accepted")
    _expect(
        again.remaining == 1,
        "finish-once",
        f"a refused finish counted {again.remaining} unfinished siblings, expected 1",
    )
    unknown = await _queue(ctx, 0).finish("nobody", None)
    _expect(not unknown.finished, "finish-once", "an unknown child was finished")
    listed = {c.child_execution_id: c for c in await _queue(ctx, 0).children(TENANT, PARENT)}
    done, waiting = listed[claimed.child_execution_id], listed["child-2"]
    _expect(
        (done.status, done.outcome) == (ChildStatus.FINISHED, {"answer": 42}),
        "finish-once",
        f"the finished child reads {done.status} with outcome {done.outcome!r}",
    )
    _expect(
        waiting.status is ChildStatus.QUEUED and waiting.outcome is None,
        "finish-once",
        f"the refused finish moved the queued child: {waiting}",
    )


async def wakes_the_parent_exactly_once_among_concurrent_finishers(ctx: CaseContext) -> None:
    """Three parents' children finished all at once on both instances (duplicates racing
    too): per parent exactly one finisher sees `remaining == 0`."""
    parents = [f"parent-{p}" for p in range(3)]
    for p, parent in enumerate(parents):
        for i in range(10):
            await _queue(ctx, i % 2).enqueue(_child(f"child-{p}-{i}", parent=parent))
    claims: list[ClaimedChild] = []
    for i in range(30):
        claims.append(await _claim(ctx, i % 2))
    calls: list[tuple[str, Awaitable[FinishResult]]] = []
    for i, claimed in enumerate(claims):
        store = _queue(ctx, i % 2)
        calls.append(
            (
                claimed.parent_execution_id,
                store.finish(claimed.child_execution_id, i, attempt=claimed.attempt),
            )
        )
        if i % 3 == 0:
            other = _queue(ctx, (i + 1) % 2)
            calls.append(
                (claimed.parent_execution_id, other.finish(claimed.child_execution_id, "dup"))
            )
    results = await asyncio.gather(*(call for _, call in calls))
    for parent in parents:
        mine = [r for (owner, _), r in zip(calls, results, strict=True) if owner == parent]
        woken = [r for r in mine if r.finished and r.remaining == 0]
        _expect(
            len(woken) == 1,
            "one-wake",
            f"{parent}: {len(woken)} finishers saw remaining == 0 among {len(mine)} "
            f"concurrent finishes of its 10 children (remaining seen: "
            f"{sorted(r.remaining for r in mine if r.finished)})",
        )
        _expect(
            sum(r.finished for r in mine) == 10,
            "finish-once",
            f"{parent}: {sum(r.finished for r in mine)} finishes of its 10 children counted",
        )
        listed = await _queue(ctx, 0).children(TENANT, parent)
        _expect(
            all(c.status is ChildStatus.FINISHED for c in listed) and len(listed) == 10,
            "finish-once",
            f"{parent}: not every child reads finished: {[c.status for c in listed]}",
        )


async def counts_unfinished_siblings_only_of_the_parent(ctx: CaseContext) -> None:
    """`remaining` counts the parent's queued and running children, not another parent's;
    nobody sees 0 while a sibling is still queued or running."""
    for i in range(3):
        await _queue(ctx, 0).enqueue(_child(f"child-{i}"))
    await _queue(ctx, 1).enqueue(_child("cousin", parent="parent-2"))
    a = await _claim(ctx, 0)
    b = await _claim(ctx, 1)
    # The third child of parent-1 stays queued; the cousin is never claimed.
    results = await asyncio.gather(
        _queue(ctx, 0).finish(a.child_execution_id, "a", attempt=a.attempt),
        _queue(ctx, 1).finish(b.child_execution_id, "b", attempt=b.attempt),
    )
    _expect(all(r.finished for r in results), "finish-once", f"finishes refused: {results}")
    _expect(
        sorted(r.remaining for r in results) == [1, 2],
        "one-wake",
        f"two finishes of three siblings (one still queued) saw remaining "
        f"{sorted(r.remaining for r in results)}, expected [1, 2]",
    )
    c = await _claim(ctx, 0)
    last = await _queue(ctx, 1).finish(c.child_execution_id, "c", attempt=c.attempt)
    _expect(
        last == FinishResult(True, 0),
        "one-wake",
        f"the last of parent-1's children gave {last}, expected remaining 0 "
        "(parent-2's queued child is not parent-1's)",
    )


async def ignores_a_superseded_attempts_late_finish(ctx: CaseContext) -> None:
    """After a restart, the old attempt's finish changes nothing (not the status, not the
    outcome, and it wakes nobody); the current attempt's finish counts."""
    await _queue(ctx, 0).enqueue(_child("child-1"))
    old = await _claim(ctx, 0)
    new = await _queue(ctx, 1).restart(old.child_execution_id, old.attempt)
    _expect(new is not None, "restart-cas", "restart at the attempt read was refused")
    assert new is not None
    late = await _queue(ctx, 0).finish(old.child_execution_id, "zombie", attempt=old.attempt)
    _expect(
        not late.finished,
        "superseded-finish",
        f"attempt {old.attempt}'s finish was accepted after the restart to {new.attempt}",
    )
    [row] = await _queue(ctx, 1).children(TENANT, PARENT)
    _expect(
        (row.status, row.outcome, row.attempt) == (ChildStatus.RUNNING, None, new.attempt),
        "superseded-finish",
        f"the late finish moved the child: {row}",
    )
    done = await _queue(ctx, 1).finish(new.child_execution_id, "real", attempt=new.attempt)
    _expect(
        done == FinishResult(True, 0),
        "superseded-finish",
        f"the current attempt's finish gave {done}, expected FinishResult(True, 0)",
    )
    [row] = await _queue(ctx, 0).children(TENANT, PARENT)
    _expect(row.outcome == "real", "superseded-finish", f"outcome is {row.outcome!r}")


async def lets_only_the_current_attempt_win_a_finish_race(ctx: CaseContext) -> None:
    """The old and the current attempt finish at once, in both orders, round after round:
    only the current attempt's finish counts."""
    for round_ in range(6):
        child_id = f"child-{round_}"
        await _queue(ctx, 0).enqueue(_child(child_id, parent=f"parent-{round_}"))
        old = await _claim(ctx, 0)
        new = await _queue(ctx, 1).restart(child_id, old.attempt)
        assert new is not None
        zombie = _queue(ctx, 0).finish(child_id, "zombie", attempt=old.attempt)
        current = _queue(ctx, 1).finish(child_id, "real", attempt=new.attempt)
        pair = (zombie, current) if round_ % 2 == 0 else (current, zombie)
        first, second = await asyncio.gather(*pair)
        z, c = (first, second) if round_ % 2 == 0 else (second, first)
        _expect(
            (z.finished, c.finished) == (False, True),
            "superseded-finish",
            f"round {round_ + 1}: the superseded finish gave {z}, the current one {c}",
        )
        [row] = await _queue(ctx, 0).children(TENANT, f"parent-{round_}")
        _expect(row.outcome == "real", "superseded-finish", f"outcome is {row.outcome!r}")


async def answers_a_retried_finish_of_one_attempt_as_the_first(ctx: CaseContext) -> None:
    """A finish whose reply was lost is sent again at the same attempt: it answers what the
    first finish answered (`finished=True`, the same `remaining`, even after the siblings
    finished since) and changes nothing; without an attempt a second finish is refused."""
    await _queue(ctx, 0).enqueue(_child("child-1"))
    await _queue(ctx, 0).enqueue(_child("child-2"))
    first = await _claim(ctx, 0)
    second = await _claim(ctx, 1)
    done = await _queue(ctx, 0).finish(first.child_execution_id, "one", attempt=first.attempt)
    _expect(done == FinishResult(True, 1), "finish-retry", f"the first finish gave {done}")
    again = await _queue(ctx, 1).finish(first.child_execution_id, "one", attempt=first.attempt)
    _expect(
        again == FinishResult(True, 1),
        "finish-retry",
        f"a retry of attempt {first.attempt}'s finish gave {again}, the first gave {done}",
    )
    last = await _queue(ctx, 1).finish(second.child_execution_id, "two", attempt=second.attempt)
    _expect(last == FinishResult(True, 0), "finish-retry", f"the last finish gave {last}")
    for instance in (0, 1):
        late = await _queue(ctx, instance).finish(
            first.child_execution_id, "other", attempt=first.attempt
        )
        _expect(
            late == FinishResult(True, 1),
            "finish-retry",
            f"a retry of the first child's finish after its sibling finished gave {late}: a "
            "retry answers what the first finish answered (remaining 1), never a second 0",
        )
        last_again = await _queue(ctx, instance).finish(
            second.child_execution_id, "two", attempt=second.attempt
        )
        _expect(
            last_again == FinishResult(True, 0),
            "finish-retry",
            f"a retry of the last child's finish gave {last_again}, the first gave {last}",
        )
    anonymous = await _queue(ctx, 0).finish(first.child_execution_id, "one")
    _expect(
        not anonymous.finished,
        "finish-once",
        f"a second finish without an attempt was accepted: {anonymous}",
    )
    wrong = await _queue(ctx, 0).finish(first.child_execution_id, "one", attempt=first.attempt + 1)
    _expect(not wrong.finished, "finish-once", f"another attempt's finish was accepted: {wrong}")
    listed = {
        c.child_execution_id: c.outcome for c in await _queue(ctx, 0).children(TENANT, PARENT)
    }
    _expect(
        listed == {"child-1": "one", "child-2": "two"},
        "finish-retry",
        f"a retried finish changed an outcome: {listed}",
    )
    await _queue(ctx, 0).enqueue(_child("child-3", parent="parent-2"))
    third = await _claim(ctx, 0)
    await _queue(ctx, 1).finish("child-3", "by someone")
    mine = await _queue(ctx, 0).finish("child-3", "mine", attempt=third.attempt)
    _expect(
        not mine.finished,
        "finish-retry",
        f"a child finished without an attempt counts as attempt {third.attempt}'s finish: {mine}",
    )


async def counts_only_its_tenants_siblings(ctx: CaseContext) -> None:
    """A finish counts the unfinished children of its own tenant's parent: another tenant's
    children under the same parent id belong to another parent, so each tenant's last
    finish sees none left and owes its own wake."""
    await _queue(ctx, 0).enqueue(_child("tenant-1-child"))
    await _queue(ctx, 1).enqueue(QueuedChild("tenant-2", ROOT, PARENT, "tenant-2-child", 1, None))
    claimed = {c.child_execution_id: c for c in (await _claim(ctx, 0), await _claim(ctx, 1))}
    for instance, child_id in ((1, "tenant-1-child"), (0, "tenant-2-child")):
        done = await _queue(ctx, instance).finish(child_id, None, attempt=claimed[child_id].attempt)
        _expect(
            done == FinishResult(True, 0),
            "tenant-apart",
            f"the finish of {child_id}, its tenant's only child of {PARENT}, gave {done}",
        )
    owed = sorted(c.child_execution_id for c in await _queue(ctx, 0).unwoken(10))
    _expect(
        owed == ["tenant-1-child", "tenant-2-child"],
        "tenant-apart",
        f"each tenant's parent is owed its wake; unwoken(10) = {owed}",
    )
