"""The child queue's batch cases bite: each broken in-memory queue below, on a fresh
`InMemoryBackend` shared by two instances, fails the batch case about the rule it breaks,
and the explorer's child-queue world catches a batch claim that takes a running child."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from agboss_sql.contracts import ChildStatus, ClaimedChild, QueuedChild
from agboss_sql.memory import InMemoryBackend, InMemoryChildExecutionQueueRepository
from agboss_sql.memory.backend import ChildRow
from agboss_sql.testing._case import CaseContext, StoreFactory
from agboss_sql.testing.contracts import child_queue

CASES = {case.name: case for case in child_queue.cases()}


def _claimed(row: ChildRow, instance_id: str) -> ClaimedChild:
    row.status = ChildStatus.RUNNING
    row.claimed_by = instance_id
    row.attempt += 1
    return ClaimedChild(
        row.tenant_id,
        row.root_execution_id,
        row.parent_execution_id,
        row.child_execution_id,
        row.depth,
        row.payload,
        row.attempt,
        instance_id,
    )


def _queued(store: InMemoryChildExecutionQueueRepository) -> list[ChildRow]:
    rows = [r for r in store.memory.children.values() if r.status is ChildStatus.QUEUED]
    return sorted(rows, key=lambda r: (-r.depth, r.queued_at, r.sequence))


class PickThenMarkBatch(InMemoryChildExecutionQueueRepository):
    """Picks a batch, awaits, then marks it running (no lock held between)."""

    async def claim_many(self, instance_id: str, n: int) -> Sequence[ClaimedChild]:
        picked = _queued(self)[:n]
        await asyncio.sleep(0)
        return [_claimed(row, instance_id) for row in picked]


class BatchInQueueOrder(InMemoryChildExecutionQueueRepository):
    """Takes a batch in the order queued, ignoring the depth."""

    async def claim_many(self, instance_id: str, n: int) -> Sequence[ClaimedChild]:
        rows = sorted(_queued(self), key=lambda r: r.sequence)[:n]
        return [_claimed(row, instance_id) for row in rows]


class BatchRestartsAttempts(InMemoryChildExecutionQueueRepository):
    """Claims every child of a batch at attempt 1, whatever attempt it ran before."""

    async def claim_many(self, instance_id: str, n: int) -> Sequence[ClaimedChild]:
        rows = _queued(self)[:n]
        for row in rows:
            row.attempt = 0
        return [_claimed(row, instance_id) for row in rows]


class BatchCountsSkippedIds(InMemoryChildExecutionQueueRepository):
    """Counts every child of a batch on its parent, the ids it skipped too."""

    async def enqueue_many(self, children: Sequence[QueuedChild]) -> Sequence[str]:
        queued = await super().enqueue_many(children)
        counts = self.memory.unfinished_children
        for child in children:
            if child.child_execution_id not in queued:
                parent = (child.tenant_id, child.parent_execution_id)
                counts[parent] = counts.get(parent, 0) + 1
        return queued


class BatchOverwritesQueuedIds(InMemoryChildExecutionQueueRepository):
    """Queues a batch's children again over the ids already queued."""

    async def enqueue_many(self, children: Sequence[QueuedChild]) -> Sequence[str]:
        for child in children:
            self.memory.children.pop(child.child_execution_id, None)
        return await super().enqueue_many(children)


class BatchCheckThenInsert(InMemoryChildExecutionQueueRepository):
    """Reads which ids are queued, awaits, then queues the others (check-then-write)."""

    async def enqueue_many(self, children: Sequence[QueuedChild]) -> Sequence[str]:
        fresh = [c for c in children if c.child_execution_id not in self.memory.children]
        await asyncio.sleep(0)
        for child in fresh:
            self.memory.children.pop(child.child_execution_id, None)
        queued = await super().enqueue_many(fresh)
        return queued


BROKEN = [
    ("never gives one child to two concurrent batch claimers", PickThenMarkBatch, "claim-once"),
    ("claims a batch in claim order, each at its own attempt", BatchInQueueOrder, "claim-order"),
    (
        "claims a batch in claim order, each at its own attempt",
        BatchRestartsAttempts,
        "claim-order",
    ),
    ("queues a batch once, skipping ids already queued", BatchCountsSkippedIds, "finish-count"),
    ("queues a batch once, skipping ids already queued", BatchOverwritesQueuedIds, "enqueue-once"),
    (
        "queues and counts each id once among concurrent batches",
        BatchCheckThenInsert,
        "enqueue-once",
    ),
]


@pytest.mark.parametrize(
    ("name", "broken", "rule"),
    BROKEN,
    ids=[f"{broken.__name__} breaks {rule}" for _, broken, rule in BROKEN],
)
async def test_a_broken_batch_fails_the_case_on_the_rule_it_breaks(
    name: str, broken: Callable[..., Any], rule: str
) -> None:
    case = CASES[name]
    backend = InMemoryBackend()
    factory = StoreFactory(instance=lambda seam: broken(backend, seam.clock, seam.application))
    ctx = CaseContext({"child_queue": factory})
    with pytest.raises(AssertionError, match=rf"^\[{re.escape(rule)}\] "):
        await case.run(ctx)


async def test_the_reference_queue_passes_the_batch_cases() -> None:
    for name in {name for name, _, _ in BROKEN}:
        backend = InMemoryBackend()
        factory = StoreFactory(
            instance=lambda seam, backend=backend: InMemoryChildExecutionQueueRepository(
                backend, seam.clock, seam.application
            )
        )
        await CASES[name].run(CaseContext({"child_queue": factory}))
