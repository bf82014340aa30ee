"""Contract suite of `ChildExecutionQueueRepository` (docs/contracts.md): children on any instance.

A child is claimed once (deepest first, then oldest), restarted by compare-and-set on
the attempt it was read at, finished once — only by its current attempt when one is
given, a retry of one attempt's finish answering as the first — and exactly one
finisher of a parent's children sees none left; the parent's wake it owes is claimed by
one claimer (compare-and-set, with a claim that runs out) and marked done once. A child
whose own children run waits (`wait_for_children`): neither claimed nor rescued while it
waits, and made claimable again by the finish of its last child in the same step, so a
wait raced against that finish never loses the wake. Every case runs two instances on one
backing store; the races go through both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.errors import DuplicateChildError
from agboss_sql.contracts.stores import ChildExecutionQueueRepository
from agboss_sql.contracts.types import (
    ChildStatus,
    ClaimedChild,
    FinishResult,
    QueuedChild,
    WaitResult,
)
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._limits import limit_cases
from agboss_sql.testing.contracts._matrix import attempt_cases

CONTRACT = "child_queue"
TENANT = "tenant-1"
ROOT = "root-1"
PARENT = "parent-1"


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _queue(ctx: CaseContext, instance: int = 0) -> ChildExecutionQueueRepository:
    store: ChildExecutionQueueRepository = ctx.store(CONTRACT, instance)
    return store


def _child(
    child_id: str, depth: int = 1, *, parent: str = PARENT, payload: object = None
) -> QueuedChild:
    return QueuedChild(TENANT, ROOT, parent, child_id, depth, payload)


async def _claim(ctx: CaseContext, instance: int = 0) -> ClaimedChild:
    claimed = await _queue(ctx, instance).claim(ctx.instance_id(instance))
    _expect(claimed is not None, "claim-marks-running", "a queued child was not claimed")
    assert claimed is not None
    return claimed


async def claims_nothing_from_an_empty_queue(ctx: CaseContext) -> None:
    """An empty queue answers `None`, on either instance."""
    for instance in (0, 1):
        got = await _queue(ctx, instance).claim(ctx.instance_id(instance))
        _expect(got is None, "claim-once", f"claim of an empty queue gave {got!r}")


async def claims_deepest_first_then_oldest(ctx: CaseContext) -> None:
    """`ORDER BY depth DESC, queued_at, id`: depth decides, then the time queued, then the
    order queued (children queued in one millisecond keep their order)."""
    first, second = _queue(ctx, 0), _queue(ctx, 1)
    await first.enqueue(_child("shallow-old", 1))
    await ctx.clock.advance(10)
    await second.enqueue(_child("deep-new", 3))
    await first.enqueue(_child("shallow-new-a", 1))
    await second.enqueue(_child("shallow-new-b", 1))
    await first.enqueue(_child("deep-newer", 3, parent="parent-2"))
    await ctx.clock.advance(10)
    await second.enqueue(_child("middle", 2))
    await first.enqueue(_child("shallow-newest", 1))
    order: list[str] = []
    for turn in range(7):
        claimed = await _queue(ctx, turn % 2).claim(ctx.instance_id(turn % 2))
        _expect(claimed is not None, "claim-order", f"claim {turn + 1} of 7 found nothing")
        assert claimed is not None
        order.append(claimed.child_execution_id)
    expected = [
        "deep-new",
        "deep-newer",
        "middle",
        "shallow-old",
        "shallow-new-a",
        "shallow-new-b",
        "shallow-newest",
    ]
    _expect(order == expected, "claim-order", f"claimed in order {order}, expected {expected}")
    left = await first.claim(ctx.instance_id(0))
    _expect(left is None, "claim-once", f"an eighth claim of seven children gave {left!r}")


async def marks_a_claimed_child_running_for_its_claimer(ctx: CaseContext) -> None:
    """The claimed row comes back whole, and the child is running for the claimer named."""
    payload = {"input": {"text": "grüße ✓", "items": [1, 2.5, None, True]}}
    await _queue(ctx, 0).enqueue(_child("child-1", 2, payload=payload))
    queued_at = ctx.clock.now()
    await ctx.clock.advance(5)
    claimed = await _queue(ctx, 1).claim("worker-b")
    _expect(claimed is not None, "claim-marks-running", "the queued child was not claimed")
    assert claimed is not None
    got = (
        claimed.tenant_id,
        claimed.root_execution_id,
        claimed.parent_execution_id,
        claimed.child_execution_id,
        claimed.depth,
        claimed.payload,
        claimed.claimed_by,
    )
    want = (TENANT, ROOT, PARENT, "child-1", 2, payload, "worker-b")
    _expect(got == want, "claim-marks-running", f"claimed {got}, expected {want}")
    [listed] = await _queue(ctx, 0).children(TENANT, PARENT)
    facts = (listed.status, listed.claimed_by, listed.attempt, listed.queued_at, listed.payload)
    want_facts = (ChildStatus.RUNNING, "worker-b", claimed.attempt, queued_at, payload)
    _expect(
        facts == want_facts,
        "claim-marks-running",
        f"after the claim children() shows (status, claimed_by, attempt, queued_at, payload) "
        f"= {facts}, expected {want_facts} (queued_at is the application clock's time)",
    )


async def queues_a_child_id_once(ctx: CaseContext) -> None:
    """A child id already queued is `DuplicateChildError`, also from the other instance and
    under another parent; the first child is untouched."""
    await _queue(ctx, 0).enqueue(_child("child-1", payload="first"))
    try:
        await _queue(ctx, 1).enqueue(_child("child-1", 4, parent="parent-2", payload="second"))
    except DuplicateChildError:
        pass
    else:
        raise AssertionError("[enqueue-once] a second enqueue of child-1 was accepted")
    listed = await _queue(ctx, 0).children(TENANT, PARENT)
    _expect(
        [(c.child_execution_id, c.payload, c.depth) for c in listed] == [("child-1", "first", 1)],
        "enqueue-once",
        f"parent-1's children after the refused duplicate: {listed}",
    )
    other = await _queue(ctx, 0).children(TENANT, "parent-2")
    _expect(other == [], "enqueue-once", f"the refused duplicate was queued: {other}")


async def refuses_concurrent_duplicate_enqueues_but_one(ctx: CaseContext) -> None:
    """Ten enqueues of one child id at once: one is queued, the rest are
    `DuplicateChildError` (never another error)."""
    results = await asyncio.gather(
        *(_queue(ctx, i % 2).enqueue(_child("child-1", payload=i)) for i in range(10)),
        return_exceptions=True,
    )
    accepted = [r for r in results if r is None]
    other = [r for r in results if r is not None and not isinstance(r, DuplicateChildError)]
    _expect(not other, "enqueue-once", f"a duplicate enqueue failed with {other[:1]!r}")
    _expect(len(accepted) == 1, "enqueue-once", f"{len(accepted)} of 10 enqueues were accepted")
    listed = await _queue(ctx, 0).children(TENANT, PARENT)
    _expect(len(listed) == 1, "enqueue-once", f"{len(listed)} rows for one child id")


async def never_gives_one_child_to_two_concurrent_claimers(ctx: CaseContext) -> None:
    """200 children drained by 16 concurrent claimers on two instances: every child is
    claimed exactly once, and the queue is empty afterwards."""
    total = 200
    for i in range(total):
        await _queue(ctx, i % 2).enqueue(_child(f"child-{i:03d}", i % 3, parent=f"parent-{i % 7}"))

    async def drain(instance: int, worker: int) -> list[str]:
        got: list[str] = []
        name = f"{ctx.instance_id(instance)}-worker-{worker}"
        while (claimed := await _queue(ctx, instance).claim(name)) is not None:
            got.append(claimed.child_execution_id)
        return got

    claims = await asyncio.gather(*(drain(w % 2, w) for w in range(16)))
    everything = [child for got in claims for child in got]
    doubles = sorted({c for c in everything if everything.count(c) > 1})
    _expect(not doubles, "claim-once", f"children claimed twice: {doubles[:10]}")
    missing = sorted({f"child-{i:03d}" for i in range(total)} - set(everything))
    _expect(not missing, "claim-once", f"children never claimed: {missing[:10]}")
    running = await _queue(ctx, 0).running(total + 10)
    _expect(
        len(running) == total,
        "claim-marks-running",
        f"running() lists {len(running)} of the {total} claimed children",
    )


async def claims_every_queued_child_when_claimers_outnumber_them(ctx: CaseContext) -> None:
    """Forty single claims at once for twenty children, round after round: every child is
    claimed once, and a claim answers `None` only when every queued child went to another
    claimer (never while a child it could have taken was left queued)."""
    for round_ in range(3):
        ids = [f"child-{round_}-{i:02d}" for i in range(20)]
        for i, child_id in enumerate(ids):
            await _queue(ctx, i % 2).enqueue(_child(child_id, i % 2, parent=f"parent-{round_}"))
        claims = await asyncio.gather(
            *(_queue(ctx, i % 2).claim(f"claimer-{i}") for i in range(40))
        )
        got = [c.child_execution_id for c in claims if c is not None]
        doubles = sorted({c for c in got if got.count(c) > 1})
        _expect(not doubles, "claim-once", f"round {round_ + 1}: claimed twice: {doubles}")
        left = sorted(set(ids) - set(got))
        _expect(
            not left,
            "claim-when-queued",
            f"round {round_ + 1}: {len(got)} of 40 concurrent claims got a child and "
            f"{len(left)} of 20 stayed queued: a claim answered None while a child was free "
            f"({left[:5]})",
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


async def _two_finished_children(ctx: CaseContext, parent: str = PARENT) -> tuple[str, str]:
    """Finish two children of `parent`: (the first finished, the last one, which owes the
    wake)."""
    await _queue(ctx, 0).enqueue(_child(f"{parent}/a", parent=parent))
    await _queue(ctx, 1).enqueue(_child(f"{parent}/b", parent=parent))
    a = await _claim(ctx, 0)
    b = await _claim(ctx, 1)
    await _queue(ctx, 0).finish(a.child_execution_id, "a", attempt=a.attempt)
    last = await _queue(ctx, 1).finish(b.child_execution_id, "b", attempt=b.attempt)
    _expect(last == FinishResult(True, 0), "one-wake", f"the last finish gave {last}")
    return a.child_execution_id, b.child_execution_id


async def claims_and_marks_the_parents_wake_once(ctx: CaseContext) -> None:
    """Only the finish that saw none left owes the wake: `unwoken` lists it; `claim_wake`
    gives it to one claimer (a retry by that claimer answers True again, anyone else False);
    `mark_woken` records it done only for that claimer (a retry answers True again); a woken
    parent is not listed nor claimed again."""
    not_last, last = await _two_finished_children(ctx)
    listed = [c.child_execution_id for c in await _queue(ctx, 0).unwoken(10)]
    _expect(listed == [last], "wake-claim", f"unwoken(10) = {listed}, expected [{last!r}]")
    owes_nothing = await _queue(ctx, 1).claim_wake(not_last, "claimer-a", 1_000)
    _expect(not owes_nothing, "wake-claim", "the wake was claimed through a child that owes none")
    unknown = await _queue(ctx, 1).claim_wake("nobody", "claimer-a", 1_000)
    _expect(not unknown, "wake-claim", "the wake of an unknown child was claimed")
    won = await _queue(ctx, 0).claim_wake(last, "claimer-a", 1_000)
    _expect(won, "wake-claim", "the first claim of an owed wake was refused")
    for instance in (0, 1):
        retry = await _queue(ctx, instance).claim_wake(last, "claimer-a", 1_000)
        _expect(retry, "wake-claim", "a retry of the winning claim answered False")
        other = await _queue(ctx, instance).claim_wake(last, f"claimer-{instance}", 1_000)
        _expect(not other, "wake-claim", "a second claimer got a claimed wake")
    claimed = await _queue(ctx, 1).unwoken(10)
    _expect(list(claimed) == [], "wake-claim", f"a wake under a live claim is listed: {claimed}")
    stolen = await _queue(ctx, 1).mark_woken(last, "claimer-b")
    _expect(not stolen, "wake-claim", "another claimer marked the wake done")
    done = await _queue(ctx, 1).mark_woken(last, "claimer-a")
    _expect(done, "wake-claim", "the claimer could not mark its wake done")
    again = await _queue(ctx, 0).mark_woken(last, "claimer-a")
    _expect(again, "wake-claim", "a retry of the claimer's mark answered False")
    await ctx.clock.advance(5_000)
    after = await _queue(ctx, 0).unwoken(10)
    _expect(list(after) == [], "wake-claim", f"a woken parent is listed again: {after}")
    late = await _queue(ctx, 1).claim_wake(last, "claimer-c", 1_000)
    _expect(not late, "wake-claim", "a woken parent's wake was claimed again")


async def lists_owed_wakes_oldest_finish_first(ctx: CaseContext) -> None:
    """`unwoken` lists the owed wakes oldest finish first, whatever the order the children
    were queued in, and `limit` keeps the oldest; a child nobody queued owes no wake, so
    `mark_woken` of it is False."""
    parents = ("parent-queued-first", "parent-queued-second")
    for parent in parents:
        await _queue(ctx, 0).enqueue(_child(f"{parent}/only", parent=parent))
    claimed = {c.child_execution_id: c for c in (await _claim(ctx, 0), await _claim(ctx, 1))}
    finish_order = [f"{parent}/only" for parent in reversed(parents)]
    for child_id in finish_order:
        child = claimed[child_id]
        done = await _queue(ctx, 1).finish(child_id, None, attempt=child.attempt)
        _expect(done == FinishResult(True, 0), "one-wake", f"the only child's finish gave {done}")
        await ctx.clock.advance(10)
    for instance in (0, 1):
        listed = [c.child_execution_id for c in await _queue(ctx, instance).unwoken(10)]
        _expect(
            listed == finish_order,
            "wake-order",
            f"unwoken(10) = {listed}, expected the oldest finish first: {finish_order}",
        )
        oldest = [c.child_execution_id for c in await _queue(ctx, instance).unwoken(1)]
        _expect(oldest == finish_order[:1], "wake-order", f"unwoken(1) = {oldest}")
    unknown = await _queue(ctx, 1).mark_woken("nobody", "claimer-a")
    _expect(not unknown, "wake-claim", "the wake of a child nobody queued was marked done")


async def marks_only_its_own_childs_wake(ctx: CaseContext) -> None:
    """`mark_woken` records the wake of the child it names only: a claimer holding the
    claims of two parents' wakes marks one, and once the claims run out the other is
    listed and claimed again."""
    _, first = await _two_finished_children(ctx, parent="parent-a")
    _, second = await _two_finished_children(ctx, parent="parent-b")
    for child in (first, second):
        claimed = await _queue(ctx, 0).claim_wake(child, "claimer-a", 1_000)
        _expect(claimed, "wake-claim", f"the claim of the wake owed by {child!r} was refused")
    done = await _queue(ctx, 1).mark_woken(first, "claimer-a")
    _expect(done, "wake-claim", "the claimer could not mark its wake done")
    await ctx.clock.advance(1_000)
    listed = [c.child_execution_id for c in await _queue(ctx, 1).unwoken(10)]
    _expect(
        listed == [second],
        "wake-claim",
        f"after marking {first!r} woken and the claims ran out, unwoken(10) = {listed}, "
        f"expected [{second!r}]",
    )
    again = await _queue(ctx, 1).claim_wake(second, "claimer-b", 1_000)
    _expect(again, "wake-claim", "a wake nobody marked done could not be claimed again")


async def hands_a_run_out_wake_claim_to_another_claimer(ctx: CaseContext) -> None:
    """A claim lives `claim_ms` on the application clock: until then nobody else gets the
    wake and it is not listed; from then on it is listed, another claimer takes it, and the
    first claimer's late mark is refused."""
    _, last = await _two_finished_children(ctx)
    _expect(await _queue(ctx, 0).claim_wake(last, "slow", 1_000), "wake-claim", "claim refused")
    await ctx.clock.advance(999)
    early = await _queue(ctx, 1).claim_wake(last, "sweep", 1_000)
    _expect(not early, "wake-claim-expiry", "a claim was taken over 1 ms before it ran out")
    hidden = await _queue(ctx, 1).unwoken(10)
    _expect(list(hidden) == [], "wake-claim-expiry", f"a live claim is listed: {hidden}")
    await ctx.clock.advance(1)
    listed = [c.child_execution_id for c in await _queue(ctx, 1).unwoken(10)]
    _expect(listed == [last], "wake-claim-expiry", f"a run-out claim is not listed: {listed}")
    taken = await _queue(ctx, 1).claim_wake(last, "sweep", 1_000)
    _expect(taken, "wake-claim-expiry", "a claim that ran out was not handed over")
    late = await _queue(ctx, 0).mark_woken(last, "slow")
    _expect(not late, "wake-claim", "the superseded claimer marked the wake done")
    done = await _queue(ctx, 1).mark_woken(last, "sweep")
    _expect(done, "wake-claim", "the new claimer could not mark the wake done")


