"""The child-queue cases of batches: `enqueue_many` queues and counts each new child once
and skips ids already queued; `claim_many` takes children in claim order, each at its own
next attempt, and never gives one child to two claimers."""

from __future__ import annotations

import asyncio

from agboss_sql.contracts.errors import DuplicateChildError
from agboss_sql.contracts.types import ChildStatus, ClaimedChild, QueuedChild
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._child_queue_support import (
    PARENT,
    TENANT,
    _child,
    _claim,
    _expect,
    _queue,
)


async def queues_a_batch_once_skipping_ids_already_queued(ctx: CaseContext) -> None:
    """A batch queues the children not queued yet and answers their ids in its order; an id
    already queued is skipped, its row untouched; each parent's count rises by its children
    queued (so the last finish of each parent, and only it, sees none left); an empty batch
    queues nothing; a batch naming an id twice is a `ValueError` and queues nothing."""
    first, second = _queue(ctx, 0), _queue(ctx, 1)
    await first.enqueue(_child("a", payload="first"))
    got = await second.enqueue_many(
        [
            _child("b", 2, payload={"n": 2}),
            _child("a", 3, parent="parent-2", payload="second"),
            _child("c", parent="parent-2", payload=[3]),
        ]
    )
    _expect(list(got) == ["b", "c"], "enqueue-once", f"the batch answered {got}, expected [b, c]")
    empty = await first.enqueue_many([])
    _expect(list(empty) == [], "enqueue-once", f"an empty batch answered {empty}")
    try:
        await first.enqueue_many([_child("d"), _child("d", parent="parent-2")])
    except ValueError:
        pass
    else:
        raise AssertionError("[enqueue-once] a batch naming child d twice was accepted")
    try:
        await first.enqueue(_child("b"))
    except DuplicateChildError:
        pass
    else:
        raise AssertionError("[enqueue-once] child b, queued by a batch, was queued again")
    mine = [
        (c.child_execution_id, c.depth, c.payload, c.status, c.attempt)
        for c in await first.children(TENANT, PARENT)
    ]
    want = [("a", 1, "first", ChildStatus.QUEUED, 0), ("b", 2, {"n": 2}, ChildStatus.QUEUED, 0)]
    _expect(mine == want, "enqueue-once", f"parent-1's children read {mine}, expected {want}")
    other = [(c.child_execution_id, c.payload) for c in await second.children(TENANT, "parent-2")]
    _expect(other == [("c", [3])], "enqueue-once", f"parent-2's children read {other}")
    left: dict[str, int] = {}
    for turn in range(3):
        claimed = await _claim(ctx, turn % 2)
        result = await _queue(ctx, turn % 2).finish(
            claimed.child_execution_id, None, attempt=claimed.attempt
        )
        left[claimed.child_execution_id] = result.remaining
    want_left = {"b": 1, "a": 0, "c": 0}
    _expect(
        left == want_left,
        "finish-count",
        f"the finishes answered {left} left, expected {want_left}: a batch counts each "
        "parent's children it queued, and only those",
    )


async def claims_a_batch_in_claim_order_each_at_its_own_attempt(ctx: CaseContext) -> None:
    """`claim_many(n)` takes the first `n` queued children in `claim`'s order (deepest
    first, then oldest, then in queue order) and marks each running for its claimer at its
    own next attempt (a parent woken from its wait goes on at its second); fewer when fewer
    are queued, none from an empty queue or for `n == 0`."""
    first, second = _queue(ctx, 0), _queue(ctx, 1)
    await first.enqueue(_child("mid"))
    mid = await _claim(ctx, 0)
    await second.enqueue(_child("mid/x", 2, parent="mid"))
    waited = await first.wait_for_children("mid", attempt=mid.attempt)
    _expect(waited is not None and waited.waiting, "wait-state", f"mid's wait gave {waited}")
    x = await _claim(ctx, 1)
    await ctx.clock.advance(10)
    await first.enqueue_many([_child("old-1"), _child("old-2"), _child("deep", 3)])
    await ctx.clock.advance(10)
    await second.enqueue(_child("new", 1))
    await second.finish(x.child_execution_id, None, attempt=x.attempt)  # mid queued again
    none = await first.claim_many(ctx.instance_id(0), 0)
    _expect(list(none) == [], "claim-once", f"claim_many(0) gave {none}")
    batch = await second.claim_many("worker-b", 3)
    got = [(c.child_execution_id, c.attempt, c.claimed_by, c.depth) for c in batch]
    want = [("deep", 1, "worker-b", 3), ("mid", 2, "worker-b", 1), ("old-1", 1, "worker-b", 1)]
    _expect(
        got == want,
        "claim-order",
        f"claim_many(3) gave {got}, expected {want} (deepest first, then oldest; mid, woken "
        "from its wait, at its second attempt)",
    )
    listed = {c.child_execution_id: c for c in await first.children(TENANT, PARENT)}
    facts = {name: (listed[name].status, listed[name].claimed_by) for name, *_ in want}
    _expect(
        all(f == (ChildStatus.RUNNING, "worker-b") for f in facts.values()),
        "claim-marks-running",
        f"after claim_many the claimed children read (status, claimed_by) {facts}",
    )
    rest = [c.child_execution_id for c in await first.claim_many(ctx.instance_id(0), 10)]
    _expect(rest == ["old-2", "new"], "claim-order", f"claim_many(10) then gave {rest}")
    empty = await second.claim_many("worker-b", 5)
    _expect(list(empty) == [], "claim-once", f"claim_many of an empty queue gave {empty}")
    refused = await first.finish("mid", None, attempt=mid.attempt)
    _expect(not refused.finished, "finish-attempt", f"mid's first attempt finished it: {refused}")
    done = await second.finish("mid", None, attempt=2)
    _expect(done.finished, "finish-attempt", f"mid's second attempt did not finish it: {done}")


