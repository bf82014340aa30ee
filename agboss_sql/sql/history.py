"""`SqlExecutionHistoryRepository`: finished runs, listed newest first by keyset pages.

Statements per operation: one each (`save` is one upsert), on every dialect.

A page is ordered by `(finished_at DESC, execution_id DESC)` and the next one starts
strictly after the cursor in that order, so rows with equal `finished_at` are neither
skipped nor repeated, and a row saved between two pages never shifts the rest. The
cursor condition is written `finished_at <= :f AND (finished_at < :f OR execution_id <
:e)`: its first half bounds the `(tenant_id, finished_at, execution_id)` index range on
every database. Ties are ordered by the database's collation of `execution_id` (binary
on MySQL, the column's collation on PostgreSQL, code points on SQLite).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import (
    checked_count,
    checked_snapshot,
    checked_time,
)
from agboss_sql.contracts.stores import ExecutionHistoryRepository
from agboss_sql.contracts.types import ExecutionSnapshot, HistoryCursor
from agboss_sql.sql._base import ApplicationClockStore, dumps, loads
from agboss_sql.sql.connection import SqlBuilder
from agboss_sql.sql.schema import execution_history

H = execution_history
_COLUMNS = (
    "tenant_id",
    "execution_id",
    "workflow",
    "status",
    "started_at",
    "finished_at",
    "record",
)
_KEY = ("tenant_id", "execution_id")


class HistoryStatements:
    """The history statements for one dialect (one page statement per combination of the
    optional bounds)."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        columns = [H.c[c] for c in _COLUMNS]
        self.save = ops.upsert(
            H,
            _KEY,
            {c: sa.bindparam(c, type_=H.c[c].type) for c in _COLUMNS},
            lambda new: {c: new[c] for c in _COLUMNS if c not in _KEY},
        )
        self.get = sa.select(*columns).where(
            H.c.tenant_id == sa.bindparam("tenant_id"),
            H.c.execution_id == sa.bindparam("execution_id"),
        )
        self.purge = sa.delete(H).where(
            H.c.finished_at < sa.bindparam("older_than", type_=sa.BigInteger)
        )
        self._lists = {
            (since, until, after): _page(columns, since=since, until=until, after=after)
            for since in (False, True)
            for until in (False, True)
            for after in (False, True)
        }

    def list(self, since: bool, until: bool, after: bool) -> Any:
        """The page statement with the bounds that are given."""
        return self._lists[(since, until, after)]


def _page(columns: list[Any], *, since: bool, until: bool, after: bool) -> Any:
    finished_at = H.c.finished_at
    conditions: list[sa.ColumnElement[bool]] = [H.c.tenant_id == sa.bindparam("tenant_id")]
    if since:
        conditions.append(finished_at >= sa.bindparam("since", type_=sa.BigInteger))
    if until:
        conditions.append(finished_at < sa.bindparam("until", type_=sa.BigInteger))
    if after:
        after_at = sa.bindparam("after_finished_at", type_=sa.BigInteger)
        conditions.append(finished_at <= after_at)
        conditions.append(
            sa.or_(finished_at < after_at, H.c.execution_id < sa.bindparam("after_execution_id"))
        )
    return (
        sa.select(*columns)
        .where(*conditions)
        .order_by(finished_at.desc(), H.c.execution_id.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )


def _snapshot_of(row: Any) -> ExecutionSnapshot:
    tenant_id, execution_id, workflow, status, started_at, finished_at, record = row
    return ExecutionSnapshot(
        tenant_id=tenant_id,
        execution_id=execution_id,
        workflow=workflow,
        status=status,
        started_at=int(started_at),
        finished_at=int(finished_at),
        record=loads(record),
    )


class SqlExecutionHistoryRepository(
    ApplicationClockStore[HistoryStatements], ExecutionHistoryRepository
):
    """Finished runs on SQL, one row per `(tenant_id, execution_id)`; the `record` is kept
    as its JSON text, so it reads back exactly as saved (`steps[].decision`, `input_hash`,
    `tool_calls`, `origin` and anything else in it)."""

    statements = HistoryStatements

    async def save(self, snapshot: ExecutionSnapshot) -> None:
        """Insert the snapshot, or replace every field of the stored one with the same
        tenant and execution id (one upsert)."""
        checked_snapshot(snapshot)
        params = {
            "tenant_id": snapshot.tenant_id,
            "execution_id": snapshot.execution_id,
            "workflow": snapshot.workflow,
            "status": str(snapshot.status),
            "started_at": snapshot.started_at,
            "finished_at": snapshot.finished_at,
            "record": dumps(snapshot.record),
        }
        await self.connection.execute(self._sql.save, params)

    async def get(self, tenant_id: str, execution_id: str) -> ExecutionSnapshot | None:
        """The snapshot, or `None` (another tenant's snapshot is `None`)."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        result = await self.connection.execute(
            self._sql.get, {"tenant_id": tenant_id, "execution_id": execution_id}
        )
        row = result.first()
        return None if row is None else _snapshot_of(row)

    async def list(
        self,
        tenant_id: str,
        *,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        after: HistoryCursor | None = None,
    ) -> Sequence[ExecutionSnapshot]:
        """The tenant's snapshots with `since <= finished_at < until` (each bound optional),
        newest first by `(finished_at, execution_id)`, up to `limit`, strictly after the
        cursor `after` (the last snapshot of the previous page) in that order. One
        statement."""
        checked_identifier("tenant_id", tenant_id)
        checked_count("limit", limit)
        params: dict[str, Any] = {"tenant_id": tenant_id, "limit": limit}
        if since is not None:
            params["since"] = checked_time("since", since)
        if until is not None:
            params["until"] = checked_time("until", until)
        if after is not None:
            params["after_finished_at"] = checked_time("after.finished_at", after.finished_at)
            params["after_execution_id"] = checked_identifier(
                "after.execution_id", after.execution_id
            )
        if limit == 0:
            return []
        statement = self._sql.list(since is not None, until is not None, after is not None)
        result = await self.connection.execute(statement, params)
        return [_snapshot_of(row) for row in result.rows]

    async def purge(self, older_than: int) -> int:
        """Delete the snapshots (every tenant's) finished before `older_than`, in one
        statement. How many it deleted."""
        older_than = checked_time("older_than", older_than)
        result = await self.connection.execute(self._sql.purge, {"older_than": older_than})
        return result.rowcount
