"""The child-queue cases of a child that waits for its own children: neither claimed nor
rescued while it waits, refused unless of the running attempt, and never losing the
wake of a wait raced by the last finish."""

from __future__ import annotations

import asyncio

from agboss_sql.contracts.types import ChildStatus, FinishResult, QueuedChild, WaitResult
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


async def _status(ctx: CaseContext, child_id: str, parent: str = PARENT) -> ChildStatus:
    listed = {c.child_execution_id: c for c in await _queue(ctx, 0).children(TENANT, parent)}
    return listed[child_id].status


async def waits_for_its_children_unclaimed_and_unrescued_until_the_last_finishes(
    ctx: CaseContext,
) -> None:
    """A running child with unfinished children of its own waits: it is neither claimed
    nor listed by `running` nor restarted, its waiting attempt cannot finish it, and a
    retry of the wait answers the same; the finish of its last child makes it `queued`
    again, and the next claim runs it at the next attempt, which goes on (its children
    all finished) and finishes it."""
    await _queue(ctx, 0).enqueue(_child("mid"))
    mid = await _claim(ctx, 0)
    for name in ("mid/a", "mid/b"):
        await _queue(ctx, 1).enqueue(_child(name, 2, parent="mid"))
    a = await _claim(ctx, 1)
    waited = await _queue(ctx, 0).wait_for_children("mid", attempt=mid.attempt)
    _expect(
        waited == WaitResult(True, 2),
        "wait-state",
        f"the wait of a child with 2 unfinished children gave {waited}, expected "
        "WaitResult(waiting=True, remaining=2)",
    )
    retry = await _queue(ctx, 1).wait_for_children("mid", attempt=mid.attempt)
    _expect(retry == WaitResult(True, 2), "wait-retry", f"a retry of the wait gave {retry}")
    status = await _status(ctx, "mid")
    _expect(status is ChildStatus.WAITING, "wait-state", f"the waiting child reads {status}")
    running = [c.child_execution_id for c in await _queue(ctx, 0).running(10)]
    _expect(running == ["mid/a"], "wait-state", f"running(10) lists {running} while mid waits")
    restarted = await _queue(ctx, 1).restart("mid", mid.attempt)
    _expect(restarted is None, "wait-state", f"a waiting child was restarted: {restarted}")
    b = await _claim(ctx, 0)
    _expect(b.child_execution_id == "mid/b", "wait-state", f"claimed {b.child_execution_id}")
    nothing = await _queue(ctx, 1).claim(ctx.instance_id(1))
    _expect(nothing is None, "wait-state", f"a waiting child was claimed: {nothing}")
    early = await _queue(ctx, 1).finish("mid", "early", attempt=mid.attempt)
    _expect(not early.finished, "wait-state", f"the waiting attempt finished its child: {early}")
    first = await _queue(ctx, 0).finish("mid/a", "a", attempt=a.attempt)
    _expect(first == FinishResult(True, 1), "one-wake", f"the first finish gave {first}")
    still = await _status(ctx, "mid")
    _expect(still is ChildStatus.WAITING, "wait-wake", f"woken before its last child: {still}")
    nothing = await _queue(ctx, 0).claim(ctx.instance_id(0))
    _expect(nothing is None, "wait-state", f"a waiting child was claimed: {nothing}")
    last = await _queue(ctx, 1).finish("mid/b", "b", attempt=b.attempt)
    _expect(last == FinishResult(True, 0), "one-wake", f"the last finish gave {last}")
    woken = await _status(ctx, "mid")
    _expect(
        woken is ChildStatus.QUEUED,
        "wait-wake",
        f"after its last child finished the waiting child reads {woken}, expected queued",
    )
    late_retry = await _queue(ctx, 0).wait_for_children("mid", attempt=mid.attempt)
    _expect(
        late_retry == WaitResult(True, 0),
        "wait-retry",
        f"a retry of the wait after the wake gave {late_retry}, expected WaitResult(True, 0)",
    )
    again = await _claim(ctx, 1)
    _expect(
        (again.child_execution_id, again.attempt) == ("mid", mid.attempt + 1),
        "wait-wake",
        f"the claim after the wake gave {again.child_execution_id} at attempt {again.attempt}",
    )
    stale = await _queue(ctx, 0).wait_for_children("mid", attempt=mid.attempt)
    _expect(stale is None, "wait-cas", f"the superseded attempt's wait gave {stale}")
    goes_on = await _queue(ctx, 1).wait_for_children("mid", attempt=again.attempt)
    _expect(
        goes_on == WaitResult(False, 0),
        "wait-state",
        f"the wait of a child whose children all finished gave {goes_on}",
    )
    running = [c.child_execution_id for c in await _queue(ctx, 0).running(10)]
    _expect(running == ["mid"], "wait-state", f"running(10) = {running}: mid must run on")
    done = await _queue(ctx, 1).finish("mid", "merged", attempt=again.attempt)
    _expect(done == FinishResult(True, 0), "finish-once", f"the woken run's finish gave {done}")


