"""More cases of the child queue's suite: an idle claimer's listener (`wakeups()`) hears the
children queued, and the waiting parents made claimable again, on another instance.

Added where mutation testing of the stores (docs/mutation.md) found code no case reached:
no case of the suite opened a listener, so a store whose listener never listened, or whose
enqueue, batch enqueue or finish stopped notifying, passed every case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agboss_sql.contracts.stores import QueueWakeups
from agboss_sql.contracts.types import ChildFinish, ChildStatus, FinishResult, QueuedChild
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._child_queue_support import (
    CONTRACT,
    PARENT,
    TENANT,
    _child,
    _expect,
    _queue,
)

HINT_BOUND_S = 10.0
"""How long the case waits for a hint at most. A hint comes at the other instance's commit;
the bound only keeps a listener that never hears from hanging the case (its own wait is 60 s,
so a hint within the bound is one the listener heard, not its time running out)."""


async def _drained(wakeups: QueueWakeups) -> None:
    """Take the hints already received, so the next True is the next act's own."""
    while await wakeups.wait(20):
        pass


async def _told_after(wakeups: QueueWakeups, what: str, act: Callable[[], Awaitable[Any]]) -> None:
    await _drained(wakeups)
    waiting = asyncio.create_task(wakeups.wait(60_000))
    try:
        await act()
        told = await asyncio.wait_for(waiting, HINT_BOUND_S)
    except TimeoutError:
        told = False
    finally:
        waiting.cancel()
    _expect(told, "wake-hint", f"a listener was not told of {what} on another instance")


async def tells_a_listener_of_children_queued_on_another_instance(ctx: CaseContext) -> None:
    """Where the store tells idle claimers (`wakeups()` is not `None`), a listener open on
    instance 1 is told of a child queued on instance 2, of a batch queued there, and of a
    waiting parent made claimable again there by its last child's finish (one by one and in
    a batch finish), each long before its 60 s wait would end; closed, it stays closed and hears
    nothing more. A store whose `wakeups()` is `None` tells nobody and promises nothing here (its
    claimers poll)."""
    queue, other = _queue(ctx, 0), _queue(ctx, 1)
    wakeups = queue.wakeups()
    if wakeups is None:
        return
    try:
        await wakeups.wait(1)  # listening from here on
        await _told_after(wakeups, "a child queued", lambda: other.enqueue(_child("mid")))
        await _told_after(
            wakeups,
            "a batch queued",
            lambda: other.enqueue_many([_child("b"), _child("c")]),
        )
        for i, finish_many in enumerate((False, True)):
            claimed = await queue.claim(ctx.instance_id(0))
            _expect(claimed is not None, "claim-marks-running", "a queued child was not claimed")
            assert claimed is not None
            parent = claimed.child_execution_id
            await queue.enqueue(_child(f"{parent}/x{i}", 2, parent=parent))
            kid = await queue.claim(ctx.instance_id(0))
            _expect(
                kid is not None and kid.child_execution_id == f"{parent}/x{i}",
                "claim-order",
                f"claimed {kid}, expected {parent}/x (deepest first)",
            )
            assert kid is not None
            waited = await queue.wait_for_children(parent, attempt=claimed.attempt)
            _expect(
                waited is not None and waited.waiting,
                "wait-for-children",
                f"{parent} with a running child did not wait: {waited}",
            )
            if finish_many:

                async def finish(
                    kid_id: str = kid.child_execution_id, at: int = kid.attempt
                ) -> Any:
                    return await other.finish_many([ChildFinish(kid_id, at)])
            else:

                async def finish(
                    kid_id: str = kid.child_execution_id, at: int = kid.attempt
                ) -> Any:
                    return await other.finish(kid_id, None, attempt=at)

            await _told_after(
                wakeups,
                f"a waiting parent made claimable again ({'finish_many' if finish_many else 'finish'})",
                finish,
            )
    finally:
        await wakeups.close()
    # Closed, it stays closed, also a while later (a store may pause between attempts to
    # open a listening connection: over a second here): a wait neither listens again nor
    # hears what is queued next.
    await wakeups.wait(1_200)
    await wakeups.wait(1)
    await other.enqueue(_child("after-close"))
    _expect(
        not await wakeups.wait(200),
        "wake-hint",
        "a closed listener was told of a child queued after it closed",
    )


async def claims_a_batch_of_one_and_breaks_ties_in_queue_order(ctx: CaseContext) -> None:
    """`claim_many(1)` takes the head of the queue, as `claim` would; children of one depth
    queued at one time are taken in queue order (the order they were queued in), whatever
    their roots' ids."""
    children = [
        QueuedChild(TENANT, f"root-{root}", PARENT, f"tie-{i}", 1, None)
        for i, root in enumerate("zyxw")
    ]
    await _queue(ctx, 1).enqueue_many(children)
    one = [c.child_execution_id for c in await _queue(ctx, 0).claim_many(ctx.instance_id(0), 1)]
    _expect(one == ["tie-0"], "claim-order", f"claim_many(1) gave {one}, expected ['tie-0']")
    two = [c.child_execution_id for c in await _queue(ctx, 1).claim_many(ctx.instance_id(1), 2)]
    _expect(
        two == ["tie-1", "tie-2"],
        "claim-order",
        f"claim_many(2) gave {two}, expected ['tie-1', 'tie-2'] (queue order, not the roots')",
    )


BIG_BATCH = 300
"""More children than two statements of 128 rows name: a store that sends a batch in parts
(the SQL stores do, 128 ids a statement) sends this one in three."""


