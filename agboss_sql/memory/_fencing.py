"""What the in-memory stores share: the store's time, argument checks and the lease fence."""

from __future__ import annotations

from agboss_sql.contracts.clocks import Clock, StoreClock, SystemClock
from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.keys import (
    checked_business_key,
    checked_effect_name,
    checked_identifier,
)
from agboss_sql.contracts.types import ApplicationContext, FencedEffectKey
from agboss_sql.memory.backend import InMemoryBackend, LeaseRow

_SYSTEM_CLOCK = SystemClock()

SUPERSEDED = "superseded"
"""The `closed_reason` of a lease `lease_state_of` closed after it expired at its token."""


def store_now(clock: StoreClock) -> int:
    """The store's time, read once per atomic step.

    In memory the "database" is this process, so database time is this host's clock.
    """
    if clock.is_database_time:
        return _SYSTEM_CLOCK.now()
    return clock.now()


def checked_store_clock(clock: object) -> StoreClock:
    if not isinstance(clock, StoreClock):
        raise TypeError(
            f"this store decides by the store's time: pass a StoreClock (StoreClock() for "
            f"database time, StoreClock(clock) in tests), got {type(clock).__name__}"
        )
    return clock


def checked_clock(clock: object) -> Clock:
    if isinstance(clock, StoreClock) or not isinstance(clock, Clock):
        raise TypeError(
            f"this store runs on the application's Clock (SystemClock, VirtualClock), "
            f"got {type(clock).__name__}"
        )
    return clock


def checked_application(application: object) -> ApplicationContext:
    if not isinstance(application, ApplicationContext):
        raise TypeError(f"expected an ApplicationContext, got {type(application).__name__}")
    checked_identifier("application.instance_id", application.instance_id)
    return application


def checked_positive(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive number of ms, got {value!r}")
    return value


def checked_count(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value!r}")
    return value


def checked_int(what: str, value: object, *, minimum: int | None = None) -> int:
    """`value` if it is an int (not a bool) of at least `minimum`, else `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an int, got {value!r:.80}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value!r}")
    return value


def checked_token(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"a lease token is an int, got {value!r}")
    return value


def checked_key(key: FencedEffectKey) -> FencedEffectKey:
    """The key's rules, before anything is read or written."""
    checked_effect_name(key.name)
    checked_business_key(key)
    checked_identifier("tenant_id", key.tenant_id)
    checked_identifier("lease_execution_id", key.lease_execution_id)
    checked_token(key.token)
    return key


def fence_refusal(lease: LeaseRow | None, token: int, now: int) -> str | None:
    """Why a write at `token` is refused by the lease row, or `None` when it is held there."""
    if lease is None:
        return "lease-absent"
    if lease.lease_epoch > token:
        return SUPERSEDED
    if lease.lease_epoch < token:
        return "token-not-granted"
    if lease.finished:
        return "finished"
    if lease.released:
        return SUPERSEDED if lease.closed_reason == SUPERSEDED else "released"
    if lease.yielded:
        return "yielded"
    if lease.expires_at <= now:
        return "expired"
    return None


def fence(backend: InMemoryBackend, key: FencedEffectKey, now: int) -> bool:
    """The lease and mark check of a fenced write; call it under `backend.atomic()`.

    Raises `ExecutionFencedError` unless the key's lease is held at its token, not
    released/yielded/finished and live at `now`, and the scope's mark is not above the
    token. True when the mark must be raised to the token (the caller applies that with
    the rest of its step, so a rollback drops it too).
    """
    lease = backend.leases.get((key.tenant_id, key.lease_execution_id))
    reason = fence_refusal(lease, key.token, now)
    if reason is not None:
        raise ExecutionFencedError(key.scope_key, key.token, reason)
    mark = backend.fence_marks.get(key.scope_key)
    if mark is not None and mark > key.token:
        raise ExecutionFencedError(key.scope_key, key.token, "mark-above-token")
    return mark is None or mark < key.token


def raise_mark(backend: InMemoryBackend, key: FencedEffectKey) -> None:
    current = backend.fence_marks.get(key.scope_key)
    if current is None or current < key.token:
        backend.fence_marks[key.scope_key] = key.token


class ApplicationClockStore:
    """What the in-memory stores on the application's clock share: their backend, clock,
    application and readiness (they are always ready). List it before the contract."""

    backend: str | None = "in-memory"

    def __init__(
        self, backend: InMemoryBackend, clock: Clock, application: ApplicationContext
    ) -> None:
        self.memory = backend
        self.clock = checked_clock(clock)
        self.application = checked_application(application)

    async def ping(self) -> None:
        return None
