"""Helpers of the in-memory store tests: a small in-process cluster on one backend and clock."""

from __future__ import annotations

from typing import Any, TypeVar

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    StepRef,
    StoreClock,
    VirtualClock,
    fenced_effect_key_of,
)
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryChildExecutionQueueRepository,
    InMemoryCostLedgerRepository,
    InMemoryExecutionHistoryRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryExecutionRecordRepository,
    InMemoryExecutionTreeRepository,
    InMemoryFencedEffectRepository,
    InMemoryMeshRequestRepository,
    InMemoryOutboundCallRepository,
    InMemoryPausedExecutionRepository,
    InMemoryRateLimitRepository,
)

START = 1_000_000
LEASE_MS = 30_000
TENANT = "tenant-1"

S = TypeVar("S")

_STORE_CLOCKED = (
    InMemoryRateLimitRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryOutboundCallRepository,
)


class Cluster:
    """Stores of several instances on one backend; the store's time is `clock`."""

    def __init__(self) -> None:
        self.backend = InMemoryBackend()
        self.clock = VirtualClock(START)
        self.store_clock = StoreClock(self.clock)

    def application(self, instance: int) -> ApplicationContext:
        return ApplicationContext(instance_id=f"instance-{instance}")

    def store(self, cls: type[S], instance: int = 1) -> S:
        clock: Any = self.store_clock if issubclass(cls, _STORE_CLOCKED) else self.clock
        return cls(self.backend, clock, self.application(instance))  # type: ignore[call-arg]

    def leases(self, instance: int = 1) -> InMemoryExecutionLeaseRepository:
        return self.store(InMemoryExecutionLeaseRepository, instance)

    def effects(self, instance: int = 1) -> InMemoryFencedEffectRepository:
        return self.store(InMemoryFencedEffectRepository, instance)

    def calls(self, instance: int = 1) -> InMemoryOutboundCallRepository:
        return self.store(InMemoryOutboundCallRepository, instance)

    def queue(self, instance: int = 1) -> InMemoryChildExecutionQueueRepository:
        return self.store(InMemoryChildExecutionQueueRepository, instance)

    def limits(self, instance: int = 1) -> InMemoryRateLimitRepository:
        return self.store(InMemoryRateLimitRepository, instance)

    def records(self, instance: int = 1) -> InMemoryExecutionRecordRepository:
        return self.store(InMemoryExecutionRecordRepository, instance)

    def trees(self, instance: int = 1) -> InMemoryExecutionTreeRepository:
        return self.store(InMemoryExecutionTreeRepository, instance)

    def mesh(self, instance: int = 1) -> InMemoryMeshRequestRepository:
        return self.store(InMemoryMeshRequestRepository, instance)

    def pauses(self, instance: int = 1) -> InMemoryPausedExecutionRepository:
        return self.store(InMemoryPausedExecutionRepository, instance)

    def costs(self, instance: int = 1) -> InMemoryCostLedgerRepository:
        return self.store(InMemoryCostLedgerRepository, instance)

    def history(self, instance: int = 1) -> InMemoryExecutionHistoryRepository:
        return self.store(InMemoryExecutionHistoryRepository, instance)


def context_of(lease: ExecutionLease, step_key: str = "step-1") -> ExecutionContext:
    return ExecutionContext(
        tenant_id=lease.tenant_id,
        root_execution_id=lease.execution_id,
        execution_id=lease.execution_id,
        lease=lease,
        step=StepRef(lease.execution_id, step_key, "charge-step"),
    )


def key_of(
    lease: ExecutionLease,
    name: str = "charge",
    *,
    step_key: str = "step-1",
    business_key: str | None = None,
    fingerprint: str | None = None,
) -> FencedEffectKey:
    return fenced_effect_key_of(
        context_of(lease, step_key), name, business_key=business_key, fingerprint=fingerprint
    )
