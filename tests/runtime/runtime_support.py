"""Helpers of the runtime tests: instances' stores on one in-memory backend and clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionLease,
    ExecutionRecord,
    ExecutionRecordStatus,
    StoreClock,
    VirtualClock,
)
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryChildExecutionQueueRepository,
    InMemoryExecutionLeaseEventRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryExecutionRecordRepository,
    InMemoryExecutionTreeRepository,
    InMemoryPausedExecutionRepository,
)

START = 1_000_000
LEASE_MS = 30_000
TENANT = "tenant-1"


async def settle(rounds: int = 50) -> None:
    """Let every ready task run until it waits on something (the clock, a future)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class RecordingLeases(InMemoryExecutionLeaseRepository):
    """The in-memory lease store, noting the application clock's time of each renewal."""

    def __init__(
        self,
        backend: InMemoryBackend,
        store_clock: StoreClock,
        application: ApplicationContext,
        clock: VirtualClock,
    ) -> None:
        super().__init__(backend, store_clock, application)
        self.app_clock = clock
        self.renewals: list[int] = []

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        self.renewals.append(self.app_clock.monotonic())
        return await super().renew(lease, lease_ms)


class HangingRenewLeases(RecordingLeases):
    """Renewals are sent and never answered; a take is answered `acquire_delay_ms` after it
    was sent (the store decides at the answer's time)."""

    def __init__(self, *args: object, acquire_delay_ms: int = 0) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.acquire_delay_ms = acquire_delay_ms
        self.cancelled_renewals = 0

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        if self.acquire_delay_ms:
            await self.app_clock.sleep(self.acquire_delay_ms)
        return await super().acquire(tenant_id, execution_id, lease_ms)

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        self.renewals.append(self.app_clock.monotonic())
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.cancelled_renewals += 1
            raise
        raise AssertionError("unreachable")


class SlowRenewLeases(RecordingLeases):
    """Each renewal is decided by the store at once and answered `delay_ms` of application
    time later (a slow network on the way back)."""

    def __init__(self, *args: object, delay_ms: int) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.delay_ms = delay_ms

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        self.renewals.append(self.app_clock.monotonic())
        remaining = await InMemoryExecutionLeaseRepository.renew(self, lease, lease_ms)
        await self.app_clock.sleep(self.delay_ms)
        return remaining


class FailingRenewLeases(RecordingLeases):
    """Every renewal raises (the database went away)."""

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        self.renewals.append(self.app_clock.monotonic())
        raise ConnectionError("database unreachable")


@dataclass
class Instance:
    """One application instance's stores."""

    name: str
    leases: RecordingLeases
    events: InMemoryExecutionLeaseEventRepository
    records: InMemoryExecutionRecordRepository
    tree: InMemoryExecutionTreeRepository
    pauses: InMemoryPausedExecutionRepository
    queue: InMemoryChildExecutionQueueRepository


@dataclass
class World:
    """Instances on one backend. `clock` is the applications' clock; `store_time` decides
    leases (the same clock unless a test moves the store's time on its own)."""

    backend: InMemoryBackend = field(default_factory=InMemoryBackend)
    clock: VirtualClock = field(default_factory=lambda: VirtualClock(START))
    store_time: VirtualClock | None = None

    def instance(
        self, name: str, leases: type[RecordingLeases] = RecordingLeases, **kw: object
    ) -> Instance:
        app = ApplicationContext(instance_id=name)
        store_clock = StoreClock(self.store_time or self.clock)
        return Instance(
            name=name,
            leases=leases(self.backend, store_clock, app, self.clock, **kw),  # type: ignore[arg-type]
            events=InMemoryExecutionLeaseEventRepository(self.backend, self.clock, app),
            records=InMemoryExecutionRecordRepository(self.backend, self.clock, app),
            tree=InMemoryExecutionTreeRepository(self.backend, self.clock, app),
            pauses=InMemoryPausedExecutionRepository(self.backend, self.clock, app),
            queue=InMemoryChildExecutionQueueRepository(self.backend, self.clock, app),
        )


def running_record(
    execution_id: str, *, root: str | None = None, at: int = START
) -> ExecutionRecord:
    """A running record of a root (or, with `root`, of a child of that root)."""
    return ExecutionRecord(
        tenant_id=TENANT,
        execution_id=execution_id,
        root_execution_id=root or execution_id,
        parent_execution_id=root,
        thread_id=None,
        workflow="flow",
        owner=None,
        status=ExecutionRecordStatus.RUNNING,
        created_at=at,
        updated_at=at,
    )
