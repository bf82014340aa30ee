"""The rules every store applies, written once: argument checks, the dependencies a store's
constructor takes, and the fence's decision and refusal vocabulary. The number and payload
rules (`_number_rules`) and the checks of the values stores save (`_value_rules`) are in
their own modules; every one of them is named from here.

Memory and SQL stores call these before anything is read or written; a rule that lives
here is never restated in a store. The key's text rules (identifiers, effect names,
business keys, steps, fingerprints) live beside the key helpers in `contracts.keys`.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from typing import Literal, NamedTuple, Protocol, TypeVar, overload

from agboss_sql.contracts._number_rules import (
    checked_count,
    checked_int,
    checked_positive_ms,
    checked_time,
    checked_token,
)
from agboss_sql.contracts._number_rules import (
    checked_int32 as checked_int32,
)

# The number, payload and value rules live in their own modules and are named from here;
# the limits they keep are in `contracts.limits`.
from agboss_sql.contracts._number_rules import (
    checked_payloads_together as checked_payloads_together,
)
from agboss_sql.contracts._number_rules import (
    payload_text as payload_text,
)
from agboss_sql.contracts._value_rules import (
    NO_TENANT as NO_TENANT,
)
from agboss_sql.contracts._value_rules import (
    checked_budget_key as checked_budget_key,
)
from agboss_sql.contracts._value_rules import (
    checked_child_finishes,
    checked_choice,
    checked_cost_entry,
    checked_key_prefix,
    checked_lease,
    checked_lease_event,
    checked_mesh_request,
    checked_optional_identifier,
    checked_pause,
    checked_queued_child,
    checked_queued_children,
    checked_record,
    checked_snapshot,
)
from agboss_sql.contracts.clocks import Clock, StoreClock
from agboss_sql.contracts.errors import ExecutionFencedError, InvalidIdentifierError
from agboss_sql.contracts.keys import (
    checked_business_key,
    checked_effect_name,
    checked_fingerprint,
    checked_identifier,
    checked_step,
    scope_key_of,
)
from agboss_sql.contracts.limits import MAX_DURATION_MS as MAX_DURATION_MS
from agboss_sql.contracts.limits import MAX_INT32 as MAX_INT32
from agboss_sql.contracts.limits import MAX_INT64 as MAX_INT64
from agboss_sql.contracts.limits import MAX_OWNER_LENGTH, checked_text
from agboss_sql.contracts.limits import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from agboss_sql.contracts.limits import MAX_STATUS_LENGTH as MAX_STATUS_LENGTH
from agboss_sql.contracts.limits import MIN_INT32 as MIN_INT32
from agboss_sql.contracts.limits import MIN_INT64 as MIN_INT64
from agboss_sql.contracts.types import (
    ApplicationContext,
    AttemptRef,
    FencedEffectKey,
    LeaseState,
    OutboundCallStatus,
)

B = TypeVar("B")

_scope_of = lru_cache(maxsize=4096)(scope_key_of)
"""`scope_key_of`, remembered: the fenced key check runs on every fenced call."""

# --- the fence's vocabulary and decision ------------------------------------------------------


class FenceRefusal(StrEnum):
    """Why a fenced write was refused (`ExecutionFencedError.reason`)."""

    LEASE_ABSENT = "lease-absent"
    """No lease row for the key's execution."""
    SUPERSEDED = "superseded"
    """A later epoch was granted, or the lease at the token was closed after its expiry."""
    TOKEN_NOT_GRANTED = "token-not-granted"
    """The token is above the lease's epoch: it was never granted."""
    FINISHED = "finished"
    RELEASED = "released"
    YIELDED = "yielded"
    EXPIRED = "expired"
    """The lease at the token ran out by the store's time."""
    MARK_ABOVE_TOKEN = "mark-above-token"
    """The scope's high-water mark is above the token: a later holder already wrote."""


class LeaseClosedReason(StrEnum):
    """Why a lease's epoch ended (the lease row's `closed_reason`)."""

    RELEASED = "released"
    FINISHED = "finished"
    SUPERSEDED = "superseded"
    """Closed by `lease_state_of` after it expired at its token."""


