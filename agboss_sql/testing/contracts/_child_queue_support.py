"""The child-queue suite's tenant, root and parent, and the queue, child and claim its
cases share."""

from __future__ import annotations

from agboss_sql.contracts.stores import ChildExecutionQueueRepository
from agboss_sql.contracts.types import ClaimedChild, QueuedChild
from agboss_sql.testing._case import CaseContext

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