async def lets_one_of_concurrent_wake_claimers_win(ctx: CaseContext) -> None:
    """Eight claimers of one owed wake at once through both instances, round after round:
    exactly one holds the claim."""
    for round_ in range(5):
        _, last = await _two_finished_children(ctx, parent=f"parent-{round_}")
        claims = await asyncio.gather(
            *(_queue(ctx, i % 2).claim_wake(last, f"claimer-{i}", 60_000) for i in range(8))
        )
        _expect(
            claims.count(True) == 1,
            "wake-claim",
            f"round {round_ + 1}: {claims.count(True)} of 8 concurrent wake claims won",
        )


async def lists_children_in_queue_order_and_running_ones_oldest_first(ctx: CaseContext) -> None:
    """`children(parent)` lists every child of the parent (any status) in queue order;
    `running(limit)` lists running children, oldest first, at most `limit`."""
    for i, depth in enumerate([1, 5, 2, 3]):
        await _queue(ctx, i % 2).enqueue(_child(f"child-{i}", depth, payload={"n": i}))
        await ctx.clock.advance(1)
    await _queue(ctx, 1).enqueue(_child("cousin", 9, parent="parent-2"))
    empty = await _queue(ctx, 0).running(10)
    _expect(list(empty) == [], "running-listed", f"running() before any claim: {empty}")
    cousin = await _claim(ctx, 0)  # depth 9: claimed first
    child_1 = await _claim(ctx, 1)  # depth 5
    child_3 = await _claim(ctx, 0)  # depth 3
    _expect(
        [cousin.child_execution_id, child_1.child_execution_id, child_3.child_execution_id]
        == ["cousin", "child-1", "child-3"],
        "claim-order",
        "claims did not go deepest first",
    )
    await _queue(ctx, 1).finish("child-3", None)
    listed = await _queue(ctx, 1).children(TENANT, PARENT)
    got = [(c.child_execution_id, c.status, c.payload) for c in listed]
    want = [
        ("child-0", ChildStatus.QUEUED, {"n": 0}),
        ("child-1", ChildStatus.RUNNING, {"n": 1}),
        ("child-2", ChildStatus.QUEUED, {"n": 2}),
        ("child-3", ChildStatus.FINISHED, {"n": 3}),
    ]
    _expect(got == want, "children-listed", f"children(parent-1) = {got}, expected {want}")
    _expect(
        all(c.tenant_id == TENANT and c.root_execution_id == ROOT for c in listed),
        "children-listed",
        "children() lost a child's tenant or root",
    )
    running = [c.child_execution_id for c in await _queue(ctx, 0).running(10)]
    _expect(
        running == ["child-1", "cousin"],
        "running-listed",
        f"running(10) = {running}, expected ['child-1', 'cousin'] (oldest queued first)",
    )
    one = [c.child_execution_id for c in await _queue(ctx, 1).running(1)]
    _expect(one == ["child-1"], "running-listed", f"running(1) = {one}, expected ['child-1']")
    nobody = await _queue(ctx, 0).children(TENANT, "nobody")
    _expect(list(nobody) == [], "children-listed", f"children of an unknown parent: {nobody}")


