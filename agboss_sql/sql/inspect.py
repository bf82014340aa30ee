"""Read-only views of what a cluster is doing, from the database alone: the trees with
their status and holder (`list_trees`), one tree's steps, children, pauses,
compensations and lease moves in one timeline (`tree_view`), and the child queue
(`queue_view`).

Every function here sends only `SELECT`s, one statement at a time (no transaction, no
lock): a view may mix rows read a few milliseconds apart while the cluster works, and it
never changes a row. Times are epoch milliseconds; ages are measured on the database's
clock (`now_ms`), the one that decides the leases.

What a tree is: a root's row in `agboss_execution_records` (`execution_id =
root_execution_id`), its children in `agboss_child_executions` (found parent by parent
through their `(parent_execution_id, status)` index), each execution's lease in
`agboss_execution_leases` and its moves in `agboss_execution_lease_events`. The steps of
the workflow runtime are fenced effects keyed `name#n` under the execution's lease scope
(`agboss_fenced_effect_results`, effect names in `EFFECT_KINDS`) and its outbound calls
are in `agboss_outbound_calls`: neither table is indexed by execution, so `tree_view`
reads them by a scan of the tenant's rows (an operator's look at one tree, not a hot path).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa

from agboss_sql.sql._inspect_rows import (
    COMPENSATED_PREFIX,
    EFFECT_KINDS,
    MAX_DEPTH,
    UNFINISHED,
    database_now,
    in_values,
    lease_state,
)
from agboss_sql.sql._tree_view import Moment, TreeView, tree_view
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import (
    child_executions,
    execution_leases,
    execution_records,
    paused_executions,
)

_C = child_executions
_L = execution_leases
_R = execution_records


# --- trees -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One tree as `list_trees` answers it: its root's record, lease and waits."""

    tenant_id: str
    tree: str
    workflow: str
    status: str
    created_at: int
    updated_at: int
    age_ms: int
    holder: str | None
    epoch: int | None
    lease: str | None
    """`lease_state` of the root's lease, `None` when it never had one."""
    children_pending: int
    pauses: list[str]
    """The ids of the root's pauses still waiting for a decision."""


@dataclass(frozen=True, slots=True)
class TreeList:
    now: int
    trees: list[TreeRow]
    limit: int

    def as_json(self) -> dict[str, Any]:
        return {"now": self.now, "limit": self.limit, "trees": [asdict(t) for t in self.trees]}


async def list_trees(
    connection: SqlConnection,
    *,
    status: str | None = None,
    tenant: str | None = None,
    limit: int = 50,
) -> TreeList:
    """The trees most recently changed first (at most `limit`), optionally of one record
    status (`queued`, `running`, `paused`, `succeeded`, `failed`, `cancelled`) and one
    tenant: each with its root's holder, epoch and lease state, its age, its children not
    finished and its pauses still pending."""
    now = await database_now(connection)
    query = (
        sa.select(
            _R.c.tenant_id,
            _R.c.execution_id,
            _R.c.workflow,
            _R.c.status,
            _R.c.created_at,
            _R.c.updated_at,
            _L.c.holder_instance_id,
            _L.c.lease_epoch,
            _L.c.expires_at,
            _L.c.released,
            _L.c.yielded,
            _L.c.finished,
            _L.c.closed_reason,
        )
        .select_from(
            _R.outerjoin(
                _L,
                sa.and_(_L.c.tenant_id == _R.c.tenant_id, _L.c.execution_id == _R.c.execution_id),
            )
        )
        .where(_R.c.execution_id == _R.c.root_execution_id)
        .order_by(_R.c.updated_at.desc(), _R.c.tenant_id, _R.c.execution_id)
        .limit(limit)
    )
    if status is not None:
        query = query.where(_R.c.status == status)
    if tenant is not None:
        query = query.where(_R.c.tenant_id == tenant)
    rows = (await connection.execute(query)).rows
    roots = sorted({row[1] for row in rows})
    pending: dict[tuple[str, str], int] = {}
    pauses: dict[tuple[str, str], list[str]] = {}
    if roots:
        counted = (
            sa.select(_C.c.tenant_id, _C.c.root_execution_id, sa.func.count())
            .where(in_values(_C.c.status, UNFINISHED), in_values(_C.c.root_execution_id, roots))
            .group_by(_C.c.tenant_id, _C.c.root_execution_id)
        )
        for tenant_id, root, count in (await connection.execute(counted)).rows:
            pending[(tenant_id, root)] = int(count)
        P = paused_executions
        waiting = (
            sa.select(P.c.tenant_id, P.c.root_execution_id, P.c.pause_id)
            .where(P.c.status == "pending", in_values(P.c.root_execution_id, roots))
            .order_by(P.c.created_at, P.c.pause_id)
        )
        for tenant_id, root, pause_id in (await connection.execute(waiting)).rows:
            pauses.setdefault((tenant_id, root), []).append(pause_id)
    trees = []
    for row in rows:
        tenant_id, root, workflow, state, created, updated, holder, epoch = row[:8]
        lease = None
        if holder is not None:
            lease = lease_state(
                expires_at=int(row[8]),
                released=bool(row[9]),
                yielded=bool(row[10]),
                finished=bool(row[11]),
                closed=row[12],
                now=now,
            )
        trees.append(
            TreeRow(
                tenant_id=tenant_id,
                tree=root,
                workflow=workflow,
                status=state,
                created_at=int(created),
                updated_at=int(updated),
                age_ms=now - int(created),
                holder=holder,
                epoch=None if epoch is None else int(epoch),
                lease=lease,
                children_pending=pending.get((tenant_id, root), 0),
                pauses=pauses.get((tenant_id, root), []),
            )
        )
    return TreeList(now=now, trees=trees, limit=limit)


