"""`SqlExecutionRecordRepository`: runs and their status, moved by compare-and-set.

Every status move is one conditional `UPDATE … WHERE status = :expected`: the
database decides which of two concurrent moves wins, never a read in Python. A run in
a final status (succeeded, failed, cancelled) never moves again, so two outcomes for
one run are impossible. Times are the application clock's.

Statements per operation: one each, on every dialect (`transition` and `complete`
from a final status answer False without a statement; a refused `complete` reads the
record once more, to answer a retry of the same outcome True).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.errors import DuplicateExecutionError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import (
    checked_choice,
    checked_count,
    checked_record,
)
from agboss_sql.contracts.stores import ExecutionRecordRepository
from agboss_sql.contracts.types import (
    ExecutionRecord,
    ExecutionRecordStatus,
    JsonValue,
)
from agboss_sql.sql._base import ApplicationClockStore, dumps, loads
from agboss_sql.sql.connection import SqlBuilder
from agboss_sql.sql.schema import execution_records

R = execution_records

FINAL_STATUSES = frozenset(
    {
        ExecutionRecordStatus.SUCCEEDED,
        ExecutionRecordStatus.FAILED,
        ExecutionRecordStatus.CANCELLED,
    }
)
"""A run in one of these has its outcome: its status never moves again."""

_COLUMNS = (
    "tenant_id",
    "execution_id",
    "root_execution_id",
    "parent_execution_id",
    "thread_id",
    "workflow",
    "owner",
    "status",
    "created_at",
    "updated_at",
    "outcome",
)


class RecordStatements:
    """The execution record statements for one dialect."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        columns = [R.c[name] for name in _COLUMNS]
        self.save = ops.insert_if_absent(R, ["tenant_id", "execution_id"]).values(
            {name: sa.bindparam(name) for name in _COLUMNS}
        )
        the_record = sa.and_(
            R.c.tenant_id == sa.bindparam("tenant_id"),
            R.c.execution_id == sa.bindparam("execution_id"),
        )
        self.get = sa.select(*columns).where(the_record)
        self.find_by_thread = (
            sa.select(*columns)
            .where(
                R.c.tenant_id == sa.bindparam("tenant_id"),
                R.c.thread_id == sa.bindparam("thread_id"),
            )
            .order_by(R.c.created_at, R.c.execution_id)
        )
        self.find_by_status = (
            sa.select(*columns)
            .where(R.c.status == sa.bindparam("status"))
            .order_by(R.c.updated_at, R.c.tenant_id, R.c.execution_id)
            .limit(sa.bindparam("limit", type_=sa.Integer))
        )
        moved = sa.and_(the_record, R.c.status == sa.bindparam("expected"))
        updated_at = sa.bindparam("now", type_=sa.BigInteger)
        self.transition = (
            sa.update(R).where(moved).values(status=sa.bindparam("new"), updated_at=updated_at)
        )
        self.complete = (
            sa.update(R)
            .where(moved)
            .values(
                status=sa.bindparam("new"),
                outcome=sa.bindparam("outcome"),
                updated_at=updated_at,
            )
        )


def _record(row: Any) -> ExecutionRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["status"] = ExecutionRecordStatus(values["status"])
    values["created_at"] = int(values["created_at"])
    values["updated_at"] = int(values["updated_at"])
    values["outcome"] = loads(values["outcome"])
    return ExecutionRecord(**values)


