"""The batch finish's cases bite: each broken in-memory `finish_many` below, on a fresh
`InMemoryBackend` shared by two instances, fails the case about the rule it breaks; the
default `finish_many` (one `finish` after another) passes them all."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from agboss_sql.contracts import ChildExecutionQueueRepository, ChildFinish, FinishResult
from agboss_sql.contracts.types import ChildStatus
from agboss_sql.memory import InMemoryBackend, InMemoryChildExecutionQueueRepository
from agboss_sql.testing._case import CaseContext, StoreFactory
from agboss_sql.testing.contracts import child_queue

CASES = {case.name: case for case in child_queue.cases()}
A_BATCH = "finishes a batch, each at its own attempt"
CONCURRENT = "wakes the parent exactly once among concurrent batch finishers"
WAITING = "queues a waiting parent again from a batch"
TENANTS = "keeps tenants apart in a batch"
OWN_COUNTS = "lowers each parent's count by its own finishes in a batch"


class BatchIgnoresAttempts(InMemoryChildExecutionQueueRepository):
    """Finishes each running child of a batch whatever attempt its entry names."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        return [await self.finish(f.child_execution_id, f.outcome) for f in finishes]


class BatchForgetsItsAnswers(InMemoryChildExecutionQueueRepository):
    """Answers a retried entry as refused, not as its committed finish answered."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        answers = []
        for f in finishes:
            row = self.memory.children.get(f.child_execution_id)
            if row is not None and row.status is ChildStatus.FINISHED:
                answers.append(FinishResult(False, 0))
            else:
                answers.append(
                    await self.finish(f.child_execution_id, f.outcome, attempt=f.attempt)
                )
        return answers


class BatchCountsFromAStaleRead(InMemoryChildExecutionQueueRepository):
    """Reads each parent's count, awaits, then writes the count less the batch's finishes
    (a read-modify-write outside any lock)."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        counts = self.memory.unfinished_children
        read = dict(counts)
        await asyncio.sleep(0)
        answers = []
        for f in finishes:
            row = self.memory.children[f.child_execution_id]
            parent = (row.tenant_id, row.parent_execution_id)
            if row.status is ChildStatus.RUNNING and row.attempt == f.attempt:
                row.status = ChildStatus.FINISHED
                row.finished_attempt = f.attempt
                read[parent] -= 1
                counts[parent] = read[parent]
                row.finish_remaining = read[parent]
                answers.append(FinishResult(True, read[parent]))
            else:
                answers.append(FinishResult(False, read[parent]))
        return answers


class BatchLeavesParentsWaiting(InMemoryChildExecutionQueueRepository):
    """Finishes a batch but never queues again the parent it emptied."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        self._wake_waiting = lambda *_: None  # type: ignore[method-assign]
        try:
            return await super().finish_many(finishes)
        finally:
            del self._wake_waiting


class BatchCountsByParentIdOnly(InMemoryChildExecutionQueueRepository):
    """Counts a batch's finishes on the parent id of the first tenant that has it."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        answers = []
        for f in finishes:
            row = self.memory.children[f.child_execution_id]
            first = min(
                (r for r in self.memory.children.values()),
                key=lambda r: (r.parent_execution_id != row.parent_execution_id, r.sequence),
            )
            row.tenant_id, tenant = first.tenant_id, row.tenant_id
            try:
                answers.append(
                    await self.finish(f.child_execution_id, f.outcome, attempt=f.attempt)
                )
            finally:
                row.tenant_id = tenant
        return answers


class BatchLowersCountsByAnothersNumber(InMemoryChildExecutionQueueRepository):
    """Answers a batch finish right, but lowers each parent's count by the finishes of the
    batch's first parent with its id, in whichever tenant (a count update joined to the
    batch's counts by the parent id alone: the answers, computed before, stay right)."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        rows = self.memory.children
        running = set()
        for f in finishes:
            row = rows.get(f.child_execution_id)
            if row is not None and row.status is ChildStatus.RUNNING:
                running.add(f.child_execution_id)
        answers = await super().finish_many(finishes)
        taken: dict[tuple[str, str], int] = {}
        for f, answer in zip(finishes, answers, strict=True):
            if answer.finished and f.child_execution_id in running:
                row = rows[f.child_execution_id]
                parent = (row.tenant_id, row.parent_execution_id)
                taken[parent] = taken.get(parent, 0) + 1
        for (tenant, parent), n in taken.items():
            first = min(key for key in taken if key[1] == parent)
            self.memory.unfinished_children[(tenant, parent)] += n - taken[first]
        return answers


BROKEN = [
    (A_BATCH, BatchIgnoresAttempts, "finish-many"),
    (A_BATCH, BatchForgetsItsAnswers, "finish-retry"),
    (CONCURRENT, BatchCountsFromAStaleRead, "one-wake"),
    (WAITING, BatchLeavesParentsWaiting, "wait-wake"),
    (TENANTS, BatchCountsByParentIdOnly, "tenant-apart"),
    (OWN_COUNTS, BatchLowersCountsByAnothersNumber, "finish-count"),
]


@pytest.mark.parametrize(
    ("name", "broken", "rule"),
    BROKEN,
    ids=[f"{broken.__name__} breaks {rule}" for _, broken, rule in BROKEN],
)
async def test_a_broken_batch_finish_fails_the_case_on_the_rule_it_breaks(
    name: str, broken: Callable[..., Any], rule: str
) -> None:
    backend = InMemoryBackend()
    factory = StoreFactory(instance=lambda seam: broken(backend, seam.clock, seam.application))
    with pytest.raises(AssertionError, match=rf"^\[{re.escape(rule)}\] "):
        await CASES[name].run(CaseContext({"child_queue": factory}))


class OneByOne(InMemoryChildExecutionQueueRepository):
    """The contract's default `finish_many`: one `finish` after another."""

    finish_many = ChildExecutionQueueRepository.finish_many


@pytest.mark.parametrize("store", [InMemoryChildExecutionQueueRepository, OneByOne])
async def test_the_reference_queues_pass_the_batch_finish_cases(store: Callable[..., Any]) -> None:
    for name in (A_BATCH, CONCURRENT, WAITING, TENANTS, OWN_COUNTS):
        backend = InMemoryBackend()
        factory = StoreFactory(
            instance=lambda seam, backend=backend: store(backend, seam.clock, seam.application)
        )
        await CASES[name].run(CaseContext({"child_queue": factory}))
