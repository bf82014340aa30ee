"""`SqlCostLedgerRepository`: spend across instances.

Entries are recorded once by tenant and id (insert-if-absent). Reservations live in one row
per `(scope, tenant, key)` (tenant `''` when none is given); `try_reserve` takes that row's lock in its first statement (an upsert,
so the row exists to be locked), reads the spend under it and adds only what fits.

Statements per operation: `record` one and `total` one, every dialect. `try_reserve`,
one transaction: PostgreSQL, SQLite and MariaDB the locking upsert (which also returns the
reserved amount and the entries' spend), then the addition when it fits; MySQL 8 (no
`RETURNING`) the locking upsert, a locking read of the row and the spend, then the
addition when it fits.

Not serialised: an entry `record`ed while a reservation is decided. The reservation lock
orders reservations of one `(scope, key)` among themselves — their sum never passes the
limit with the entries the deciding transaction saw — but `record` takes no lock (a
replayed spend must never wait on a budget), so an entry committed after that read can
take the total past the limit. Budgets reserve before spending; entries record what was
spent.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.rules import (
    NO_TENANT,
    checked_budget_key,
    checked_cost_entry,
    checked_count,
    checked_int,
)
from agboss_sql.contracts.stores import CostLedgerRepository
from agboss_sql.contracts.types import BudgetScope, CostEntry, CostTotal
from agboss_sql.sql._base import ApplicationClockStore
from agboss_sql.sql.connection import Exec, SqlBuilder, Step
from agboss_sql.sql.schema import cost_entries, cost_reservations

E = cost_entries
R = cost_reservations

_SCOPE_COLUMN = {
    BudgetScope.EXECUTION: "execution_id",
    BudgetScope.TENANT: "tenant_id",
    BudgetScope.APPLICATION: "application",
}
_ENTRY_COLUMNS = (
    "entry_id",
    "tenant_id",
    "execution_id",
    "application",
    "tokens_in",
    "tokens_out",
    "cost_micros",
    "at",
)
_ZERO: sa.ColumnElement[int] = sa.literal_column("0", sa.BigInteger)


def _reservation_row() -> sa.ColumnElement[bool]:
    return sa.and_(
        R.c.scope == sa.bindparam("scope"),
        R.c.tenant_id == sa.bindparam("tenant_id"),
        R.c.key == sa.bindparam("key"),
    )


class ScopeStatements:
    """The statements of one budget scope (its entries are matched by one column), with or
    without a tenant (then the entries are matched by their tenant too)."""

    def __init__(self, b: SqlBuilder, scope: BudgetScope, by_tenant: bool) -> None:
        ops = b.ops
        column = E.c[_SCOPE_COLUMN[scope]]
        match = column == sa.bindparam("key")
        if by_tenant:
            match = sa.and_(match, E.c.tenant_id == sa.bindparam("tenant_id"))
        reserved = sa.select(R.c.reserved_micros).where(_reservation_row()).scalar_subquery()
        totals = sa.select(
            sa.func.coalesce(sa.func.sum(E.c.tokens_in), _ZERO),
            sa.func.coalesce(sa.func.sum(E.c.tokens_out), _ZERO),
            sa.func.coalesce(sa.func.sum(E.c.cost_micros), _ZERO)
            + sa.func.coalesce(reserved, _ZERO),
        ).where(match)
        self.total = totals
        self.total_since = totals.where(E.c.at >= sa.bindparam("since", type_=sa.BigInteger))

        spent = sa.select(sa.func.coalesce(sa.func.sum(E.c.cost_micros), _ZERO)).where(match)
        # The lock: insert the (scope, tenant, key) row, or on a duplicate a no-op update,
        # which locks the row all the same. Whoever comes second waits here, before reading
        # anything.
        lock = ops.upsert(
            R,
            ["scope", "tenant_id", "key"],
            {
                "scope": sa.bindparam("scope"),
                "tenant_id": sa.bindparam("tenant_id"),
                "key": sa.bindparam("key"),
                "reserved_micros": sa.literal(0, sa.BigInteger),
            },
            lambda _new: {"reserved_micros": R.c.reserved_micros},
        )
        self.lock = lock
        # For a database that returns from an upsert (`Capabilities.insert_returning`).
        self.lock_returning: Any = ops.returning(lock, R.c.reserved_micros, spent.scalar_subquery())
        self.read_locked = ops.for_update(
            sa.select(R.c.reserved_micros, spent.scalar_subquery()).where(_reservation_row())
        )


class CostStatements:
    """The cost ledger statements for one dialect."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        self.record = ops.insert_if_absent(E, ["tenant_id", "entry_id"]).values(
            {c: sa.bindparam(c, type_=E.c[c].type) for c in _ENTRY_COLUMNS}
        )
        self.scopes = {
            (scope, by_tenant): ScopeStatements(b, scope, by_tenant)
            for scope in BudgetScope
            for by_tenant in (False, True)
        }
        self.add = (
            sa.update(R)
            .where(_reservation_row())
            .values(
                reserved_micros=R.c.reserved_micros
                + sa.bindparam("amount_micros", type_=sa.BigInteger)
            )
        )


