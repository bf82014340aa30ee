"""`SqlPausedExecutionRepository`: human-in-the-loop pauses, answered once.

Every move is one conditional `UPDATE` from the expected status: the database
decides which of two concurrent answers wins, never a read in Python.

Statements per operation: `save`, `get`, `resolved`, `take`, `cancel`, `purge` one
each on every dialect (a refused `take` with a taker reads who took it: two). `resolve` one on PostgreSQL and SQLite (`UPDATE … RETURNING`);
on MySQL/MariaDB (no `UPDATE … RETURNING`) one when refused, two when it resolved (the
conditional update, then a read of the pause's fixed fields).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.errors import DuplicatePauseError, NotPausedError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import checked_pause, checked_payloads_together, checked_time
from agboss_sql.contracts.stores import PausedExecutionRepository
from agboss_sql.contracts.types import (
    JsonValue,
    PausedExecution,
    PauseStatus,
)
from agboss_sql.sql._base import ApplicationClockStore, dumps, loads
from agboss_sql.sql.connection import SqlBuilder
from agboss_sql.sql.schema import paused_executions

P = paused_executions
_COLUMNS = (
    "tenant_id",
    "pause_id",
    "execution_id",
    "root_execution_id",
    "thread_id",
    "status",
    "request",
    "decision",
    "created_at",
    "resolved_at",
)
_PURGEABLE = (PauseStatus.TAKEN.value, PauseStatus.CANCELLED.value)


def _the_pause() -> sa.ColumnElement[bool]:
    return sa.and_(
        P.c.tenant_id == sa.bindparam("tenant_id"), P.c.pause_id == sa.bindparam("pause_id")
    )


def _move(expected: PauseStatus, new: PauseStatus, **values: Any) -> sa.Update:
    """Compare-and-set the pause's status from `expected` to `new` (the move's time is
    `:now`, the application clock's)."""
    return (
        sa.update(P)
        .where(_the_pause(), P.c.status == expected.value)
        .values(status=new.value, updated_at=sa.bindparam("now", type_=sa.BigInteger), **values)
    )


