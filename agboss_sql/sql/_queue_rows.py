"""The rows of the child queue a claim and a listing answer: their columns, in the order of
`ClaimedChild` and `ChildExecution`, and the values they become."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.types import ChildExecution, ChildStatus, ClaimedChild
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


def claimed_of(row: Any) -> ClaimedChild:
    tenant_id, root_id, parent_id, child_id, depth, payload, attempt, claimed_by = row
    return ClaimedChild(
        tenant_id=tenant_id,
        root_execution_id=root_id,
        parent_execution_id=parent_id,
        child_execution_id=child_id,
        depth=int(depth),
        payload=loads(payload),
        attempt=int(attempt),
        claimed_by=claimed_by,
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


__all__ = ["CLAIMED", "LISTED", "claimed_of", "columns", "listed_of"]
