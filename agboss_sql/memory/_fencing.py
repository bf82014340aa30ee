"""What the in-memory stores share: the store's time, the lease fence and their constructors.
The rules themselves live in `contracts.rules`."""

from __future__ import annotations

from agboss_sql.contracts.clocks import Clock, StoreClock, SystemClock
from agboss_sql.contracts.rules import (
    FenceRefusal,
    checked_dependencies,
    fence_refusal_of,
    fenced_error,
)
from agboss_sql.contracts.types import ApplicationContext, FencedEffectKey
from agboss_sql.memory.backend import InMemoryBackend

_SYSTEM_CLOCK = SystemClock()


def store_now(clock: StoreClock) -> int:
    """The store's time, read once per atomic step.

    In memory the "database" is this process, so database time is this host's clock.
    """
    if clock.is_database_time:
        return _SYSTEM_CLOCK.now()
    return clock.now()


def fence(backend: InMemoryBackend, key: FencedEffectKey, now: int) -> bool:
    """The lease and mark check of a fenced write; call it under `backend.atomic()`.

    Raises `ExecutionFencedError` unless the key's lease is held at its token by the
    instance the key names, not released/yielded/finished and live at `now`, and the
    scope's mark is not above the token (the reason is `fence_refusal_of`'s, as on SQL).
    True when the mark must be raised to the token (the caller applies that with the rest
    of its step, so a rollback drops it too).
    """
    lease = backend.leases.get((key.tenant_id, key.lease_execution_id))
    if lease is None:
        raise fenced_error(key, FenceRefusal.LEASE_ABSENT)
    mark = backend.fence_marks.get(key.scope_key)
    reason = fence_refusal_of(
        key.token,
        holder=key.holder_instance_id,
        epoch=lease.lease_epoch,
        granted_to=lease.holder_instance_id,
        released=lease.released,
        yielded=lease.yielded,
        finished=lease.finished,
        closed_reason=lease.closed_reason,
        expires_at=lease.expires_at,
        now=now,
        mark=mark,
    )
    if reason is not None:
        raise fenced_error(key, reason)
    return mark is None or mark < key.token


def raise_mark(backend: InMemoryBackend, key: FencedEffectKey) -> None:
    current = backend.fence_marks.get(key.scope_key)
    if current is None or current < key.token:
        backend.fence_marks[key.scope_key] = key.token


class InMemoryStore:
    """What every in-memory store shares: its backend text and readiness (always ready)."""

    backend: str | None = "in-memory"

    async def ping(self) -> None:
        return None


class ApplicationClockStore(InMemoryStore):
    """The in-memory stores on the application's clock: their backend, clock and application,
    checked. List it before the contract."""

    def __init__(
        self, backend: InMemoryBackend, clock: Clock, application: ApplicationContext
    ) -> None:
        self.memory, self.clock, self.application = checked_dependencies(
            self, backend, InMemoryBackend, clock, application, clock_kind="application"
        )


class StoreClockStore(InMemoryStore):
    """The in-memory lease and fencing stores: their backend, the store's clock and the
    application, checked. List it before the contract."""

    def __init__(
        self, backend: InMemoryBackend, clock: StoreClock, application: ApplicationContext
    ) -> None:
        self.memory, self.store_clock, self.application = checked_dependencies(
            self, backend, InMemoryBackend, clock, application, clock_kind="store"
        )
