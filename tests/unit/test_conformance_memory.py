"""The in-memory store set passes every contract suite (`store_conformance`)."""

from __future__ import annotations

from typing import Any

from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryChildExecutionQueueRepository,
    InMemoryCostLedgerRepository,
    InMemoryExecutionHistoryRepository,
    InMemoryExecutionLeaseEventRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryExecutionRecordRepository,
    InMemoryExecutionTreeRepository,
    InMemoryFencedEffectRepository,
    InMemoryMeshRequestRepository,
    InMemoryOutboundCallRepository,
    InMemoryPausedExecutionRepository,
    InMemoryRateLimitRepository,
    InMemoryTransaction,
)
from agboss_sql.testing.contracts import BusinessRows, StoreFactory, store_conformance

backend = InMemoryBackend()
"""One backend for every instance of a case (as instances share one database), emptied
before each case."""


async def reset() -> None:
    backend.reset()


def on_store_time(cls: type[Any]) -> StoreFactory:
    """Stores that decide by the store's time (leases, fenced effects, outbound calls)."""
    return StoreFactory(lambda seam: cls(backend, seam.store_clock, seam.application), reset=reset)


def on_own_clock(cls: type[Any]) -> StoreFactory:
    """Stores on the application's own clock (possibly skewed)."""
    return StoreFactory(lambda seam: cls(backend, seam.clock, seam.application), reset=reset)


async def insert(tx: InMemoryTransaction, row: str) -> None:
    tx.insert(row)


async def committed() -> list[str]:
    return [str(row) for row in backend.business_rows]


STORES: dict[str, Any] = {
    "execution_lease": on_store_time(InMemoryExecutionLeaseRepository),
    "execution_lease_event": on_own_clock(InMemoryExecutionLeaseEventRepository),
    "fenced_effect": on_store_time(InMemoryFencedEffectRepository),
    "outbound_call": on_store_time(InMemoryOutboundCallRepository),
    "child_queue": on_own_clock(InMemoryChildExecutionQueueRepository),
    "rate_limit": on_store_time(InMemoryRateLimitRepository),
    "execution_record": on_own_clock(InMemoryExecutionRecordRepository),
    "execution_tree": on_own_clock(InMemoryExecutionTreeRepository),
    "mesh_request": on_own_clock(InMemoryMeshRequestRepository),
    "paused_execution": on_own_clock(InMemoryPausedExecutionRepository),
    "cost_ledger": on_own_clock(InMemoryCostLedgerRepository),
    "execution_history": on_own_clock(InMemoryExecutionHistoryRepository),
}

TestInMemory = store_conformance(
    name="in-memory",
    stores=STORES,
    business_rows=BusinessRows(insert=insert, committed=committed),
    # The explorer runs this set's worlds once, in tests/explorer/test_explorer_memory.py
    # (the same depth and walks as the default, plus what each world must reach).
    interleavings=False,
)