class PauseStatements:
    """The pause statements for one dialect."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        columns = [P.c[c] for c in _COLUMNS]
        self.returning = b.capabilities.update_returning
        self.save = ops.insert_if_absent(P, ["tenant_id", "pause_id"]).values(
            {c: sa.bindparam(c, type_=P.c[c].type) for c in (*_COLUMNS, "updated_at")}
        )
        self.read = sa.select(*columns).where(_the_pause())
        now = sa.bindparam("now", type_=sa.BigInteger)
        resolve = _move(
            PauseStatus.PENDING,
            PauseStatus.RESOLVED,
            decision=sa.bindparam("decision"),
            resolved_at=now,
        )
        self.resolve = resolve.returning(*columns) if self.returning else resolve
        self.take = _move(PauseStatus.RESOLVED, PauseStatus.TAKEN, taken_by=sa.bindparam("taker"))
        self.read_taker = sa.select(P.c.status, P.c.taken_by).where(_the_pause())
        self.cancel = _move(PauseStatus.PENDING, PauseStatus.CANCELLED, resolved_at=now)
        self.resolved = (
            sa.select(*columns)
            .where(
                P.c.tenant_id == sa.bindparam("tenant_id"),
                P.c.root_execution_id == sa.bindparam("root_execution_id"),
                P.c.status == PauseStatus.RESOLVED.value,
            )
            .order_by(P.c.created_at, P.c.pause_id)
        )
        # Served by the (status, updated_at) index: one range per purgeable status, so the
        # cost follows the rows deleted, not the table.
        self.purge = sa.delete(P).where(
            P.c.status.in_([sa.literal(status) for status in _PURGEABLE]),
            P.c.updated_at < sa.bindparam("older_than", type_=sa.BigInteger),
        )


def _pause_of(row: Any) -> PausedExecution:
    (
        tenant_id,
        pause_id,
        execution_id,
        root_execution_id,
        thread_id,
        status,
        request,
        decision,
        created_at,
        resolved_at,
    ) = row
    return PausedExecution(
        tenant_id=tenant_id,
        pause_id=pause_id,
        execution_id=execution_id,
        root_execution_id=root_execution_id,
        thread_id=thread_id,
        status=PauseStatus(status),
        request=loads(request),
        decision=loads(decision),
        created_at=int(created_at),
        resolved_at=None if resolved_at is None else int(resolved_at),
    )


def _not_paused(tenant_id: str, pause_id: str) -> NotPausedError:
    return NotPausedError(
        f"pause {pause_id!r} of tenant {tenant_id!r} is not pending: it was answered, taken "
        "or cancelled already, or it does not exist; read it with get()"
    )


class SqlPausedExecutionRepository(
    ApplicationClockStore[PauseStatements], PausedExecutionRepository
):
    """Pauses on SQL, keyed by `(tenant_id, pause_id)`: each status move is one
    compare-and-set, so a pause is answered once whichever instance answers.

    Times (`resolved_at`, and `updated_at`, from which `purge` measures a pause's age) are
    the application clock's. `resolved_at` is when the pause was answered or cancelled.
    """

    statements = PauseStatements

    async def save(self, pause: PausedExecution) -> None:
        """Insert the pause (one statement); an existing `(tenant_id, pause_id)` is
        `DuplicatePauseError` and leaves the stored pause as it was."""
        checked_pause(pause)
        request, decision = dumps(pause.request), dumps(pause.decision)
        checked_payloads_together("a pause's request and decision", request, decision)
        params = {
            "tenant_id": pause.tenant_id,
            "pause_id": pause.pause_id,
            "execution_id": pause.execution_id,
            "root_execution_id": pause.root_execution_id,
            "thread_id": pause.thread_id,
            "status": PauseStatus(pause.status).value,
            "request": request,
            "decision": decision,
            "created_at": int(pause.created_at),
            "resolved_at": None if pause.resolved_at is None else int(pause.resolved_at),
            "updated_at": self.clock.now(),
        }
        if not await self.connection.insert_if_absent(self._sql.save, params):
            raise DuplicatePauseError(
                f"pause {pause.pause_id!r} of tenant {pause.tenant_id!r} already exists"
            )

    async def get(self, tenant_id: str, pause_id: str) -> PausedExecution | None:
        """The pause, or `None` (another tenant's pause is `None`)."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("pause_id", pause_id)
        result = await self.connection.execute(
            self._sql.read, {"tenant_id": tenant_id, "pause_id": pause_id}
        )
        row = result.first()
        return None if row is None else _pause_of(row)

    async def resolve(self, tenant_id: str, pause_id: str, decision: JsonValue) -> PausedExecution:
        """Compare-and-set pending -> resolved with the decision, in one conditional update:
        of two answers, whichever instance sends them, exactly one resolves the pause. The
        resolved pause; the second answer, or an unknown pause, is `NotPausedError`."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("pause_id", pause_id)
        now = self.clock.now()
        params = {
            "tenant_id": tenant_id,
            "pause_id": pause_id,
            "decision": dumps(decision),
            "now": now,
        }
        result = await self.connection.execute(self._sql.resolve, params)
        if self._sql.returning:
            row = result.first()
            if row is None:
                raise _not_paused(tenant_id, pause_id)
            return _pause_of(row)
        if result.rowcount != 1:
            raise _not_paused(tenant_id, pause_id)
        # The update decided. The read only fetches the fields no move changes; the moved
        # ones are what the update wrote, whatever happened to the row since (a take).
        key = {"tenant_id": tenant_id, "pause_id": pause_id}
        row = (await self.connection.execute(self._sql.read, key)).first()
        if row is None:
            # Resolved, then taken and purged before this read: the answer was consumed.
            raise _not_paused(tenant_id, pause_id)
        pause = _pause_of(row)
        return PausedExecution(
            tenant_id=pause.tenant_id,
            pause_id=pause.pause_id,
            execution_id=pause.execution_id,
            root_execution_id=pause.root_execution_id,
            thread_id=pause.thread_id,
            status=PauseStatus.RESOLVED,
            request=pause.request,
            decision=loads(params["decision"]),
            created_at=pause.created_at,
            resolved_at=now,
        )

    async def resolved(self, tenant_id: str, root_execution_id: str) -> Sequence[PausedExecution]:
        """The tree's resolved (not yet taken) pauses, oldest first (by `created_at`, then
        pause id), to drain in one pass."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("root_execution_id", root_execution_id)
        result = await self.connection.execute(
            self._sql.resolved, {"tenant_id": tenant_id, "root_execution_id": root_execution_id}
        )
        return [_pause_of(row) for row in result.rows]

    async def take(self, tenant_id: str, pause_id: str, *, taker: str | None = None) -> bool:
        """Compare-and-set resolved -> taken recording `taker` (one conditional update).
        True when this call moved it: of two takers, exactly one. When it moved nothing and
        a `taker` is given, a read of the (then settled: taken is final) pause answers True
        if this taker took it, so a retry after a lost reply answers as the first did."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("pause_id", pause_id)
        if taker is not None:
            checked_identifier("taker", taker)
        key = {"tenant_id": tenant_id, "pause_id": pause_id}
        result = await self.connection.execute(
            self._sql.take, {**key, "taker": taker, "now": self.clock.now()}
        )
        if result.rowcount == 1:
            return True
        if taker is None:
            return False
        row = (await self.connection.execute(self._sql.read_taker, key)).first()
        return row is not None and row[0] == PauseStatus.TAKEN.value and row[1] == taker

    async def cancel(self, tenant_id: str, pause_id: str) -> bool:
        """Compare-and-set pending -> cancelled (one conditional update). True when this call
        moved it; a pause already answered is not cancelled."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("pause_id", pause_id)
        result = await self.connection.execute(
            self._sql.cancel,
            {"tenant_id": tenant_id, "pause_id": pause_id, "now": self.clock.now()},
        )
        return result.rowcount == 1

    async def purge(self, older_than: int) -> int:
        """Delete taken and cancelled pauses last moved (`updated_at`) before `older_than`,
        in one statement. How many it deleted; pending and resolved pauses are kept."""
        checked_time("older_than", older_than)
        result = await self.connection.execute(self._sql.purge, {"older_than": older_than})
        return result.rowcount