def fence_refusal_of(
    token: int,
    *,
    holder: str,
    epoch: int,
    granted_to: str,
    released: bool,
    yielded: bool,
    finished: bool,
    closed_reason: str | None,
    expires_at: int,
    now: int,
    mark: int | None,
) -> FenceRefusal | None:
    """Why a write at `token` by `holder` (the instance its key names) is refused by its
    lease row (at `epoch`, granted to the instance `granted_to`) and the scope's mark, or
    `None` when the lease is held at `token` by `holder`, not released/yielded/finished,
    live at `now`, and the mark is not above `token`.

    The first reason in this order wins: superseded (a later epoch was granted),
    token-not-granted (the token is above the epoch), superseded (the epoch was granted
    to another instance: a key built by hand), finished, released (superseded when the
    lease was closed after its expiry), yielded, expired, mark-above-token. Who holds the
    token is decided before the lease's state: a writer that never held the epoch is told
    so, whatever became of the lease since."""
    if epoch > token:
        return FenceRefusal.SUPERSEDED
    if epoch < token:
        return FenceRefusal.TOKEN_NOT_GRANTED
    if granted_to != holder:
        return FenceRefusal.SUPERSEDED
    if finished:
        return FenceRefusal.FINISHED
    if released:
        if closed_reason == LeaseClosedReason.SUPERSEDED:
            return FenceRefusal.SUPERSEDED
        return FenceRefusal.RELEASED
    if yielded:
        return FenceRefusal.YIELDED
    if expires_at <= now:
        return FenceRefusal.EXPIRED
    if mark is not None and mark > token:
        return FenceRefusal.MARK_ABOVE_TOKEN
    return None


class FencedWrite(Protocol):
    """What a refusal names of a fenced write's key: its scope and its token."""

    @property
    def scope_key(self) -> str: ...
    @property
    def token(self) -> int: ...


def fenced_error(key: FencedWrite, reason: FenceRefusal) -> ExecutionFencedError:
    """The refusal of a write under `key` for `reason`."""
    return ExecutionFencedError(key.scope_key, key.token, reason)


class LeaseStateFound(NamedTuple):
    """What `lease_state_at` found: the state to answer, and whether the lease must be
    closed (released, superseded) in the same atomic step before answering."""

    state: LeaseState
    close: bool


def lease_state_at(
    token: int,
    *,
    epoch: int | None,
    released: bool,
    finished: bool,
    closed_reason: str | None,
    expires_at: int,
    now: int,
) -> LeaseStateFound:
    """The state of a lease at `token` (`OutboundCallRepository.lease_state_of`) from its
    row (`epoch` `None`: no row): ABSENT when there is no lease or `token` was never granted,
    SUPERSEDED when a later epoch was granted or the lease at `token` was closed after its
    expiry, FINISHED, RELEASED (by its holder), LIVE; a lease that expired at `token` and is
    still open answers SUPERSEDED and must be closed."""
    if epoch is None or epoch < token:
        return LeaseStateFound(LeaseState.ABSENT, False)
    if epoch > token:
        return LeaseStateFound(LeaseState.SUPERSEDED, False)
    if finished:
        return LeaseStateFound(LeaseState.FINISHED, False)
    if released:
        if closed_reason == LeaseClosedReason.SUPERSEDED:
            return LeaseStateFound(LeaseState.SUPERSEDED, False)
        return LeaseStateFound(LeaseState.RELEASED, False)
    if expires_at <= now:
        return LeaseStateFound(LeaseState.SUPERSEDED, True)
    return LeaseStateFound(LeaseState.LIVE, False)


# --- fenced keys and attempts ------------------------------------------------------------------


def checked_fenced_key(key: object) -> FencedEffectKey:
    """`key` if every part of it can be written and read back, before anything is read or
    written: its name, business key, identifiers, token, step, fingerprint, and its scope
    (the scope of its lease's tenant and execution). A write that passes these never leaves
    a row that a later read refuses as corrupt."""
    if not isinstance(key, FencedEffectKey):
        raise TypeError(f"expected a FencedEffectKey, got {type(key).__name__}")
    checked_effect_name(key.name)
    checked_business_key(key)
    checked_identifier("tenant_id", key.tenant_id)
    checked_identifier("lease_execution_id", key.lease_execution_id)
    checked_token(key.token)
    checked_step(key.step)
    checked_fingerprint(key.fingerprint)
    # Every key names its holder: the fence checks it (a hand-built key without one could
    # write with any instance's epoch).
    checked_identifier("holder_instance_id", key.holder_instance_id)
    if key.scope_key != _scope_of(key.tenant_id, key.lease_execution_id):
        # The in-memory mark is kept per scope key, the SQL one on the lease row: a scope
        # that is not its lease's would fence differently in each.
        raise InvalidIdentifierError(
            f"scope_key must be scope_key_of(tenant_id, lease_execution_id), got "
            f"{key.scope_key!r:.120}"
        )
    return key


def checked_attempt(attempt: object) -> AttemptRef:
    """`attempt` if it is an `AttemptRef` (a known status, an attempt number >= 0, an owner
    text), else `TypeError` (not an `AttemptRef`) or `InvalidValueError`/`InvalidNumberError`
    (both `ValueError`s)."""
    if not isinstance(attempt, AttemptRef):
        raise TypeError(f"expected an AttemptRef, got {type(attempt).__name__}")
    checked_choice("attempt.status", OutboundCallStatus, attempt.status)
    checked_count("attempt.attempt", attempt.attempt)
    checked_text(
        "an attempt owner", attempt.attempt_owner, "MAX_OWNER_LENGTH", MAX_OWNER_LENGTH, empty=True
    )
    return attempt


