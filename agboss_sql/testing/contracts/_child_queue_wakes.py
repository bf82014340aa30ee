"""The child-queue cases of the parent's wake and the listings: a wake claimed and marked
once, owed wakes oldest first, a run-out claim handed on, and a parent's children listed
in order, per tenant."""

from __future__ import annotations

import asyncio

from agboss_sql.contracts.types import ChildStatus, FinishResult, QueuedChild
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