# --- the queue -------------------------------------------------------------------------

_DEPTH = sa.select(_C.c.status, sa.func.count()).group_by(_C.c.status)
_OLDEST = (
    sa.select(_C.c.child_execution_id, _C.c.queued_at)
    .where(_C.c.status == "queued")
    .order_by(_C.c.queued_at, _C.c.id)
    .limit(1)
)
_CLAIMS = (
    sa.select(_C.c.claimed_by, _C.c.status, sa.func.count())
    .where(_C.c.claimed_by.is_not(None))
    .group_by(_C.c.claimed_by, _C.c.status)
)
_WAKES = (
    sa.select(sa.func.count())
    .select_from(_C)
    .where(_C.c.finish_remaining == 0, _C.c.parent_woken_at.is_(None))
)
_ROOTS = (
    sa.select(_R.c.status, sa.func.count())
    .where(_R.c.execution_id == _R.c.root_execution_id)
    .group_by(_R.c.status)
)
# Built once: a connection compiles each statement object once and keeps it.


@dataclass(frozen=True, slots=True)
class QueueView:
    """The child queue at one moment (see `queue_view`)."""

    now: int
    depth: dict[str, int]
    """Children by state: `queued`, `running`, `waiting`, `finished` (0 when none)."""
    oldest_queued: str | None
    oldest_queued_ms: int | None
    """How long the oldest claimable child has waited, on the database's clock."""
    claims: dict[str, dict[str, int]]
    """Per instance, the children whose last claim was its, by state (`running` now,
    `waiting` for their own children, `finished`)."""
    wakes_owed: int
    """Parents whose last child finished and that nobody has woken yet."""
    trees: dict[str, int]
    """Trees (root records) by status."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def queue_view(connection: SqlConnection) -> QueueView:
    """The child queue now: its depth by state, the oldest claimable child and how long it
    has waited, the claims of each instance, the parents' wakes owed, and the trees by
    status."""
    now = await database_now(connection)
    depth = dict.fromkeys((*UNFINISHED, "finished"), 0)
    for state, count in (await connection.execute(_DEPTH)).rows:
        depth[state] = int(count)
    oldest = (await connection.execute(_OLDEST)).first()
    claims: dict[str, dict[str, int]] = {}
    for instance, state, count in (await connection.execute(_CLAIMS)).rows:
        claims.setdefault(instance, {})[state] = int(count)
    wakes = int((await connection.execute(_WAKES)).scalar() or 0)
    trees = {state: int(count) for state, count in (await connection.execute(_ROOTS)).rows}
    return QueueView(
        now=now,
        depth=depth,
        oldest_queued=None if oldest is None else oldest[0],
        oldest_queued_ms=None if oldest is None else now - int(oldest[1]),
        claims=dict(sorted(claims.items())),
        wakes_owed=wakes,
        trees=dict(sorted(trees.items())),
    )


__all__ = [
    "COMPENSATED_PREFIX",
    "EFFECT_KINDS",
    "MAX_DEPTH",
    "UNFINISHED",
    "Moment",
    "QueueView",
    "TreeList",
    "TreeRow",
    "TreeView",
    "database_now",
    "lease_state",
    "list_trees",
    "queue_view",
    "tree_view",
]
