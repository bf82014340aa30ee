"""The rows of the child queue a claim and a listing answer: their columns, in the order of
`ClaimedChild` and `ChildExecution`, and the values they become."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.types import ChildExecution, ChildStatus, ClaimedChild, JsonValue
from agboss_sql.sql._base import loads
from agboss_sql.sql.schema import child_executions as C

CLAIMED = (
    "tenant_id",
    "root_execution_id",
    "parent_execution_id",
    "child_execution_id",
    "depth",
    "payload",
    "attempt",
    "claimed_by",
)
"""The columns a claim or a restart answers, in `ClaimedChild`'s order."""

LISTED = (
    "tenant_id",
    "root_execution_id",
    "parent_execution_id",
    "child_execution_id",
    "depth",
    "payload",
    "status",
    "attempt",
    "claimed_by",
    "queued_at",
    "outcome",
)
"""The columns `children` and `running` answer, in `ChildExecution`'s order."""


def columns(names: Sequence[str]) -> list[sa.Column[Any]]:
    return [C.c[name] for name in names]


def _slot_setters() -> tuple[Any, ...]:
    """The slot setters of `ClaimedChild`'s fields, in `CLAIMED`'s order (checked: the
    fields are those columns, set by the generated `__init__` alone)."""
    names = tuple(field.name for field in dataclasses.fields(ClaimedChild))
    if names != CLAIMED or hasattr(ClaimedChild, "__post_init__"):
        raise AssertionError(f"ClaimedChild's fields {names} are not the claim's columns")
    return tuple(getattr(ClaimedChild, name).__set__ for name in CLAIMED)


(
    _set_tenant,
    _set_root,
    _set_parent,
    _set_child,
    _set_depth,
    _set_payload,
    _set_attempt,
    _set_claimed_by,
) = _slot_setters()
_new = object.__new__


def claimed_child(
    tenant_id: str,
    root_id: str,
    parent_id: str,
    child_id: str,
    depth: int,
    payload: JsonValue,
    attempt: int,
    claimed_by: str,
) -> ClaimedChild:
    """`ClaimedChild(...)` of these fields, built as its generated `__init__` builds it
    (each slot set on a new instance) without the `object.__setattr__` lookup per field:
    about half the cost, on the path of every claimed child."""
    claimed = _new(ClaimedChild)
    _set_tenant(claimed, tenant_id)
    _set_root(claimed, root_id)
    _set_parent(claimed, parent_id)
    _set_child(claimed, child_id)
    _set_depth(claimed, depth)
    _set_payload(claimed, payload)
    _set_attempt(claimed, attempt)
    _set_claimed_by(claimed, claimed_by)
    return claimed


def claimed_of(row: Any) -> ClaimedChild:
    """The claimed child of a row of `CLAIMED`'s columns (a longer row's further columns
    ignored)."""
    tenant_id, root_id, parent_id, child_id, depth, payload, attempt, claimed_by = row[:8]
    return claimed_child(
        tenant_id,
        root_id,
        parent_id,
        child_id,
        int(depth),
        loads(payload),
        int(attempt),
        claimed_by,
    )


def listed_of(row: Any) -> ChildExecution:
    (
        tenant_id,
        root_id,
        parent_id,
        child_id,
        depth,
        payload,
        status,
        attempt,
        claimed_by,
        queued_at,
        outcome,
    ) = row
    return ChildExecution(
        tenant_id=tenant_id,
        root_execution_id=root_id,
        parent_execution_id=parent_id,
        child_execution_id=child_id,
        depth=int(depth),
        payload=loads(payload),
        status=ChildStatus(status),
        attempt=int(attempt),
        claimed_by=claimed_by,
        queued_at=int(queued_at),
        outcome=loads(outcome),
    )


__all__ = ["CLAIMED", "LISTED", "claimed_child", "claimed_of", "columns", "listed_of"]
