"""The cases of `_orders_and_times` bite: each broken store below, the in-memory store with
one column or one time wrong (mistakes the conformance suites missed in a trial of
one-line mistakes, docs/mutation.md "A trial from outside"), fails its case on the rule
it breaks, and the reference store passes every case."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pytest

from agboss_sql.contracts import ChildExecution, ClaimedChild, ExecutionRecord, PausedExecution
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryChildExecutionQueueRepository,
    InMemoryExecutionRecordRepository,
    InMemoryPausedExecutionRepository,
    InMemoryRateLimitRepository,
)
from agboss_sql.testing._case import CaseContext, StoreFactory
from agboss_sql.testing.contracts._orders_and_times import CASES, cases_of


class DrainsInAnswerOrder(InMemoryPausedExecutionRepository):
    """`resolved` ordered by when each pause was answered (`updated_at`), not created."""

    async def resolved(self, tenant_id: str, root_execution_id: str) -> Sequence[PausedExecution]:
        found = await super().resolved(tenant_id, root_execution_id)
        moved = {p.pause_id: self.memory.pauses[(tenant_id, p.pause_id)].updated_at for p in found}
        return sorted(found, key=lambda p: (moved[p.pause_id], p.pause_id))


class CancelWithoutTime(InMemoryPausedExecutionRepository):
    """A cancel that leaves `resolved_at` empty (its `UPDATE` sets the status only)."""

    async def cancel(self, tenant_id: str, pause_id: str) -> bool:
        cancelled = await super().cancel(tenant_id, pause_id)
        if cancelled:
            row = self.memory.pauses[(tenant_id, pause_id)]
            row.pause = dataclasses.replace(row.pause, resolved_at=None)
        return cancelled


class TakeKeepsAnswerTime(InMemoryPausedExecutionRepository):
    """A take that does not stamp the pause's last move: `purge` then measures a taken
    pause's age from its answer."""

    async def take(self, tenant_id: str, pause_id: str, *, taker: str | None = None) -> bool:
        row = self.memory.pauses.get((tenant_id, pause_id))
        answered_at = None if row is None else row.updated_at
        took = await super().take(tenant_id, pause_id, taker=taker)
        if took and row is not None and answered_at is not None:
            row.updated_at = answered_at
        return took


class RefreshReplacesSlot(InMemoryRateLimitRepository):
    """A holder's take again sets its slot to `now + ttl` (no `greatest`)."""

    async def acquire_slot(self, key: str, holder: str, max_slots: int, ttl_ms: int) -> bool:
        took = await super().acquire_slot(key, holder, max_slots, ttl_ms)
        if took:
            self.memory.slots[key][holder] = self._now() + ttl_ms
        return took


class RenewalReplacesSlot(InMemoryRateLimitRepository):
    """A renewal sets the slot to `now + ttl` (no `greatest`)."""

    async def renew_slot(self, key: str, holder: str, ttl_ms: int) -> bool:
        renewed = await super().renew_slot(key, holder, ttl_ms)
        if renewed:
            self.memory.slots[key][holder] = self._now() + ttl_ms
        return renewed


class ThreadInIdOrder(InMemoryExecutionRecordRepository):
    """`find_by_thread` ordered by execution id (the `created_at` term left out)."""

    async def find_by_thread(self, tenant_id: str, thread_id: str) -> Sequence[ExecutionRecord]:
        found = await super().find_by_thread(tenant_id, thread_id)
        return sorted(found, key=lambda r: r.execution_id)


class RunningByClaim(InMemoryChildExecutionQueueRepository):
    """`running` ordered by when each child was claimed, not queued."""

    claims: ClassVar[dict[int, list[str]]] = {}  # per backend: child ids in claim order

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        claimed = await super().claim(instance_id)
        if claimed is not None:
            self.claims.setdefault(id(self.memory), []).append(claimed.child_execution_id)
        return claimed

    async def running(self, limit: int) -> Sequence[ChildExecution]:
        order = self.claims.get(id(self.memory), [])
        found = await super().running(1_000_000)
        return sorted(found, key=lambda c: order.index(c.child_execution_id))[:limit]


def _factory(store: Callable[..., Any], backend: InMemoryBackend) -> StoreFactory:
    # Rate limits run on the store's time, the others on the application's clock.
    def build(seam: Any) -> Any:
        on_store_time = isinstance(store, type) and issubclass(store, InMemoryRateLimitRepository)
        return store(backend, seam.store_clock if on_store_time else seam.clock, seam.application)

    return StoreFactory(instance=build)


PAUSES, LIMITS, RECORDS = "paused_execution", "rate_limit", "execution_record"
QUEUE = "child_queue"
BROKEN = [
    (PAUSES, "drains by creation whatever the answer order", DrainsInAnswerOrder, "drain-order"),
    (PAUSES, "records when a pause was cancelled", CancelWithoutTime, "cancel-time"),
    (PAUSES, "purges a taken pause by its take", TakeKeepsAnswerTime, "purge-retention"),
    (LIMITS, "never shortens a holder's own slot", RefreshReplacesSlot, "slot-never-shortens"),
    (LIMITS, "never shortens a holder's own slot", RenewalReplacesSlot, "slot-never-shortens"),
    (RECORDS, "finds a thread's records by creation", ThreadInIdOrder, "find-by-thread"),
    (QUEUE, "lists running children oldest queued first", RunningByClaim, "running-listed"),
]
REFERENCE = {
    PAUSES: InMemoryPausedExecutionRepository,
    LIMITS: InMemoryRateLimitRepository,
    RECORDS: InMemoryExecutionRecordRepository,
    QUEUE: InMemoryChildExecutionQueueRepository,
}


def test_every_case_has_a_broken_store_that_fails_it() -> None:
    named = {(contract, name) for contract, names in CASES.items() for name, _ in names}
    assert named == {(contract, name) for contract, name, _, _ in BROKEN}


@pytest.mark.parametrize(
    ("contract", "name", "broken", "rule"),
    BROKEN,
    ids=[f"{broken.__name__} breaks {rule}" for _, _, broken, rule in BROKEN],
)
async def test_a_broken_store_fails_the_case_on_the_rule_it_breaks(
    contract: str, name: str, broken: Callable[..., Any], rule: str
) -> None:
    [case] = [c for c in cases_of(contract) if c.name == name]
    ctx = CaseContext({contract: _factory(broken, InMemoryBackend())})
    with pytest.raises(AssertionError, match=rf"^\[{re.escape(rule)}\] "):
        await case.run(ctx)


@pytest.mark.parametrize("contract", sorted(REFERENCE))
async def test_the_reference_store_passes_every_case(contract: str) -> None:
    for case in cases_of(contract):
        ctx = CaseContext({contract: _factory(REFERENCE[contract], InMemoryBackend())})
        await case.run(ctx)
