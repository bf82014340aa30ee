"""`SqlExecutionLeaseRepository`: one owner at a time, each move one statement.

Every statement reads the store's time once, inside itself (`SqlBuilder.now`):
the database's clock in production, a bound `:now` when a test clock is
injected. A lease is live while `expires_at > now`, in every statement.

Statements per operation: PostgreSQL and SQLite one each (`RETURNING`);
MariaDB one for the take (`INSERT … ON DUPLICATE KEY UPDATE … RETURNING`);
MySQL 8 two for a take or a renewal (the write, then a read of what it wrote).

Takes run on the takes' lane of a server's pool (`Lane.TAKE`), the holder's own moves
(renew, release, yield, reclaim, finish) on the holders' lane (`Lane.HOLD`): a take that
waits `lock_ms` on a row another session locked never holds up a renewal.
"""

from __future__ import annotations

import secrets
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.clocks import remaining_of
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import checked_lease, checked_positive_ms
from agboss_sql.contracts.stores import ExecutionLeaseRepository
from agboss_sql.contracts.types import ExecutionLease, LeaseHolder
from agboss_sql.sql._base import StoreClockStore
from agboss_sql.sql._fence import store_time_params
from agboss_sql.sql._runner import Lane
from agboss_sql.sql.connection import Exec, SqlBuilder, Step
from agboss_sql.sql.schema import execution_ids, execution_leases

L = execution_leases
_RETURNED = (
    "lease_epoch",
    "expires_at",
    "updated_at",
    "taken_over_from_instance_id",
    "taken_over_from_epoch",
    "take_id",
)


def _held(now: Any, *, live: bool) -> sa.ColumnElement[bool]:
    """The row is the caller's lease: its tenant, execution, holder and epoch."""
    condition = sa.and_(
        L.c.tenant_id == sa.bindparam("tenant_id"),
        L.c.execution_id == sa.bindparam("execution_id"),
        L.c.holder_instance_id == sa.bindparam("holder"),
        L.c.lease_epoch == sa.bindparam("epoch"),
        L.c.released.is_(sa.false()),
        L.c.finished.is_(sa.false()),
    )
    return sa.and_(condition, L.c.expires_at > now) if live else condition