def checked_attempt_owner(owner: object) -> str:
    """`owner` if it is a non-empty text of at most `MAX_OWNER_LENGTH` characters a database
    can store, else `InvalidValueError` (a `ValueError`)."""
    return checked_text("an attempt owner", owner, "MAX_OWNER_LENGTH", MAX_OWNER_LENGTH)


# --- what a store's constructor takes ----------------------------------------------------------

ClockKind = Literal["store", "application", "unused"]
"""The clock a store runs on: a fencing store decides by the store's time (`StoreClock`);
the others by the application's (`SystemClock`, `VirtualClock`); the lease log, whose
events carry their own time and instance, accepts any clock or none ("unused")."""

LEASE_LOG_APPLICATION = ApplicationContext("lease-log")
"""The application of a lease log built without one: its events name their instances."""


def checked_application(application: object) -> ApplicationContext:
    """`application` if it is an `ApplicationContext` with a valid instance id, else
    `TypeError` (or `InvalidIdentifierError` for the id)."""
    if not isinstance(application, ApplicationContext):
        raise TypeError(f"expected an ApplicationContext, got {type(application).__name__}")
    checked_identifier("application.instance_id", application.instance_id)
    return application


@overload
def checked_dependencies(
    store: object,
    connection: object,
    connection_type: type[B],
    clock: object,
    application: object,
    *,
    clock_kind: Literal["store"],
) -> tuple[B, StoreClock, ApplicationContext]: ...


@overload
def checked_dependencies(
    store: object,
    connection: object,
    connection_type: type[B],
    clock: object,
    application: object,
    *,
    clock_kind: Literal["application"],
) -> tuple[B, Clock, ApplicationContext]: ...


@overload
def checked_dependencies(
    store: object,
    connection: object,
    connection_type: type[B],
    clock: object,
    application: object,
    *,
    clock_kind: Literal["unused"],
) -> tuple[B, StoreClock | Clock | None, ApplicationContext]: ...


def checked_dependencies(
    store: object,
    connection: object,
    connection_type: type[B],
    clock: object,
    application: object,
    *,
    clock_kind: ClockKind,
) -> tuple[B, StoreClock | Clock | None, ApplicationContext]:
    """The constructor arguments of `store`, checked alike in every store before anything is
    built: `connection` an instance of `connection_type` (`SqlConnection`, `InMemoryBackend`),
    `clock` of `clock_kind`, `application` an `ApplicationContext` (for "unused", `None`
    stands for `LEASE_LOG_APPLICATION`). A wrong one is a `TypeError` naming the store, the
    argument and what it must be."""
    owner = type(store).__name__
    if not isinstance(connection, connection_type):
        raise TypeError(
            f"{owner} runs on a {connection_type.__name__}, got {type(connection).__name__}"
        )
    checked: StoreClock | Clock | None
    if clock_kind == "store":
        if not isinstance(clock, StoreClock):
            raise TypeError(
                f"{owner} decides by the store's time: pass a StoreClock (StoreClock() for "
                f"database time, StoreClock(clock) in tests), got {type(clock).__name__}"
            )
        checked = clock
    elif clock_kind == "application":
        if isinstance(clock, StoreClock) or not isinstance(clock, Clock):
            raise TypeError(
                f"{owner} runs on the application's Clock (SystemClock, VirtualClock), "
                f"got {type(clock).__name__}"
            )
        checked = clock
    else:
        if clock is not None and not isinstance(clock, (StoreClock, Clock)):
            raise TypeError(
                f"{owner} takes a StoreClock, a Clock or None, got {type(clock).__name__}"
            )
        checked = clock
    if application is None and clock_kind == "unused":
        application = LEASE_LOG_APPLICATION
    try:
        return connection, checked, checked_application(application)
    except TypeError as exc:
        raise TypeError(f"{owner}: {exc}") from None


__all__ = [
    "LEASE_LOG_APPLICATION",
    "MAX_STATUS_LENGTH",
    "ClockKind",
    "FenceRefusal",
    "LeaseClosedReason",
    "LeaseStateFound",
    "checked_application",
    "checked_attempt",
    "checked_attempt_owner",
    "checked_choice",
    "checked_cost_entry",
    "checked_count",
    "checked_dependencies",
    "checked_fenced_key",
    "checked_int",
    "checked_key_prefix",
    "checked_lease",
    "checked_lease_event",
    "checked_mesh_request",
    "checked_optional_identifier",
    "checked_pause",
    "checked_positive_ms",
    "checked_child_finishes",
    "checked_queued_child",
    "checked_queued_children",
    "checked_record",
    "checked_snapshot",
    "checked_time",
    "checked_token",
    "fence_refusal_of",
    "fenced_error",
    "lease_state_at",
]
