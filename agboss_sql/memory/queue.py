"""The in-memory child execution queue."""

from __future__ import annotations

from collections.abc import Sequence

from agboss_sql.contracts.errors import DuplicateChildError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import (
    checked_child_finishes,
    checked_count,
    checked_int32,
    checked_positive_ms,
    checked_queued_child,
    checked_queued_children,
)
from agboss_sql.contracts.stores import ChildExecutionQueueRepository
from agboss_sql.contracts.types import (
    ChildExecution,
    ChildFinish,
    ChildStatus,
    ClaimedChild,
    FinishResult,
    JsonValue,
    QueuedChild,
    WaitResult,
)
from agboss_sql.memory._fencing import ApplicationClockStore
from agboss_sql.memory.backend import ChildRow, json_copy


def _claimed(row: ChildRow, claimed_by: str) -> ClaimedChild:
    return ClaimedChild(
        tenant_id=row.tenant_id,
        root_execution_id=row.root_execution_id,
        parent_execution_id=row.parent_execution_id,
        child_execution_id=row.child_execution_id,
        depth=row.depth,
        payload=json_copy(row.payload),
        attempt=row.attempt,
        claimed_by=claimed_by,
    )


def _listed(row: ChildRow) -> ChildExecution:
    return ChildExecution(
        tenant_id=row.tenant_id,
        root_execution_id=row.root_execution_id,
        parent_execution_id=row.parent_execution_id,
        child_execution_id=row.child_execution_id,
        depth=row.depth,
        payload=json_copy(row.payload),
        status=row.status,
        attempt=row.attempt,
        claimed_by=row.claimed_by,
        queued_at=row.queued_at,
        outcome=json_copy(row.outcome),
    )


