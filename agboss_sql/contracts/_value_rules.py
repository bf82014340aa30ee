"""The checks of the values stores save (re-exported by `contracts.rules`): leases, lease
events, queued children, records, pauses, cost entries, budget keys, snapshots, mesh
requests."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TypeVar

from agboss_sql.contracts._number_rules import checked_int, checked_int32, checked_time
from agboss_sql.contracts.errors import (
    InvalidFingerprintError,
    InvalidIdentifierError,
    InvalidValueError,
)
from agboss_sql.contracts.keys import FINGERPRINT_RULE, checked_fingerprint, checked_identifier
from agboss_sql.contracts.limits import (
    MAX_IDENTIFIER_LENGTH,
    MAX_REASON_LENGTH,
    MAX_STATUS_LENGTH,
    checked_text,
)
from agboss_sql.contracts.types import (
    BudgetScope,
    ChildFinish,
    CostEntry,
    ExecutionLease,
    ExecutionLeaseEvent,
    ExecutionRecord,
    ExecutionRecordStatus,
    ExecutionSnapshot,
    LeaseEventKind,
    LeaseHolder,
    PausedExecution,
    PauseStatus,
    QueuedChild,
)


def checked_optional_identifier(what: str, value: object) -> str | None:
    """`value` if it is `None` or an identifier (`checked_identifier`)."""
    return None if value is None else checked_identifier(what, value)


V = TypeVar("V")
E = TypeVar("E", bound=StrEnum)


def checked_choice(what: str, kind: type[E], value: object) -> E:
    """`value` as a member of `kind` (a status, a kind, a scope), else `InvalidValueError`
    (a `ValueError`) naming the choices."""
    try:
        return kind(value)  # type: ignore[arg-type]  # anything else is its ValueError
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise InvalidValueError(f"{what} must be one of {choices}, got {value!r:.80}") from None


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
    checked_choice("kind", LeaseEventKind, checked.kind)
    if checked.reason is not None:
        if not isinstance(checked.reason, str):
            raise TypeError(f"reason is a text or None, got {checked.reason!r:.80}")
        checked_text("reason", checked.reason, "MAX_REASON_LENGTH", MAX_REASON_LENGTH, empty=True)
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


def checked_queued_children(children: object) -> list[QueuedChild]:
    """`children` as a list, each checked as `checked_queued_child`; `ValueError` when one
    child id comes twice (a batch queues each child once), `TypeError` when it is not a
    sequence of children. An `InvalidValueError` is a `ValueError`."""
    if isinstance(children, (str, bytes)) or not isinstance(children, Sequence):
        raise TypeError(f"children is a sequence of QueuedChild, got {children!r:.80}")
    checked = [checked_queued_child(child) for child in children]
    seen: set[str] = set()
    for child in checked:
        if child.child_execution_id in seen:
            raise InvalidValueError(
                f"child {child.child_execution_id!r:.200} comes twice in one batch: a batch "
                "queues each child once"
            )
        seen.add(child.child_execution_id)
    return checked


def checked_child_finishes(finishes: object) -> list[ChildFinish]:
    """`finishes` as a list of `ChildFinish` whose child ids are identifiers and attempts
    int32; `ValueError` when one child id comes twice (a batch finishes each child once),
    `TypeError` when it is not a sequence of finishes."""
    if isinstance(finishes, (str, bytes)) or not isinstance(finishes, Sequence):
        raise TypeError(f"finishes is a sequence of ChildFinish, got {finishes!r:.80}")
    # Field by field, as `_checked_fields` would: this one is on every batch finish's path.
    checked = list(finishes)
    for finish in checked:
        if not isinstance(finish, ChildFinish):
            raise TypeError(f"expected a ChildFinish, got {type(finish).__name__}")
        checked_identifier("child_execution_id", finish.child_execution_id)
    seen: set[str] = set()
    for finish in checked:
        checked_int32("attempt", finish.attempt)
        if finish.child_execution_id in seen:
            raise InvalidValueError(
                f"child {finish.child_execution_id!r:.200} comes twice in one batch: a batch "
                "finishes each child once"
            )
        seen.add(finish.child_execution_id)
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
    checked_choice("status", ExecutionRecordStatus, checked.status)
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
    checked_choice("status", PauseStatus, checked.status)
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
    chosen = checked_choice("scope", BudgetScope, scope)
    checked_identifier("key", key)
    if tenant_id is None:
        if chosen is BudgetScope.EXECUTION:
            raise InvalidIdentifierError(
                "the EXECUTION budget scope needs tenant_id: an execution id is unique within "
                "its tenant only"
            )
        return chosen.value, NO_TENANT
    return chosen.value, checked_identifier("tenant_id", tenant_id)


def checked_snapshot(snapshot: object) -> ExecutionSnapshot:
    """`snapshot` if its ids are identifiers, its status a text of 1-32 characters
    (`MAX_STATUS_LENGTH`) a database can store and its times ints."""
    checked = _checked_fields(
        snapshot,
        ExecutionSnapshot,
        identifiers=("tenant_id", "execution_id", "workflow"),
        times=("started_at", "finished_at"),
    )
    checked_text("a status", checked.status, "MAX_STATUS_LENGTH", MAX_STATUS_LENGTH)
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


def checked_key_prefix(prefix: object) -> str:
    """`prefix` if it is a text (empty included) of at most `MAX_IDENTIFIER_LENGTH`
    characters (a tree key's) a database can store, else `InvalidValueError`."""
    return checked_text(
        "a key prefix", prefix, "MAX_IDENTIFIER_LENGTH", MAX_IDENTIFIER_LENGTH, empty=True
    )