async def queues_and_claims_a_batch_larger_than_a_statement(ctx: CaseContext) -> None:
    """A batch of 300 children, three of them queued already (one in each part of 128 a
    store might send it in), queues the other 297, answered in the order given; one
    `claim_many(300)` then takes all 300 in queue order, each at its first attempt, and
    leaves none."""
    ids = [f"big-{i:03d}" for i in range(BIG_BATCH)]
    early = [ids[10], ids[200], ids[290]]
    for child_id in early:
        await _queue(ctx, 0).enqueue(_child(child_id))
    got = list(await _queue(ctx, 1).enqueue_many([_child(i) for i in ids]))
    fresh = [i for i in ids if i not in early]
    _expect(
        got == fresh,
        "queue-once",
        f"enqueue_many of {BIG_BATCH} answered {len(got)} ids, expected the {len(fresh)} not "
        f"queued yet, in order (missing {sorted(set(fresh) - set(got))[:3]}, extra "
        f"{[i for i in got if i not in fresh][:3]})",
    )
    claimed = list(await _queue(ctx, 0).claim_many(ctx.instance_id(0), BIG_BATCH))
    order = [c.child_execution_id for c in claimed]
    _expect(
        order == early + fresh,
        "claim-order",
        f"claim_many({BIG_BATCH}) took {len(order)} children, expected all {BIG_BATCH} in "
        "queue order",
    )
    wrong = [c for c in claimed if (c.attempt, c.claimed_by) != (1, ctx.instance_id(0))]
    _expect(
        not wrong, "claim-marks-running", f"claimed at the wrong attempt or by another: {wrong[:3]}"
    )
    left = list(await _queue(ctx, 1).claim_many(ctx.instance_id(1), 5))
    _expect(not left, "claim-once", f"after all {BIG_BATCH} were claimed, a claim took {left}")


async def queues_again_only_the_waiting_parents_a_batch_emptied(ctx: CaseContext) -> None:
    """A batch finish that empties a waiting parent and a running one queues the waiting
    one again and leaves the running one running, and so does a single `finish` that
    empties another running parent; a parent that still waits for a child of its own stays
    waiting throughout. An entry at an attempt that never ran, of a child
    finished already, and an entry of a child nobody queued each answer not finished."""
    first, second = _queue(ctx, 0), _queue(ctx, 1)
    names = ("p-wait", "p-other", "p-run", "p-run-1")
    await first.enqueue_many([_child(n) for n in names])
    parents = {c.child_execution_id: c for c in await first.claim_many(ctx.instance_id(0), 4)}
    await first.enqueue_many([_child(f"{n}/a", 2, parent=n) for n in names])
    kids = {c.child_execution_id: c for c in await first.claim_many(ctx.instance_id(0), 4)}
    _expect(
        sorted(parents) == sorted(names) and sorted(kids) == sorted(f"{n}/a" for n in names),
        "claim-order",
        f"claimed parents {sorted(parents)} and children {sorted(kids)}",
    )
    for name in ("p-wait", "p-other"):
        waited = await first.wait_for_children(name, attempt=parents[name].attempt)
        _expect(waited is not None and waited.waiting, "wait-state", f"{name} gave {waited}")
    done = list(
        await second.finish_many(
            [ChildFinish(f"{n}/a", kids[f"{n}/a"].attempt) for n in ("p-wait", "p-run")]
        )
    )
    _expect(
        done == [FinishResult(True, 0), FinishResult(True, 0)],
        "finish-once",
        f"the batch finish of each parent's only child gave {done}",
    )
    one = await second.finish("p-run-1/a", None, attempt=kids["p-run-1/a"].attempt)
    _expect(one == FinishResult(True, 0), "finish-once", f"the finish of p-run-1/a gave {one}")
    status = {c.child_execution_id: c.status for c in await first.children(TENANT, PARENT)}
    want = {
        "p-wait": ChildStatus.QUEUED,
        "p-other": ChildStatus.WAITING,
        "p-run": ChildStatus.RUNNING,
        "p-run-1": ChildStatus.RUNNING,
    }
    got = {n: status.get(n) for n in names}
    _expect(
        got == want,
        "wait-wake",
        f"after the finishes the parents read {got}, expected {want} (only the waiting parent "
        "emptied is claimable again)",
    )
    stale = kids["p-wait/a"].attempt + 1
    late = list(await second.finish_many([ChildFinish("p-wait/a", stale)]))
    _expect(
        len(late) == 1 and not late[0].finished,
        "finish-attempt",
        f"a batch entry at attempt {stale}, never run, of a finished child gave {late}",
    )
    unknown = list(await second.finish_many([ChildFinish("nobody-queued", 1)]))
    _expect(
        unknown == [FinishResult(False, 0)],
        "finish-once",
        f"a batch entry of a child nobody queued gave {unknown}, expected one not finished",
    )


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    (
        "tells a listener of children queued on another instance",
        tells_a_listener_of_children_queued_on_another_instance,
    ),
    (
        "claims a batch of one and breaks ties in queue order",
        claims_a_batch_of_one_and_breaks_ties_in_queue_order,
    ),
    (
        "queues and claims a batch larger than a statement",
        queues_and_claims_a_batch_larger_than_a_statement,
    ),
    (
        "queues again only the waiting parents a batch emptied",
        queues_again_only_the_waiting_parents_a_batch_emptied,
    ),
]


def more_cases() -> list[Case]:
    """The cases of this module, in the suite's order."""
    return [Case(CONTRACT, name, run) for name, run in CASES]


__all__ = ["more_cases"]
