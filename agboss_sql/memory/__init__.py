"""`InMemory*` reference stores (backend `"in-memory"`): the behaviour the SQL stores match.

Every instance of one in-process cluster builds its stores on one shared
`InMemoryBackend`, as instances share one database:

    backend = InMemoryBackend()
    leases = InMemoryExecutionLeaseRepository(backend, StoreClock(), ApplicationContext("a"))
"""

from __future__ import annotations

from agboss_sql.contracts.stores import Store
from agboss_sql.memory.backend import InMemoryBackend, InMemoryTransaction
from agboss_sql.memory.fenced import InMemoryFencedEffectRepository, InMemoryOutboundCallRepository
from agboss_sql.memory.leases import (
    InMemoryExecutionLeaseEventRepository,
    InMemoryExecutionLeaseRepository,
)
from agboss_sql.memory.limits import InMemoryCostLedgerRepository, InMemoryRateLimitRepository
from agboss_sql.memory.pauses import InMemoryPausedExecutionRepository
from agboss_sql.memory.queue import InMemoryChildExecutionQueueRepository
from agboss_sql.memory.records import (
    InMemoryExecutionHistoryRepository,
    InMemoryExecutionRecordRepository,
    InMemoryExecutionTreeRepository,
    InMemoryMeshRequestRepository,
)


def memory_stores() -> list[type[Store]]:
    """Every `InMemory*` store class, one per contract, in the order of `CONTRACTS`."""
    return [
        InMemoryExecutionLeaseRepository,
        InMemoryExecutionLeaseEventRepository,
        InMemoryFencedEffectRepository,
        InMemoryOutboundCallRepository,
        InMemoryChildExecutionQueueRepository,
        InMemoryRateLimitRepository,
        InMemoryExecutionRecordRepository,
        InMemoryExecutionTreeRepository,
        InMemoryMeshRequestRepository,
        InMemoryPausedExecutionRepository,
        InMemoryCostLedgerRepository,
        InMemoryExecutionHistoryRepository,
    ]


__all__ = [
    "InMemoryBackend",
    "InMemoryChildExecutionQueueRepository",
    "InMemoryCostLedgerRepository",
    "InMemoryExecutionHistoryRepository",
    "InMemoryExecutionLeaseEventRepository",
    "InMemoryExecutionLeaseRepository",
    "InMemoryExecutionRecordRepository",
    "InMemoryExecutionTreeRepository",
    "InMemoryFencedEffectRepository",
    "InMemoryMeshRequestRepository",
    "InMemoryOutboundCallRepository",
    "InMemoryPausedExecutionRepository",
    "InMemoryRateLimitRepository",
    "InMemoryTransaction",
    "memory_stores",
]