class InMemoryChildExecutionQueueRepository(ApplicationClockStore, ChildExecutionQueueRepository):
    """The child queue in an `InMemoryBackend`.

    Each method reads and writes without awaiting in between, which makes it one atomic
    step on the event loop: two claimers never get one child, and exactly one finisher of
    a parent's last child sees `remaining == 0`.
    """

    async def enqueue(self, child: QueuedChild) -> None:
        checked_queued_child(child)
        payload = json_copy(child.payload)
        if child.child_execution_id in self.memory.children:
            raise DuplicateChildError(
                f"child {child.child_execution_id!r} is already queued: a child id is unique"
            )
        self.memory.children[child.child_execution_id] = ChildRow(
            tenant_id=child.tenant_id,
            root_execution_id=child.root_execution_id,
            parent_execution_id=child.parent_execution_id,
            child_execution_id=child.child_execution_id,
            depth=child.depth,
            payload=payload,
            queued_at=self.clock.now(),
            sequence=self.memory.next_sequence(),
        )
        parent = (child.tenant_id, child.parent_execution_id)
        counts = self.memory.unfinished_children
        counts[parent] = counts.get(parent, 0) + 1

    async def enqueue_many(self, children: Sequence[QueuedChild]) -> Sequence[str]:
        batch = checked_queued_children(children)
        payloads = [json_copy(child.payload) for child in batch]
        queued: list[str] = []
        now = self.clock.now()
        counts = self.memory.unfinished_children
        for child, payload in zip(batch, payloads, strict=True):
            if child.child_execution_id in self.memory.children:
                continue
            self.memory.children[child.child_execution_id] = ChildRow(
                tenant_id=child.tenant_id,
                root_execution_id=child.root_execution_id,
                parent_execution_id=child.parent_execution_id,
                child_execution_id=child.child_execution_id,
                depth=child.depth,
                payload=payload,
                queued_at=now,
                sequence=self.memory.next_sequence(),
            )
            parent = (child.tenant_id, child.parent_execution_id)
            counts[parent] = counts.get(parent, 0) + 1
            queued.append(child.child_execution_id)
        return queued

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        checked_identifier("instance_id", instance_id)
        claimed = self._claim_next(instance_id, 1)
        return claimed[0] if claimed else None

    async def claim_many(self, instance_id: str, n: int) -> Sequence[ClaimedChild]:
        checked_identifier("instance_id", instance_id)
        checked_count("n", n)
        return self._claim_next(instance_id, n)

    def _claim_next(self, instance_id: str, n: int) -> list[ClaimedChild]:
        queued = [row for row in self.memory.children.values() if row.status is ChildStatus.QUEUED]
        picked = sorted(queued, key=lambda r: (-r.depth, r.queued_at, r.sequence))[:n]
        for row in picked:
            row.status = ChildStatus.RUNNING
            row.claimed_by = instance_id
            row.attempt += 1
        return [_claimed(row, instance_id) for row in picked]

    async def running(self, limit: int) -> Sequence[ChildExecution]:
        checked_count("limit", limit)
        rows = sorted(
            (row for row in self.memory.children.values() if row.status is ChildStatus.RUNNING),
            key=lambda r: (r.queued_at, r.sequence),
        )
        return [_listed(row) for row in rows[:limit]]

    async def restart(self, child_execution_id: str, attempt: int) -> ClaimedChild | None:
        checked_identifier("child_execution_id", child_execution_id)
        checked_int32("attempt", attempt)
        row = self.memory.children.get(child_execution_id)
        if row is None or row.status is not ChildStatus.RUNNING or row.attempt != attempt:
            return None
        row.attempt += 1
        row.claimed_by = self.application.instance_id
        return _claimed(row, row.claimed_by)

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> FinishResult:
        checked_identifier("child_execution_id", child_execution_id)
        if attempt is not None:
            checked_int32("attempt", attempt)
        return self._finish_one(child_execution_id, json_copy(outcome), attempt)

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        batch = checked_child_finishes(finishes)
        outcomes = [json_copy(f.outcome) for f in batch]
        # No await between the finishes: the batch is one atomic step.
        return [
            self._finish_one(f.child_execution_id, outcome, f.attempt)
            for f, outcome in zip(batch, outcomes, strict=True)
        ]

    def _finish_one(
        self, child_execution_id: str, outcome: JsonValue, attempt: int | None
    ) -> FinishResult:
        row = self.memory.children.get(child_execution_id)
        if row is None:
            return FinishResult(False, 0)
        if (
            row.status is ChildStatus.FINISHED
            and attempt is not None
            and row.finished_attempt == attempt
            and row.finish_remaining is not None
        ):
            # This attempt's finish already happened: answer what it answered.
            return FinishResult(True, row.finish_remaining)
        finished = row.status is ChildStatus.RUNNING and (attempt is None or row.attempt == attempt)
        if finished:
            row.status = ChildStatus.FINISHED
            row.outcome = outcome
            row.finished_order = self.memory.next_sequence()
            row.finished_attempt = attempt
            self.memory.unfinished_children[(row.tenant_id, row.parent_execution_id)] -= 1
        remaining = self._unfinished_children(row.tenant_id, row.parent_execution_id)
        if finished:
            row.finish_remaining = remaining
            if remaining == 0:
                self._wake_waiting(row.tenant_id, row.parent_execution_id)
        return FinishResult(finished, remaining)

    def _unfinished_children(self, tenant_id: str, parent_execution_id: str) -> int:
        return self.memory.unfinished_children.get((tenant_id, parent_execution_id), 0)

    def _wake_waiting(self, tenant_id: str, parent_execution_id: str) -> None:
        """The parent, when it is a child waiting for its children: claimable again."""
        parent = self.memory.children.get(parent_execution_id)
        if (
            parent is not None
            and parent.tenant_id == tenant_id
            and parent.status is ChildStatus.WAITING
        ):
            parent.status = ChildStatus.QUEUED

    async def wait_for_children(
        self, child_execution_id: str, *, attempt: int
    ) -> WaitResult | None:
        checked_identifier("child_execution_id", child_execution_id)
        checked_int32("attempt", attempt)
        row = self.memory.children.get(child_execution_id)
        if row is None or row.attempt != attempt:
            return None
        remaining = self._unfinished_children(row.tenant_id, child_execution_id)
        if row.status in (ChildStatus.WAITING, ChildStatus.QUEUED) and attempt > 0:
            return WaitResult(True, remaining)  # this attempt's wait already happened
        if row.status is not ChildStatus.RUNNING:
            return None
        if remaining == 0:
            return WaitResult(False, 0)
        row.status = ChildStatus.WAITING
        return WaitResult(True, remaining)

    async def unwoken(self, limit: int) -> Sequence[ChildExecution]:
        checked_count("limit", limit)
        now = self.clock.now()
        rows = sorted(
            (
                row
                for row in self.memory.children.values()
                if row.finish_remaining == 0
                and row.parent_woken_at is None
                and (row.wake_claimed_until is None or row.wake_claimed_until <= now)
            ),
            key=lambda r: r.finished_order or 0,
        )
        return [_listed(row) for row in rows[:limit]]

    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        checked_identifier("child_execution_id", child_execution_id)
        checked_identifier("claimer", claimer)
        checked_positive_ms("claim_ms", claim_ms)
        row = self.memory.children.get(child_execution_id)
        if row is None or row.finish_remaining != 0 or row.parent_woken_at is not None:
            return False
        now = self.clock.now()
        if row.wake_claimed_until is None or row.wake_claimed_until <= now:
            row.wake_claimed_by = claimer
            row.wake_claimed_until = now + claim_ms
            return True
        return row.wake_claimed_by == claimer

    async def mark_woken(self, child_execution_id: str, claimer: str) -> bool:
        checked_identifier("child_execution_id", child_execution_id)
        checked_identifier("claimer", claimer)
        row = self.memory.children.get(child_execution_id)
        if row is None or row.finish_remaining != 0 or row.wake_claimed_by != claimer:
            return False
        if row.parent_woken_at is None:
            row.parent_woken_at = self.clock.now()
        return True

    async def children(self, tenant_id: str, parent_execution_id: str) -> Sequence[ChildExecution]:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("parent_execution_id", parent_execution_id)
        rows = sorted(
            (
                row
                for row in self.memory.children.values()
                if row.parent_execution_id == parent_execution_id and row.tenant_id == tenant_id
            ),
            key=lambda r: r.sequence,
        )
        return [_listed(row) for row in rows]