class SqlExecutionRecordRepository(
    ApplicationClockStore[RecordStatements], ExecutionRecordRepository
):
    """Execution records on SQL: tenant-isolated, status moved only by compare-and-set, one
    outcome per run."""

    statements = RecordStatements

    async def save(self, record: ExecutionRecord) -> None:
        """Insert the record in one statement; an existing `(tenant_id, execution_id)` is
        `DuplicateExecutionError` (the stored record is untouched)."""
        checked_record(record)
        params = {
            "tenant_id": record.tenant_id,
            "execution_id": record.execution_id,
            "root_execution_id": record.root_execution_id,
            "parent_execution_id": record.parent_execution_id,
            "thread_id": record.thread_id,
            "workflow": record.workflow,
            "owner": record.owner,
            "status": ExecutionRecordStatus(record.status).value,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "outcome": None if record.outcome is None else dumps(record.outcome),
        }
        if not await self.connection.insert_if_absent(self._sql.save, params):
            raise DuplicateExecutionError(
                f"execution {record.execution_id!r} of tenant {record.tenant_id!r} already "
                "has a record"
            )

    async def get(self, tenant_id: str, execution_id: str) -> ExecutionRecord | None:
        """The tenant's record, or `None` (another tenant's record is `None`)."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        result = await self.connection.execute(
            self._sql.get, {"tenant_id": tenant_id, "execution_id": execution_id}
        )
        row = result.first()
        return None if row is None else _record(row)

    async def find_by_thread(self, tenant_id: str, thread_id: str) -> Sequence[ExecutionRecord]:
        """The tenant's records of a thread, oldest created first (then by execution id)."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("thread_id", thread_id)
        result = await self.connection.execute(
            self._sql.find_by_thread, {"tenant_id": tenant_id, "thread_id": thread_id}
        )
        return [_record(row) for row in result.rows]

    async def find_by_status(
        self, status: ExecutionRecordStatus, limit: int
    ) -> Sequence[ExecutionRecord]:
        """Up to `limit` records in `status` (every tenant's), oldest update first."""
        status = checked_choice("status", ExecutionRecordStatus, status)
        checked_count("limit", limit)
        if limit == 0:
            return []
        result = await self.connection.execute(
            self._sql.find_by_status, {"status": status.value, "limit": limit}
        )
        return [_record(row) for row in result.rows]

    async def transition(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        new: ExecutionRecordStatus,
    ) -> bool:
        """Compare-and-set the status from `expected` to `new` in one statement (a run in a
        final status never moves). True when it moved."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        expected = checked_choice("expected", ExecutionRecordStatus, expected)
        new = checked_choice("new", ExecutionRecordStatus, new)
        if expected in FINAL_STATUSES:
            return False
        params = {
            "tenant_id": tenant_id,
            "execution_id": execution_id,
            "expected": expected.value,
            "new": new.value,
            "now": self.clock.now(),
        }
        return (await self.connection.execute(self._sql.transition, params)).rowcount == 1

    async def complete(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        final: ExecutionRecordStatus,
        outcome: JsonValue,
    ) -> bool:
        """Compare-and-set from `expected` to the final status `final` with the outcome, in
        one statement: of two completions of one run with different outcomes exactly one is
        True. When it moved nothing, a read answers True if the run is already `final` with
        an equal outcome (a retry after a lost reply answers as the first did)."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        expected = checked_choice("expected", ExecutionRecordStatus, expected)
        final = checked_choice("final", ExecutionRecordStatus, final)
        if final not in FINAL_STATUSES:
            raise ValueError(f"a run completes as succeeded, failed or cancelled, not {final!r}")
        text = None if outcome is None else dumps(outcome)
        if expected in FINAL_STATUSES:
            return False
        params = {
            "tenant_id": tenant_id,
            "execution_id": execution_id,
            "expected": expected.value,
            "new": final.value,
            "outcome": text,
            "now": self.clock.now(),
        }
        if (await self.connection.execute(self._sql.complete, params)).rowcount == 1:
            return True
        # Refused: a final status never moves, so a read now tells whether the run already
        # has this very outcome (a retry after a lost reply).
        key = {"tenant_id": tenant_id, "execution_id": execution_id}
        row = (await self.connection.execute(self._sql.get, key)).first()
        if row is None:
            return False
        stored = _record(row)
        return stored.status is final and stored.outcome == loads(text)


__all__ = ["FINAL_STATUSES", "RecordStatements", "SqlExecutionRecordRepository"]