class SqlCostLedgerRepository(ApplicationClockStore[CostStatements], CostLedgerRepository):
    """Spend on SQL: entries recorded once by tenant and id; reservations per
    `(scope, tenant, key)` added under that row's lock, never past the limit.

    A reservation counts in `total` of its scope and key only, as cost (no tokens), and
    whatever `since` is: a reservation is kept as one running amount per key, with no time.
    """

    statements = CostStatements

    async def record(self, entry: CostEntry) -> bool:
        """Insert the entry unless its tenant's `entry_id` is stored (one statement): a
        replayed step does not count twice, and entry ids are per tenant. True when this
        call recorded it."""
        checked_cost_entry(entry)
        params: dict[str, Any] = {
            "entry_id": entry.entry_id,
            "tenant_id": entry.tenant_id,
            "execution_id": entry.execution_id,
            "application": entry.application,
            "tokens_in": entry.tokens_in,
            "tokens_out": entry.tokens_out,
            "cost_micros": entry.cost_micros,
            "at": entry.at,
        }
        return await self.connection.insert_if_absent(self._sql.record, params)

    async def total(
        self,
        scope: BudgetScope,
        key: str,
        since: int | None = None,
        *,
        tenant_id: str | None = None,
    ) -> CostTotal:
        """In one statement: the tokens and cost of the entries whose scope column
        (execution, tenant or application id) is `key` (of `tenant_id` when given; the
        EXECUTION scope needs it) and recorded at or after `since`, plus the cost reserved
        for `(scope, tenant, key)`."""
        value, tenant = checked_budget_key(scope, key, tenant_id)
        statements = self._sql.scopes[(BudgetScope(scope), tenant != NO_TENANT)]
        params: dict[str, Any] = {"scope": value, "key": key, "tenant_id": tenant}
        if since is None:
            statement = statements.total
        else:
            params["since"] = checked_int("since", since)
            statement = statements.total_since
        row = (await self.connection.execute(statement, params)).first()
        assert row is not None  # an aggregate always answers one row
        return CostTotal(int(row[0]), int(row[1]), int(row[2]))

    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        """In one transaction that locks the `(scope, tenant, key)` reservation row first:
        add `amount_micros` to it only while entries + reservations + amount stay within
        `limit_micros`. True when it was added; concurrent reservations of one key never
        pass the limit together."""
        value, tenant = checked_budget_key(scope, key, tenant_id)
        params: dict[str, Any] = {
            "scope": value,
            "key": key,
            "tenant_id": tenant,
            "amount_micros": checked_count("amount_micros", amount_micros),
        }
        limit = checked_count("limit_micros", limit_micros)
        statements = self._sql.scopes[(BudgetScope(scope), tenant != NO_TENANT)]
        return await self.connection.run(
            lambda: self._reserve(statements, params, limit), transaction=True
        )

    def _reserve(
        self, statements: ScopeStatements, params: dict[str, Any], limit: int
    ) -> Step[bool]:
        # Inside the step the server's capabilities are known (MariaDB returns from upserts).
        if self.connection.capabilities.insert_returning:
            row = (yield Exec(statements.lock_returning, params)).first()
        else:
            yield Exec(statements.lock, params)
            row = (yield Exec(statements.read_locked, params)).first()
        assert row is not None  # the upsert made the row, and we hold its lock
        reserved, spent = int(row[0]), int(row[1])
        amount: int = params["amount_micros"]
        if spent + reserved + amount > limit:
            return False
        if amount:
            yield Exec(self._sql.add, params)
        return True