async def lists_a_parents_children_per_tenant(ctx: CaseContext) -> None:
    """`children(tenant, parent)` lists that tenant's children only: another tenant's
    children under the same parent id (and their payloads) never show."""
    await _queue(ctx, 0).enqueue(_child("child-1", payload={"secret": "tenant-1's"}))
    await _queue(ctx, 1).enqueue(
        QueuedChild("tenant-2", ROOT, PARENT, "child-2", 1, {"secret": "tenant-2's"})
    )
    for instance, tenant, want in ((0, TENANT, "child-1"), (1, "tenant-2", "child-2")):
        listed = await _queue(ctx, instance).children(tenant, PARENT)
        _expect(
            [(c.tenant_id, c.child_execution_id) for c in listed] == [(tenant, want)],
            "tenant-apart",
            f"{tenant}'s children of {PARENT}: {listed}",
        )
    nobody = await _queue(ctx, 0).children("tenant-3", PARENT)
    _expect(nobody == [], "tenant-apart", f"a third tenant listed {nobody}")


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


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("lists a parent's children per tenant", lists_a_parents_children_per_tenant),
    ("counts only its tenant's siblings", counts_only_its_tenants_siblings),
    ("claims nothing from an empty queue", claims_nothing_from_an_empty_queue),
    ("claims deepest first, then oldest", claims_deepest_first_then_oldest),
    (
        "marks a claimed child running for its claimer",
        marks_a_claimed_child_running_for_its_claimer,
    ),
    ("queues a child id once", queues_a_child_id_once),
    (
        "refuses concurrent duplicate enqueues but one",
        refuses_concurrent_duplicate_enqueues_but_one,
    ),
    (
        "never gives one child to two concurrent claimers",
        never_gives_one_child_to_two_concurrent_claimers,
    ),
    (
        "claims every queued child when claimers outnumber them",
        claims_every_queued_child_when_claimers_outnumber_them,
    ),
    (
        "restarts a running child by compare-and-set on its attempt",
        restarts_a_running_child_by_compare_and_set,
    ),
    (
        "lets one of concurrent restarts of one attempt win",
        lets_one_of_concurrent_restarts_of_one_attempt_win,
    ),
    ("finishes a running child once", finishes_a_running_child_once),
    (
        "wakes the parent exactly once among concurrent finishers",
        wakes_the_parent_exactly_once_among_concurrent_finishers,
    ),
    (
        "counts unfinished siblings only of the parent",
        counts_unfinished_siblings_only_of_the_parent,
    ),
    ("ignores a superseded attempt's late finish", ignores_a_superseded_attempts_late_finish),
    (
        "lets only the current attempt win a finish race",
        lets_only_the_current_attempt_win_a_finish_race,
    ),
    (
        "lists children in queue order and running ones oldest first",
        lists_children_in_queue_order_and_running_ones_oldest_first,
    ),
    (
        "answers a retried finish of one attempt as the first",
        answers_a_retried_finish_of_one_attempt_as_the_first,
    ),
    ("claims and marks the parent's wake once", claims_and_marks_the_parents_wake_once),
    ("lists owed wakes oldest finish first", lists_owed_wakes_oldest_finish_first),
    ("marks only its own child's wake", marks_only_its_own_childs_wake),
    (
        "hands a run-out wake claim to another claimer",
        hands_a_run_out_wake_claim_to_another_claimer,
    ),
    ("lets one of concurrent wake claimers win", lets_one_of_concurrent_wake_claimers_win),
    (
        "waits for its children unclaimed and unrescued until the last one finishes",
        waits_for_its_children_unclaimed_and_unrescued_until_the_last_finishes,
    ),
    ("refuses a wait not of the running attempt", refuses_a_wait_not_of_the_running_attempt),
    (
        "never loses the wake of a wait raced by the last finish",
        never_loses_the_wake_of_a_wait_raced_by_the_last_finish,
    ),
]


def cases() -> list[Case]:
    """The child queue's cases (none is a fencing case: the queue is not fenced)."""
    return (
        [Case(CONTRACT, name, run) for name, run in CASES] + attempt_cases() + limit_cases(CONTRACT)
    )


__all__ = ["CONTRACT", "cases"]
