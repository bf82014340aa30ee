"""The child-queue cases of enqueues and claims: deepest first then oldest, marked running
for its claimer, a child id queued once, and one child to one of concurrent claimers."""

from __future__ import annotations

import asyncio

from agboss_sql.contracts.errors import DuplicateChildError
from agboss_sql.contracts.types import ChildStatus
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._child_queue_support import (
    PARENT,
    ROOT,
    TENANT,
    _child,
    _expect,
    _queue,
)


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