async def refuses_a_wait_not_of_the_running_attempt(ctx: CaseContext) -> None:
    """A wait needs the child running at that attempt: an unknown, queued, finished or
    superseded child's wait is `None` and moves nothing; a child with no children (or
    only finished ones) does not wait; children of another tenant do not count."""
    unknown = await _queue(ctx, 0).wait_for_children("nobody", attempt=1)
    _expect(unknown is None, "wait-cas", f"the wait of an unknown child gave {unknown}")
    await _queue(ctx, 0).enqueue(_child("queued-one"))
    queued = await _queue(ctx, 1).wait_for_children("queued-one", attempt=0)
    _expect(queued is None, "wait-cas", f"the wait of a queued child gave {queued}")
    claimed = await _claim(ctx, 0)
    await _queue(ctx, 1).enqueue(
        QueuedChild("tenant-2", ROOT, claimed.child_execution_id, "foreign", 2, None)
    )
    alone = await _queue(ctx, 1).wait_for_children(
        claimed.child_execution_id, attempt=claimed.attempt
    )
    _expect(
        alone == WaitResult(False, 0),
        "wait-state",
        f"the wait of a child without children of its tenant gave {alone}",
    )
    wrong = await _queue(ctx, 0).wait_for_children(
        claimed.child_execution_id, attempt=claimed.attempt + 1
    )
    _expect(wrong is None, "wait-cas", f"another attempt's wait gave {wrong}")
    restarted = await _queue(ctx, 1).restart(claimed.child_execution_id, claimed.attempt)
    assert restarted is not None
    await _queue(ctx, 0).enqueue(_child("grandchild", 2, parent=claimed.child_execution_id))
    superseded = await _queue(ctx, 0).wait_for_children(
        claimed.child_execution_id, attempt=claimed.attempt
    )
    _expect(superseded is None, "wait-cas", f"a superseded attempt's wait gave {superseded}")
    status = await _status(ctx, claimed.child_execution_id)
    _expect(status is ChildStatus.RUNNING, "wait-cas", f"a refused wait moved the child: {status}")
    await _queue(ctx, 1).finish(claimed.child_execution_id, "done", attempt=restarted.attempt)
    finished = await _queue(ctx, 1).wait_for_children(
        claimed.child_execution_id, attempt=restarted.attempt
    )
    _expect(finished is None, "wait-cas", f"the wait of a finished child gave {finished}")


async def never_loses_the_wake_of_a_wait_raced_by_the_last_finish(ctx: CaseContext) -> None:
    """A child goes to wait while its last child finishes, at once through both instances,
    round after round (either first): it waits only if that finish had not happened, and
    then the finish woke it (queued); otherwise it goes on running. Never a waiting child
    whose children all finished."""
    for round_ in range(12):
        mid_id, leaf_id = f"mid-{round_}", f"mid-{round_}/leaf"
        await _queue(ctx, 0).enqueue(_child(mid_id, parent=f"parent-{round_}"))
        mid = await _claim(ctx, 0)
        await _queue(ctx, 1).enqueue(_child(leaf_id, 2, parent=mid_id))
        leaf = await _claim(ctx, 1)
        wait = _queue(ctx, round_ % 2).wait_for_children(mid_id, attempt=mid.attempt)
        finish = _queue(ctx, (round_ + 1) % 2).finish(leaf_id, "leaf", attempt=leaf.attempt)
        if round_ % 2:
            finished, waited = await asyncio.gather(finish, wait)
        else:
            waited, finished = await asyncio.gather(wait, finish)
        _expect(finished == FinishResult(True, 0), "one-wake", f"the leaf's finish: {finished}")
        status = await _status(ctx, mid_id, f"parent-{round_}")
        _expect(waited is not None, "wait-cas", f"round {round_ + 1}: the wait was refused")
        assert waited is not None
        want = ChildStatus.QUEUED if waited.waiting else ChildStatus.RUNNING
        _expect(
            status is want,
            "wait-wake",
            f"round {round_ + 1}: the wait answered {waited} and the child reads {status}, "
            f"expected {want} (a waiting child whose last child finished is a lost wake)",
        )
        attempt = mid.attempt
        if waited.waiting:
            woken = await _claim(ctx, round_ % 2)
            _expect(woken.child_execution_id == mid_id, "wait-wake", f"claimed {woken}")
            attempt = woken.attempt
        done = await _queue(ctx, 0).finish(mid_id, "mid", attempt=attempt)
        _expect(done.finished, "finish-once", f"round {round_ + 1}: the child's finish: {done}")