async def answers_each_batch_claimed_child_as_it_was_queued(ctx: CaseContext) -> None:
    """`claim_many` answers each child with the tenant, root, parent, id, depth and payload
    it was queued with, at its first attempt and claimed by its claimer: children of two
    tenants, each field of each child its own value (a field read from a neighbouring
    column shows)."""
    queued = [
        QueuedChild("tenant-a", "root-a", "parent-a", "child-a", 2, {"n": 1}),
        QueuedChild("tenant-b", "root-b", "parent-b", "child-b", 2, ["two"]),
    ]
    await _queue(ctx, 1).enqueue_many(queued)
    claimer = ctx.instance_id(0)
    got = sorted(await _queue(ctx, 0).claim_many(claimer, 2), key=lambda c: c.child_execution_id)
    want = [
        ClaimedChild(
            q.tenant_id,
            q.root_execution_id,
            q.parent_execution_id,
            q.child_execution_id,
            q.depth,
            q.payload,
            1,
            claimer,
        )
        for q in queued
    ]
    _expect(
        got == want,
        "claim-marks-running",
        f"claim_many answered {got}, expected the children as queued: {want}",
    )


async def never_gives_one_child_to_two_concurrent_batch_claimers(ctx: CaseContext) -> None:
    """150 children drained by 8 concurrent claimers on two instances, batch claims of 1 to
    7 mixed with single claims: every child is claimed exactly once, none is left queued."""
    total = 150
    await _queue(ctx, 0).enqueue_many(
        [_child(f"child-{i:03d}", i % 3, parent=f"parent-{i % 5}") for i in range(total // 2)]
    )
    await _queue(ctx, 1).enqueue_many(
        [
            _child(f"child-{i:03d}", i % 3, parent=f"parent-{i % 5}")
            for i in range(total // 2, total)
        ]
    )

    async def drain(instance: int, worker: int) -> list[str]:
        got: list[str] = []
        queue = _queue(ctx, instance)
        name = f"{ctx.instance_id(instance)}-worker-{worker}"
        while True:
            if worker % 4 == 3:
                one = await queue.claim(name)
                batch = [] if one is None else [one]
            else:
                batch = list(await queue.claim_many(name, 1 + 2 * worker % 7))
            if not batch:
                return got
            got.extend(c.child_execution_id for c in batch)

    claims = await asyncio.gather(*(drain(w % 2, w) for w in range(8)))
    everything = [child for got in claims for child in got]
    doubles = sorted({c for c in everything if everything.count(c) > 1})
    _expect(not doubles, "claim-once", f"children claimed twice: {doubles[:10]}")
    missing = sorted({f"child-{i:03d}" for i in range(total)} - set(everything))
    _expect(not missing, "claim-once", f"children never claimed: {missing[:10]}")


async def queues_and_counts_each_id_once_among_concurrent_batches(ctx: CaseContext) -> None:
    """Six batches at once on two instances, each overlapping its neighbours by half: every
    id is queued once and answered by exactly one batch, and the parent's count holds each
    child once (the last of 40 finishes, and only it, sees none left)."""
    ids = [f"child-{i:02d}" for i in range(40)]
    batches = [ids[start : start + 10] for start in range(0, 31, 6)]
    answers = await asyncio.gather(
        *(
            _queue(ctx, b % 2).enqueue_many([_child(name) for name in batch])
            for b, batch in enumerate(batches)
        )
    )
    answered = [name for got in answers for name in got]
    doubles = sorted({c for c in answered if answered.count(c) > 1})
    _expect(not doubles, "enqueue-once", f"ids answered by two batches: {doubles[:10]}")
    _expect(
        sorted(answered) == ids,
        "enqueue-once",
        f"the batches answered {len(answered)} ids of the 40 queued",
    )
    listed = [c.child_execution_id for c in await _queue(ctx, 0).children(TENANT, PARENT)]
    _expect(sorted(listed) == ids, "enqueue-once", f"{len(listed)} rows for 40 ids")
    zero = []
    for turn in range(len(ids)):
        claimed = await _claim(ctx, turn % 2)
        result = await _queue(ctx, turn % 2).finish(
            claimed.child_execution_id, None, attempt=claimed.attempt
        )
        if result.remaining == 0:
            zero.append(turn)
    _expect(
        zero == [len(ids) - 1],
        "finish-count",
        f"finishes number {zero} saw none left, expected only the 40th",
    )
