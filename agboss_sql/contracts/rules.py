"""The rules every store applies, written once: argument checks, the dependencies a store's
constructor takes, and the fence's decision and refusal vocabulary.

Memory and SQL stores call these before anything is read or written; a rule that lives
here is never restated in a store. The key's text rules (identifiers, effect names,
business keys, steps, fingerprints) live beside the key helpers in `contracts.keys`.
"""

from __future__ import annotations

import json
from enum import StrEnum
from functools import lru_cache
from typing import Literal, NamedTuple, Protocol, TypeVar, overload

from agboss_sql.contracts.clocks import Clock, StoreClock
from agboss_sql.contracts.errors import (
    ExecutionFencedError,
    InvalidFingerprintError,
    InvalidIdentifierError,
    InvalidNumberError,
    InvalidPayloadError,
)
from agboss_sql.contracts.keys import (
    FINGERPRINT_RULE,
    checked_business_key,
    checked_effect_name,
    checked_fingerprint,
    checked_identifier,
    checked_step,
    scope_key_of,
)
from agboss_sql.contracts.types import (
    ApplicationContext,
    AttemptRef,
    BudgetScope,
    CostEntry,
    ExecutionLease,
    ExecutionLeaseEvent,
    ExecutionRecord,
    ExecutionRecordStatus,
    ExecutionSnapshot,
    FencedEffectKey,
    LeaseEventKind,
    LeaseHolder,
    LeaseState,
    OutboundCallStatus,
    PausedExecution,
    PauseStatus,
    QueuedChild,
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


# --- numbers ---------------------------------------------------------------------------------
#
# The limits below are decided once, here, and every store (in memory and on SQL) checks them
# before any statement runs, so a value out of range gets one typed error on every backend
# (`InvalidNumberError`, a `ValueError`) and nothing is written. Without them SQLite stores
# what the servers refuse (an int beyond 64 bits as a float, a depth beyond 32 bits).

MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
"""Whole numbers stored in BIGINT columns (times, epochs, tokens, amounts, counts)."""

MAX_INT32 = 2**31 - 1
MIN_INT32 = -(2**31)
"""Whole numbers stored in INTEGER columns: a child's depth and attempt."""

MAX_DURATION_MS = 10 * 365 * 24 * 3600 * 1000
"""The longest duration a store takes (a lease, a slot's ttl, a window, a wake claim): ten
years. A store adds it to its time, and the sum must stay a BIGINT on every backend."""


def _range_error(what: str, value: int, low: int, high: int) -> InvalidNumberError:
    return InvalidNumberError(f"{what} must be between {low} and {high}, got {value}")


def checked_int(
    what: str,
    value: object,
    *,
    minimum: int | None = None,
    low: int = MIN_INT64,
    high: int = MAX_INT64,
) -> int:
    """`value` if it is an int (not a bool) of at least `minimum` within `[low, high]` (a
    signed 64-bit number unless told), else `ValueError` (`InvalidNumberError` when it is
    out of range)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an int, got {value!r:.80}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")
    if not low <= value <= high:
        raise _range_error(what, value, low, high)
    return value


def checked_int32(what: str, value: object, *, minimum: int | None = None) -> int:
    """`checked_int` within a signed 32-bit number (a depth, an attempt)."""
    return checked_int(what, value, minimum=minimum, low=MIN_INT32, high=MAX_INT32)


def checked_count(what: str, value: object) -> int:
    """`value` if it is an int >= 0 (a count, a limit, an amount) of at most `MAX_INT64`,
    else `ValueError`."""
    return checked_int(what, value, minimum=0)


def checked_positive_ms(what: str, value: object) -> int:
    """`value` if it is a positive whole number of ms, at most `MAX_DURATION_MS`, else
    `ValueError`: a zero or negative duration (a lease, a slot, a window) would be granted
    already over; a longer one would overflow the store's time on some backend."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive number of ms, got {value!r:.80}")
    if value > MAX_DURATION_MS:
        raise _range_error(what, value, 1, MAX_DURATION_MS)
    return value


def checked_time(what: str, value: object) -> int:
    """`value` if it is a time in ms since the epoch (an int that fits 64 bits), else
    `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is a time in ms (an int), got {value!r:.80}")
    if not MIN_INT64 <= value <= MAX_INT64:
        raise _range_error(what, value, MIN_INT64, MAX_INT64)
    return value


def checked_token(value: object) -> int:
    """`value` if it is a lease token (an epoch: an int that fits 64 bits), else
    `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"a lease token is an int, got {value!r:.80}")
    if not MIN_INT64 <= value <= MAX_INT64:
        raise _range_error("a lease token", value, MIN_INT64, MAX_INT64)
    return value


# --- payloads --------------------------------------------------------------------------------

MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
"""The largest payload (its JSON text, UTF-8) a store takes: 8 MiB. MariaDB and MySQL send a
statement in one packet of at most `max_allowed_packet` (16 MiB by default on MariaDB 10.11
and 64 MiB on MySQL 8): 8 MiB leaves room for the statement and the rest of the row.
Checkpoint blobs are binary and kept apart."""


def payload_text(what: str, value: object) -> str:
    """The JSON text a store writes for payload `value`, or `InvalidPayloadError` (before
    any statement): no NaN or infinity, nothing JSON has no form for, no cycle or nesting
    deeper than the encoder goes, no lone surrogate, at most `MAX_PAYLOAD_BYTES`."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayloadError(
            f"{what} is not JSON every backend stores: {type(exc).__name__}: {exc}"
        ) from None
    if not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidPayloadError(f"{what} holds a lone surrogate: no UTF-8 form") from None
    else:
        size = len(text)
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidPayloadError(
            f"{what} is {size} bytes of JSON, over the {MAX_PAYLOAD_BYTES} bytes a store takes"
        )
    return text


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
    text), else `TypeError`/`ValueError`."""
    if not isinstance(attempt, AttemptRef):
        raise TypeError(f"expected an AttemptRef, got {type(attempt).__name__}")
    OutboundCallStatus(attempt.status)
    checked_count("attempt.attempt", attempt.attempt)
    if not isinstance(attempt.attempt_owner, str):
        raise ValueError(f"an attempt owner is a text, got {attempt.attempt_owner!r:.80}")
    return attempt


def checked_attempt_owner(owner: object) -> str:
    """`owner` if it is a non-empty text a database can store, else `ValueError`."""
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"an attempt owner is a non-empty text, got {owner!r:.80}")
    if "\x00" in owner:
        raise ValueError(f"an attempt owner must not hold a NUL character, got {owner!r:.80}")
    return owner


# --- the values stores save -------------------------------------------------------------------


def checked_optional_identifier(what: str, value: object) -> str | None:
    """`value` if it is `None` or an identifier (`checked_identifier`)."""
    return None if value is None else checked_identifier(what, value)


V = TypeVar("V")


def _checked_fields(
    value: object,
    kind: type[V],
    *,
    identifiers: tuple[str, ...] = (),
    optional_identifiers: tuple[str, ...] = (),
    ints: tuple[str, ...] = (),
    times: tuple[str, ...] = (),
    optional_times: tuple[str, ...] = (),
) -> V:
    """`value` if it is a `kind` whose named fields keep their rules, field by field."""
    if not isinstance(value, kind):
        raise TypeError(f"expected a {kind.__name__}, got {type(value).__name__}")
    for name in identifiers:
        checked_identifier(name, getattr(value, name))
    for name in optional_identifiers:
        checked_optional_identifier(name, getattr(value, name))
    for name in ints:
        checked_int(name, getattr(value, name))
    for name in times:
        checked_time(name, getattr(value, name))
    for name in optional_times:
        if getattr(value, name) is not None:
            checked_time(name, getattr(value, name))
    return value


def checked_lease(lease: object) -> ExecutionLease:
    """`lease` if it is an `ExecutionLease` of an identified execution at an int epoch (what
    a holder passes back to renew, release, yield, reclaim or finish it)."""
    # Field by field, as `_checked_fields` would: this one is on every lease move's path.
    if not isinstance(lease, ExecutionLease):
        raise TypeError(f"expected a ExecutionLease, got {type(lease).__name__}")
    checked_identifier("tenant_id", lease.tenant_id)
    checked_identifier("execution_id", lease.execution_id)
    checked_int("lease_epoch", lease.lease_epoch)
    return lease


def checked_lease_event(event: object) -> ExecutionLeaseEvent:
    """`event` if the lease log can give every field of it back exactly: identifiers, int
    epochs and time, a known kind, a `LeaseHolder` or `None`, a text reason or `None`."""
    checked = _checked_fields(
        event,
        ExecutionLeaseEvent,
        identifiers=("tenant_id", "execution_id", "instance_id"),
        ints=("lease_epoch",),
        times=("at",),
    )
    LeaseEventKind(checked.kind)
    if checked.reason is not None and not isinstance(checked.reason, str):
        raise TypeError(f"reason is a text or None, got {checked.reason!r:.80}")
    holder = checked.taken_over_from
    if holder is not None:
        if not isinstance(holder, LeaseHolder):
            raise TypeError(f"taken_over_from is a LeaseHolder or None, got {holder!r:.80}")
        checked_identifier("taken_over_from.instance_id", holder.instance_id)
        checked_int("taken_over_from.lease_epoch", holder.lease_epoch)
    return checked


def checked_queued_child(child: object) -> QueuedChild:
    """`child` if its ids are identifiers and its depth an int that fits the depth column
    (a signed 32-bit number)."""
    checked = _checked_fields(
        child,
        QueuedChild,
        identifiers=("tenant_id", "root_execution_id", "parent_execution_id", "child_execution_id"),
        ints=("depth",),
    )
    checked_int32("depth", checked.depth)
    return checked


def checked_record(record: object) -> ExecutionRecord:
    """`record` if its ids are identifiers (the optional ones `None` or identifiers), its
    status known and its times ints."""
    checked = _checked_fields(
        record,
        ExecutionRecord,
        identifiers=("tenant_id", "execution_id", "root_execution_id", "workflow"),
        optional_identifiers=("parent_execution_id", "thread_id", "owner"),
        times=("created_at", "updated_at"),
    )
    ExecutionRecordStatus(checked.status)
    return checked


def checked_pause(pause: object) -> PausedExecution:
    """`pause` if its ids are identifiers (`thread_id` `None` or one), its status known and
    its times ints (`resolved_at` `None` or an int)."""
    checked = _checked_fields(
        pause,
        PausedExecution,
        identifiers=("tenant_id", "pause_id", "execution_id", "root_execution_id"),
        optional_identifiers=("thread_id",),
        times=("created_at",),
        optional_times=("resolved_at",),
    )
    PauseStatus(checked.status)
    return checked


def checked_cost_entry(entry: object) -> CostEntry:
    """`entry` if its ids are identifiers and its amounts and time ints."""
    return _checked_fields(
        entry,
        CostEntry,
        identifiers=("entry_id", "tenant_id", "execution_id", "application"),
        ints=("tokens_in", "tokens_out", "cost_micros"),
        times=("at",),
    )


NO_TENANT = ""
"""The tenant part of a budget key given without a tenant (kept as the empty text, which
no tenant id is)."""


def checked_budget_key(scope: object, key: object, tenant_id: object) -> tuple[str, str]:
    """`(scope value, tenant part)` of a budget's `(scope, key, tenant_id)`: the scope a
    `BudgetScope`, the key an identifier, the tenant an identifier or `None` (`NO_TENANT`).
    The EXECUTION scope needs its tenant, since an execution id is unique within its tenant
    only: `InvalidIdentifierError` without it, before anything is read or written."""
    chosen = BudgetScope(scope)  # type: ignore[arg-type]  # a wrong scope is its ValueError
    checked_identifier("key", key)
    if tenant_id is None:
        if chosen is BudgetScope.EXECUTION:
            raise InvalidIdentifierError(
                "the EXECUTION budget scope needs tenant_id: an execution id is unique within "
                "its tenant only"
            )
        return chosen.value, NO_TENANT
    return chosen.value, checked_identifier("tenant_id", tenant_id)


MAX_STATUS_LENGTH = 32
"""The longest status text a history snapshot keeps."""


def checked_snapshot(snapshot: object) -> ExecutionSnapshot:
    """`snapshot` if its ids are identifiers, its status a text of 1-32 characters and its
    times ints."""
    checked = _checked_fields(
        snapshot,
        ExecutionSnapshot,
        identifiers=("tenant_id", "execution_id", "workflow"),
        times=("started_at", "finished_at"),
    )
    status = checked.status
    if not isinstance(status, str) or not 1 <= len(status) <= MAX_STATUS_LENGTH:
        raise ValueError(
            f"a status is a text of 1-{MAX_STATUS_LENGTH} characters, got {status!r:.80}"
        )
    return checked


def checked_mesh_request(
    idempotency_key: object, tenant_id: object, fingerprint: object, received_at: object
) -> None:
    """A mesh request's key and tenant are identifiers, its fingerprint a text a database
    can store (a stored row gives it back equal) and its time an int."""
    checked_identifier("idempotency_key", idempotency_key)
    checked_identifier("tenant_id", tenant_id)
    if not isinstance(fingerprint, str):
        raise InvalidFingerprintError(f"{FINGERPRINT_RULE}; got a {type(fingerprint).__name__}")
    checked_fingerprint(fingerprint)
    checked_time("received_at", received_at)


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
    "checked_cost_entry",
    "checked_count",
    "checked_dependencies",
    "checked_fenced_key",
    "checked_int",
    "checked_lease",
    "checked_lease_event",
    "checked_mesh_request",
    "checked_optional_identifier",
    "checked_pause",
    "checked_positive_ms",
    "checked_queued_child",
    "checked_record",
    "checked_snapshot",
    "checked_time",
    "checked_token",
    "fence_refusal_of",
    "fenced_error",
    "lease_state_at",
]
