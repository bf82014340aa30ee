"""`SqlExecutionLeaseEventRepository`: the lease log, an append-only table.

The framework writes a line after the lease move it records, never inside a
lease's transaction, so this store needs no atomicity with the leases. Every
operation is one statement in autocommit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import checked_count, checked_dependencies, checked_lease_event
from agboss_sql.contracts.stores import ExecutionLeaseEventRepository
from agboss_sql.contracts.types import (
    ApplicationContext,
    ExecutionLeaseEvent,
    LeaseEventKind,
    LeaseHolder,
)
from agboss_sql.sql._base import SqlStore
from agboss_sql.sql.connection import SqlBuilder, SqlConnection
from agboss_sql.sql.schema import execution_lease_events

E = execution_lease_events
_COLUMNS = (
    E.c.tenant_id,
    E.c.execution_id,
    E.c.instance_id,
    E.c.lease_epoch,
    E.c.kind,
    E.c.at,
    E.c.taken_over_from_instance_id,
    E.c.taken_over_from_epoch,
    E.c.reason,
)


class LeaseEventStatements:
    """The lease log's statements for one dialect."""

    def __init__(self, b: SqlBuilder) -> None:
        self.save = sa.insert(E).values({c.name: sa.bindparam(c.name) for c in _COLUMNS})
        self.list = (
            sa.select(*_COLUMNS)
            .where(
                E.c.tenant_id == sa.bindparam("tenant_id"),
                E.c.execution_id == sa.bindparam("execution_id"),
            )
            .order_by(E.c.id)
        )
        self.recent = (
            sa.select(*_COLUMNS)
            .order_by(E.c.id.desc())
            .limit(sa.bindparam("limit", type_=sa.Integer))
        )


def _event_of(row: Any) -> ExecutionLeaseEvent:
    tenant_id, execution_id, instance_id, epoch, kind, at, from_instance, from_epoch, reason = row
    return ExecutionLeaseEvent(
        tenant_id=tenant_id,
        execution_id=execution_id,
        instance_id=instance_id,
        lease_epoch=int(epoch),
        kind=LeaseEventKind(kind),
        at=int(at),
        taken_over_from=(
            LeaseHolder(from_instance, int(from_epoch)) if from_instance is not None else None
        ),
        reason=reason,
    )


class SqlExecutionLeaseEventRepository(SqlStore, ExecutionLeaseEventRepository):
    """The lease log on SQL: one `INSERT` per event, read back exactly as saved, in save
    order (the table's ascending id)."""

    def __init__(
        self,
        connection: SqlConnection,
        clock: object | None = None,
        application: ApplicationContext | None = None,
    ) -> None:
        # The clock is accepted for the uniform constructor only: events carry their time.
        connection, _, application = checked_dependencies(
            self, connection, SqlConnection, clock, application, clock_kind="unused"
        )
        self._attach(connection, application)
        self._sql = connection.prepared(LeaseEventStatements)

    async def save(self, event: ExecutionLeaseEvent) -> None:
        """Append `event` (one statement). A field the log could not give back exactly is
        refused before anything is sent."""
        checked_lease_event(event)
        holder = event.taken_over_from
        params = {
            "tenant_id": event.tenant_id,
            "execution_id": event.execution_id,
            "instance_id": event.instance_id,
            "lease_epoch": event.lease_epoch,
            "kind": LeaseEventKind(event.kind).value,
            "at": event.at,
            "taken_over_from_instance_id": None if holder is None else holder.instance_id,
            "taken_over_from_epoch": None if holder is None else holder.lease_epoch,
            "reason": event.reason,
        }
        await self.connection.execute(self._sql.save, params)

    async def list(self, tenant_id: str, execution_id: str) -> Sequence[ExecutionLeaseEvent]:
        """The execution's events, exactly as saved, in save order (one statement)."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        result = await self.connection.execute(
            self._sql.list, {"tenant_id": tenant_id, "execution_id": execution_id}
        )
        return [_event_of(row) for row in result.rows]

    async def recent(self, limit: int) -> Sequence[ExecutionLeaseEvent]:
        """The newest `limit` events of every execution, newest first (one statement; none
        for `limit == 0`)."""
        checked_count("limit", limit)
        if limit == 0:
            return []
        result = await self.connection.execute(self._sql.recent, {"limit": limit})
        return [_event_of(row) for row in result.rows]