class LeaseStatements:
    """The lease statements for one dialect and one kind of store time."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        source, now = b.now()
        self.returning = b.capabilities.update_returning
        lease_ms = sa.bindparam("lease_ms", type_=sa.BigInteger)
        new_row: dict[str, Any] = {
            "tenant_id": sa.bindparam("tenant_id"),
            "execution_id": sa.bindparam("execution_id"),
            "holder_instance_id": sa.bindparam("holder"),
            "lease_epoch": sa.literal(1, sa.BigInteger),
            "expires_at": now + lease_ms,
            "released": sa.false(),
            "yielded": sa.false(),
            "finished": sa.false(),
            "fence_token": sa.literal(0, sa.BigInteger),
            "taken_over_from_instance_id": sa.null(),
            "taken_over_from_epoch": sa.null(),
            "closed_reason": sa.null(),
            "take_id": sa.bindparam("take_id"),
            "updated_at": now,
        }
        # The previous epoch was taken over when it ended by expiry, not by its holder's
        # release or yield. A close by `lease_state_of` is an expiry too, even of a yielded
        # lease (the only closed_reason ever written is its "superseded").
        handed_over = sa.and_(
            sa.or_(L.c.released.is_(sa.true()), L.c.yielded.is_(sa.true())),
            L.c.closed_reason.is_(None),
        )
        if source is not None:
            columns = list(new_row)
            select = sa.select(*(new_row[c] for c in columns)).select_from(source)
            insert = ops.insert(L).from_select(columns, select)
        else:
            insert = ops.insert(L).values(new_row)

        def free(new: Any) -> sa.ColumnElement[bool]:
            return sa.and_(
                L.c.finished.is_(sa.false()),
                sa.or_(
                    L.c.released.is_(sa.true()),
                    L.c.yielded.is_(sa.true()),
                    L.c.expires_at <= new.updated_at,
                ),
            )

        def take(new: Any) -> list[tuple[str, Any]]:
            # In this order: the previous holder is read before the holder is assigned (a
            # dialect without a WHERE on its upsert assigns left to right).
            return [
                ("take_id", new.take_id),
                (
                    "taken_over_from_instance_id",
                    sa.case((handed_over, sa.null()), else_=L.c.holder_instance_id),
                ),
                ("taken_over_from_epoch", sa.case((handed_over, sa.null()), else_=L.c.lease_epoch)),
                ("holder_instance_id", new.holder_instance_id),
                ("lease_epoch", L.c.lease_epoch + 1),
                ("expires_at", new.expires_at),
                ("released", sa.false()),
                ("yielded", sa.false()),
                ("closed_reason", sa.null()),
                ("updated_at", new.updated_at),
            ]

        # A row comes back whether or not this call took it on some dialects: the per-call
        # nonce (take_id) tells.
        self.acquire = ops.upsert_where(
            insert, ["tenant_id", "execution_id"], free, take, decided_by="take_id"
        )
        # What a move answers: the epoch, the expiry, and the time to count the remaining ms
        # from. With the database's clock that time is read again as the row comes back: a
        # move that waited for the row's lock reports what is left after the wait (the
        # expiry was set from the time the statement started).
        answered_now: Any = ops.now_ms() if b.database_time else L.c.updated_at
        answered = [answered_now if name == "updated_at" else L.c[name] for name in _RETURNED]
        self.acquire_returning = ops.returning(self.acquire, *answered)

        def update(where: Any, values: dict[str, Any]) -> Any:
            # PostgreSQL: UPDATE … FROM the one-row time CTE; MySQL: a multi-table UPDATE
            # with the derived time table; SQLite: inline. Either way the time is read once.
            return sa.update(L).where(where).values(values)

        self.renew = update(
            sa.and_(_held(now, live=True), L.c.yielded.is_(sa.false())),
            {"expires_at": ops.greatest(L.c.expires_at, now + lease_ms), "updated_at": now},
        )
        self.reclaim = update(
            sa.and_(_held(now, live=True), L.c.yielded.is_(sa.true())),
            {
                "lease_epoch": L.c.lease_epoch + 1,
                "yielded": sa.false(),
                "expires_at": now + lease_ms,
                "updated_at": now,
                "take_id": sa.bindparam("take_id"),
            },
        )
        self.yield_lease = update(
            sa.and_(_held(now, live=True), L.c.yielded.is_(sa.false())),
            {"yielded": sa.true(), "updated_at": now},
        )
        self.release = update(_held(now, live=False), {"released": sa.true(), "updated_at": now})
        self.finish = update(
            _held(now, live=False),
            {"released": sa.true(), "finished": sa.true(), "updated_at": now},
        )
        if self.returning:
            self.renew = self.renew.returning(L.c.expires_at, answered_now)
            self.reclaim = self.reclaim.returning(L.c.lease_epoch, L.c.expires_at, answered_now)
        self.read = sa.select(*answered).where(
            L.c.tenant_id == sa.bindparam("tenant_id"),
            L.c.execution_id == sa.bindparam("execution_id"),
        )
        self.save_execution_id = ops.insert_if_absent(execution_ids, ["execution_id"]).values(
            execution_id=sa.bindparam("execution_id"), tenant_id=sa.bindparam("tenant_id")
        )


class SqlExecutionLeaseRepository(StoreClockStore[LeaseStatements], ExecutionLeaseRepository):
    """Leases on SQL: each move is one conditional statement decided by the store's time."""

    statements = LeaseStatements

    def _params(self, **params: Any) -> dict[str, Any]:
        return store_time_params(self.store_clock, **params)

    def _named_elsewhere(self, lease: ExecutionLease) -> bool:
        """The lease names another instance than this store's: a context built by hand,
        which moves nothing (checked before any statement)."""
        checked_lease(lease)
        return lease.holder_instance_id != self.application.instance_id

    def _lease_params(self, lease: ExecutionLease, **params: Any) -> dict[str, Any]:
        checked_lease(lease)
        return store_time_params(
            self.store_clock,
            tenant_id=lease.tenant_id,
            execution_id=lease.execution_id,
            # The holder is this store's instance: an instance moves only its own leases.
            holder=self.application.instance_id,
            epoch=lease.lease_epoch,
            **params,
        )

    def _lease_of(self, tenant_id: str, execution_id: str, row: Any) -> ExecutionLease:
        epoch, expires_at, now, from_instance, from_epoch, _ = row
        return ExecutionLease(
            tenant_id=tenant_id,
            execution_id=execution_id,
            holder_instance_id=self.application.instance_id,
            lease_epoch=int(epoch),
            remaining_ms=remaining_of(expires_at, now),
            taken_over_from=(
                LeaseHolder(from_instance, int(from_epoch)) if from_instance is not None else None
            ),
        )

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        take_id = secrets.token_hex(16)
        params = self._params(
            tenant_id=tenant_id,
            execution_id=execution_id,
            holder=self.application.instance_id,
            lease_ms=checked_positive_ms("lease_ms", lease_ms),
            take_id=take_id,
        )
        row = await self.connection.run(
            lambda: self._acquire(params), transaction=False, priority=Lane.TAKE
        )
        # Some dialects return the row whether or not the take happened: the nonce tells.
        if row is None or row[5] != take_id:
            return None
        return self._lease_of(tenant_id, execution_id, row)

    def _acquire(self, params: dict[str, Any]) -> Step[Any]:
        # Inside the step the server's capabilities are known (MariaDB returns from inserts).
        if self.connection.capabilities.insert_returning:
            return (yield Exec(self._sql.acquire_returning, params)).first()
        yield Exec(self._sql.acquire, params)
        return (yield Exec(self._sql.read, params)).first()

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        params = self._lease_params(lease, lease_ms=checked_positive_ms("lease_ms", lease_ms))
        if self._named_elsewhere(lease):
            return None
        if self._sql.returning:
            row = (
                await self.connection.execute(self._sql.renew, params, priority=Lane.HOLD)
            ).first()
            return None if row is None else remaining_of(row[0], row[1])
        return await self.connection.run(
            lambda: self._renew_then_read(params, lease),
            transaction=False,
            priority=Lane.HOLD,
        )

    def _renew_then_read(self, params: dict[str, Any], lease: ExecutionLease) -> Step[int | None]:
        if (yield Exec(self._sql.renew, params)).rowcount != 1:
            return None
        row = (yield Exec(self._sql.read, params)).first()
        if row is None or int(row[0]) != lease.lease_epoch:
            # Renewed, then moved on before the read: the renewal's own floor is lease_ms.
            return int(params["lease_ms"])
        return remaining_of(row[1], row[2])

    async def release(self, lease: ExecutionLease) -> bool:
        if self._named_elsewhere(lease):
            return False
        result = await self.connection.execute(
            self._sql.release, self._lease_params(lease), priority=Lane.HOLD
        )
        return result.rowcount == 1

    async def yield_lease(self, lease: ExecutionLease) -> bool:
        if self._named_elsewhere(lease):
            return False
        result = await self.connection.execute(
            self._sql.yield_lease, self._lease_params(lease), priority=Lane.HOLD
        )
        return result.rowcount == 1

    async def reclaim(self, lease: ExecutionLease, lease_ms: int) -> ExecutionLease | None:
        params = self._lease_params(
            lease, lease_ms=checked_positive_ms("lease_ms", lease_ms), take_id=secrets.token_hex(16)
        )
        if self._named_elsewhere(lease):
            return None
        result = await self.connection.execute(self._sql.reclaim, params, priority=Lane.HOLD)
        if self._sql.returning:
            row = result.first()
            if row is None:
                return None
            epoch, remaining = int(row[0]), remaining_of(row[1], row[2])
        else:
            if result.rowcount != 1:
                return None
            # The reclaim set expires_at = now + lease_ms and epoch + 1, exactly.
            epoch, remaining = lease.lease_epoch + 1, int(lease_ms)
        return ExecutionLease(
            tenant_id=lease.tenant_id,
            execution_id=lease.execution_id,
            holder_instance_id=self.application.instance_id,
            lease_epoch=epoch,
            remaining_ms=remaining,
        )

    async def finish(self, lease: ExecutionLease) -> bool:
        if self._named_elsewhere(lease):
            return False
        result = await self.connection.execute(
            self._sql.finish, self._lease_params(lease), priority=Lane.HOLD
        )
        return result.rowcount == 1

    async def save_execution_id_if_absent(self, tenant_id: str, execution_id: str) -> bool:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        return await self.connection.insert_if_absent(
            self._sql.save_execution_id, {"tenant_id": tenant_id, "execution_id": execution_id}
        )
