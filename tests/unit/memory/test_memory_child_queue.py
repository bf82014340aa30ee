"""The in-memory child queue keeps every promise of `ChildExecutionQueueRepository` (3.5)."""

from __future__ import annotations

import asyncio

import pytest
from memory_cluster import START, TENANT, Cluster

from agboss_sql.contracts import (
    ChildStatus,
    ClaimedChild,
    DuplicateChildError,
    FinishResult,
    InvalidIdentifierError,
    QueuedChild,
)


def child(
    child_id: str, depth: int = 1, parent: str = "parent-1", payload: object = None
) -> QueuedChild:
    return QueuedChild(TENANT, "root-1", parent, child_id, depth, payload)


async def test_a_claim_of_an_empty_queue_is_none(cluster: Cluster) -> None:
    assert await cluster.queue(1).claim("instance-1") is None


async def test_a_claim_marks_the_child_running_for_its_claimer(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    await queue.enqueue(child("c-1", payload={"input": 1}))
    claimed = await queue.claim("instance-2")
    assert claimed == ClaimedChild(
        TENANT, "root-1", "parent-1", "c-1", 1, {"input": 1}, attempt=1, claimed_by="instance-2"
    )
    assert await queue.claim("instance-3") is None
    [listed] = await queue.children(TENANT, "parent-1")
    assert (listed.status, listed.attempt, listed.claimed_by, listed.queued_at) == (
        ChildStatus.RUNNING,
        1,
        "instance-2",
        START,
    )


async def test_a_child_id_is_queued_once(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    await queue.enqueue(child("c-1"))
    with pytest.raises(DuplicateChildError):
        await cluster.queue(2).enqueue(child("c-1", parent="parent-2"))
    assert len(await queue.children(TENANT, "parent-1")) == 1
    assert await queue.children(TENANT, "parent-2") == []


async def test_claims_go_deepest_first_then_oldest_then_in_queue_order(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    await queue.enqueue(child("shallow-old", depth=1))
    await cluster.clock.advance(10)
    await queue.enqueue(child("deep-new", depth=3))
    await queue.enqueue(child("shallow-new-a", depth=1))
    await queue.enqueue(child("shallow-new-b", depth=1))
    await queue.enqueue(child("deep-newer", depth=3))
    await cluster.clock.advance(10)
    await queue.enqueue(child("middle", depth=2))
    order = []
    while (claimed := await queue.claim("instance-1")) is not None:
        order.append(claimed.child_execution_id)
    assert order == [
        "deep-new",
        "deep-newer",
        "middle",
        "shallow-old",
        "shallow-new-a",
        "shallow-new-b",
    ]


async def test_two_claimers_never_get_one_child(cluster: Cluster) -> None:
    for i in range(10):
        await cluster.queue(1).enqueue(child(f"c-{i}"))
    claims = await asyncio.gather(*(cluster.queue(i).claim(f"instance-{i}") for i in range(30)))
    claimed = [c.child_execution_id for c in claims if c is not None]
    assert sorted(claimed) == sorted(f"c-{i}" for i in range(10))


async def test_running_lists_running_children_oldest_first_up_to_limit(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    for i in range(4):
        await queue.enqueue(child(f"c-{i}"))
        await cluster.clock.advance(1)
    assert await queue.running(10) == []
    for _ in range(3):
        await queue.claim("instance-1")
    await queue.finish("c-1", None)
    running = await queue.running(10)
    assert [c.child_execution_id for c in running] == ["c-0", "c-2"]
    assert [c.child_execution_id for c in await queue.running(1)] == ["c-0"]
    assert await queue.running(0) == []


async def test_restart_moves_a_running_child_to_this_instance_at_the_next_attempt(
    cluster: Cluster,
) -> None:
    await cluster.queue(1).enqueue(child("c-1"))
    claimed = await cluster.queue(1).claim("instance-1")
    assert claimed is not None and claimed.attempt == 1
    restarted = await cluster.queue(2).restart("c-1", 1)
    assert restarted is not None
    assert (restarted.attempt, restarted.claimed_by) == (2, "instance-2")
    # A compare-and-set on the attempt read: a second sweeper with the old attempt loses.
    assert await cluster.queue(3).restart("c-1", 1) is None
    [listed] = await cluster.queue(1).children(TENANT, "parent-1")
    assert (listed.attempt, listed.claimed_by) == (2, "instance-2")


async def test_concurrent_restarts_of_one_attempt_give_one_winner(cluster: Cluster) -> None:
    await cluster.queue(1).enqueue(child("c-1"))
    await cluster.queue(1).claim("instance-1")
    restarts = await asyncio.gather(*(cluster.queue(i).restart("c-1", 1) for i in range(10)))
    assert len([r for r in restarts if r is not None]) == 1


async def test_restart_needs_a_running_child(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    await queue.enqueue(child("c-1"))
    assert await queue.restart("c-1", 0) is None
    await queue.claim("instance-1")
    await queue.finish("c-1", None)
    assert await queue.restart("c-1", 1) is None
    assert await queue.restart("unknown", 1) is None


async def test_finish_moves_running_to_finished_once_and_counts_the_siblings_left(
    cluster: Cluster,
) -> None:
    queue = cluster.queue(1)
    for i in range(3):
        await queue.enqueue(child(f"c-{i}"))
    await queue.enqueue(child("other-parent", parent="parent-2"))
    for _ in range(4):
        await queue.claim("instance-1")
    assert await queue.finish("c-0", {"ok": 0}) == FinishResult(True, 2)
    assert await queue.finish("c-0", {"ok": "again"}) == FinishResult(False, 2)
    assert await queue.finish("c-1", {"ok": 1}) == FinishResult(True, 1)
    assert await queue.finish("c-2", {"ok": 2}) == FinishResult(True, 0)
    children = await queue.children(TENANT, "parent-1")
    assert [(c.status, c.outcome) for c in children] == [
        (ChildStatus.FINISHED, {"ok": 0}),
        (ChildStatus.FINISHED, {"ok": 1}),
        (ChildStatus.FINISHED, {"ok": 2}),
    ]


async def test_a_queued_child_cannot_finish(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    await queue.enqueue(child("c-1"))
    assert await queue.finish("c-1", None) == FinishResult(False, 1)


async def test_an_unknown_child_finishes_nothing(cluster: Cluster) -> None:
    assert await cluster.queue(1).finish("nobody", None) == FinishResult(False, 0)


async def test_a_superseded_attempts_late_finish_changes_nothing(cluster: Cluster) -> None:
    await cluster.queue(1).enqueue(child("c-1"))
    await cluster.queue(1).enqueue(child("c-2"))
    first = await cluster.queue(1).claim("instance-1")
    assert first is not None
    restarted = await cluster.queue(2).restart(first.child_execution_id, first.attempt)
    assert restarted is not None
    late = await cluster.queue(1).finish(first.child_execution_id, "zombie", attempt=1)
    assert late == FinishResult(False, 2)
    done = await cluster.queue(2).finish(first.child_execution_id, "real", attempt=2)
    assert done == FinishResult(True, 1)
    [listed, _] = await cluster.queue(1).children(TENANT, "parent-1")
    assert listed.outcome == "real"


async def test_exactly_one_concurrent_finisher_sees_zero_remaining(cluster: Cluster) -> None:
    for i in range(20):
        await cluster.queue(1).enqueue(child(f"c-{i}"))
    claims = [await cluster.queue(1).claim("instance-1") for _ in range(20)]
    results = await asyncio.gather(
        *(
            cluster.queue(i % 3).finish(c.child_execution_id, i, attempt=c.attempt)
            for i, c in enumerate(claims)
            if c is not None
        ),
        # Duplicate finishes of the same children race too.
        *(cluster.queue(2).finish(f"c-{i}", "dup") for i in range(20)),
    )
    finished_last = [r for r in results if r.finished and r.remaining == 0]
    assert len(finished_last) == 1
    assert sum(r.finished for r in results) == 20


async def test_children_lists_a_parents_children_in_queue_order(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    await queue.enqueue(child("b", depth=1))
    await queue.enqueue(child("a", depth=5))
    await queue.enqueue(child("x", parent="parent-2"))
    assert [c.child_execution_id for c in await queue.children(TENANT, "parent-1")] == ["b", "a"]
    assert await queue.children(TENANT, "nobody") == []


async def test_payloads_and_outcomes_are_copies(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    payload = {"items": [1]}
    await queue.enqueue(child("c-1", payload=payload))
    payload["items"].append(2)
    claimed = await queue.claim("instance-1")
    assert claimed is not None and claimed.payload == {"items": [1]}
    claimed.payload["items"].append(3)
    [listed] = await queue.children(TENANT, "parent-1")
    assert listed.payload == {"items": [1]}


async def test_arguments_are_checked(cluster: Cluster) -> None:
    queue = cluster.queue(1)
    with pytest.raises(InvalidIdentifierError):
        await queue.enqueue(child(""))
    with pytest.raises(InvalidIdentifierError):
        await queue.claim("")
    with pytest.raises(TypeError):
        await queue.enqueue(child("c-1", payload={"bad": object()}))
    with pytest.raises(ValueError):
        await queue.running(-1)
    assert cluster.backend.children == {}
