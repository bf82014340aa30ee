"""Child queues whose batch finish breaks one rule that their single finish keeps: an entry
of a child already finished at another attempt (a superseded claimer's finish sent in a
batch) takes the child off its parent's count again; or each finish in a batch is also
taken off the count of every other tenant's parent of the same id. `finish` alone is the
reference's, so only a schedule that sends a batch finish can catch them."""

from __future__ import annotations

from collections.abc import Sequence

from agboss_sql.contracts.rules import checked_child_finishes
from agboss_sql.contracts.types import ChildFinish, ChildStatus, FinishResult
from agboss_sql.memory import InMemoryChildExecutionQueueRepository
from agboss_sql.memory.backend import json_copy


class BatchFinishRecountsFinished(InMemoryChildExecutionQueueRepository):
    """`finish_many` lowers the parent's count for an entry whose child is already finished
    at another attempt (refusing the entry, as it should, but counting it as a finish)."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        answers: list[FinishResult] = []
        for entry in checked_child_finishes(finishes):
            row = self.memory.children.get(entry.child_execution_id)
            if (
                row is not None
                and row.status is ChildStatus.FINISHED
                and row.finished_attempt != entry.attempt
            ):
                parent = (row.tenant_id, row.parent_execution_id)
                self.memory.unfinished_children[parent] -= 1
                answers.append(FinishResult(False, self.memory.unfinished_children[parent]))
                continue
            answers.append(
                self._finish_one(entry.child_execution_id, json_copy(entry.outcome), entry.attempt)
            )
        return answers


class BatchFinishCountsAcrossTenants(InMemoryChildExecutionQueueRepository):
    """`finish_many` takes each child it finishes off its parent's count in every tenant
    that has a parent of that id (a count keyed by the parent's id alone)."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        answers: list[FinishResult] = []
        counts = self.memory.unfinished_children
        for entry in checked_child_finishes(finishes):
            row = self.memory.children.get(entry.child_execution_id)
            was_finished = row is not None and row.status is ChildStatus.FINISHED
            result = self._finish_one(
                entry.child_execution_id, json_copy(entry.outcome), entry.attempt
            )
            if row is not None and result.finished and not was_finished:
                for tenant_id, parent_id in list(counts):
                    if parent_id == row.parent_execution_id and tenant_id != row.tenant_id:
                        counts[(tenant_id, parent_id)] -= 1
            answers.append(result)
        return answers


__all__ = ["BatchFinishCountsAcrossTenants", "BatchFinishRecountsFinished"]
