"""`SqlCostLedgerRepository` on the database under test: spend across instances."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from support.capabilities import servers_differ_in_upsert_returning
from support.sql import plan_of, statements

from agboss_sql.contracts.clocks import VirtualClock
from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.types import ApplicationContext, BudgetScope, CostEntry, CostTotal
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.costs import SqlCostLedgerRepository
from agboss_sql.sql.schema import cost_reservations

START = 1_700_000_000_000
EXECUTION = BudgetScope.EXECUTION
TENANT = BudgetScope.TENANT
APPLICATION = BudgetScope.APPLICATION
TA = "tenant-a"


_BOTH_UPSERT_PATHS = servers_differ_in_upsert_returning(
    os.environ.get("AGBOSS_TEST_DATABASE_URL") or "sqlite://"
)


@pytest.fixture(params=["native", "mysql8"] if _BOTH_UPSERT_PATHS else ["native"])
def upsert_returns(request: pytest.FixtureRequest) -> bool | None:
    """How `try_reserve` reads the locked row: as the dialect does ("native"), and on the
    MySQL family also as MySQL 8 must (no RETURNING: a locking read after the upsert), so
    MariaDB runs both paths."""
    return False if request.param == "mysql8" else None


@pytest.fixture
async def make_store(
    sql: SqlConnection, upsert_returns: bool | None
) -> AsyncIterator[Callable[..., SqlCostLedgerRepository]]:
    def make(
        connection: SqlConnection | None = None, instance: str = "instance-1"
    ) -> SqlCostLedgerRepository:
        store = SqlCostLedgerRepository(
            connection or sql, VirtualClock(START), ApplicationContext(instance)
        )
        if upsert_returns is not None:
            connection = connection or sql
            connection.pin_capabilities(
                dataclasses.replace(connection.capabilities, insert_returning=upsert_returns)
            )
        return store

    yield make


def entry(
    entry_id: str,
    *,
    tenant: str = "tenant-a",
    execution: str = "exec-1",
    application: str = "app-1",
    tokens_in: int = 10,
    tokens_out: int = 20,
    cost: int = 100,
    at: int = START,
) -> CostEntry:
    return CostEntry(entry_id, tenant, execution, application, tokens_in, tokens_out, cost, at)


def within_limit(granted: list[int], reserved: int, limit: int) -> None:
    """The invariant of concurrent reservations: what was granted is exactly what the store
    holds reserved, and never more than the limit."""
    assert sum(granted) == reserved, f"granted {sum(granted)} but {reserved} reserved"
    assert reserved <= limit, f"{reserved} reserved past the limit {limit}"


# --- record and total -------------------------------------------------------------------


async def test_record_counts_an_entry_once(
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    store = make_store()
    assert await store.record(entry("e-1")) is True
    assert await store.record(entry("e-1")) is False
    # A replay with other numbers is still the same entry: not counted again.
    assert await store.record(entry("e-1", cost=999, tokens_in=999)) is False
    assert await store.total(EXECUTION, "exec-1", tenant_id=TA) == CostTotal(10, 20, 100)


async def test_total_sums_by_the_scopes_column(
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    store = make_store()
    await store.record(entry("e-1", tenant="t-1", execution="x-1", application="app-1", cost=1))
    await store.record(entry("e-2", tenant="t-1", execution="x-2", application="app-1", cost=2))
    await store.record(entry("e-3", tenant="t-2", execution="x-3", application="app-1", cost=4))
    await store.record(entry("e-4", tenant="t-2", execution="x-3", application="app-2", cost=8))
    assert (await store.total(EXECUTION, "x-1", tenant_id="t-1")).cost_micros == 1
    assert (await store.total(EXECUTION, "x-3", tenant_id="t-2")).cost_micros == 12
    assert (await store.total(TENANT, "t-1")).cost_micros == 3
    assert (await store.total(TENANT, "t-2")).cost_micros == 12
    assert (await store.total(APPLICATION, "app-1")).cost_micros == 7
    assert await store.total(APPLICATION, "app-1") == CostTotal(30, 60, 7)
    # A key matches the scope's own column only: "x-1" is no tenant.
    assert await store.total(TENANT, "x-1") == CostTotal()
    assert await store.total(EXECUTION, "nobody", tenant_id="t-1") == CostTotal(0, 0, 0)


async def test_total_since_counts_entries_at_or_after_it(
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    store = make_store()
    for i, at in enumerate((START - 1, START, START + 1)):
        await store.record(entry(f"e-{i}", at=at, cost=10**i, tokens_in=1, tokens_out=2))
    assert await store.total(EXECUTION, "exec-1", since=START, tenant_id=TA) == CostTotal(2, 4, 110)
    assert await store.total(EXECUTION, "exec-1", since=START + 2, tenant_id=TA) == CostTotal()
    assert await store.total(EXECUTION, "exec-1", tenant_id=TA) == CostTotal(3, 6, 111)


async def test_reservations_add_to_their_scope_and_keys_cost_only(
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    store = make_store()
    await store.record(entry("e-1", tenant="k", execution="k", application="k", cost=5))
    assert await store.try_reserve(TENANT, "k", 40, 1_000) is True
    assert await store.total(TENANT, "k") == CostTotal(10, 20, 45)
    # The same key of another scope has its own reservations.
    assert await store.total(EXECUTION, "k", tenant_id="k") == CostTotal(10, 20, 5)
    assert await store.total(APPLICATION, "k") == CostTotal(10, 20, 5)
    # A reservation has no time: it counts whatever `since` is.
    assert await store.total(TENANT, "k", since=START + 1) == CostTotal(0, 0, 40)


async def test_try_reserve_adds_only_while_within_the_limit(
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    store = make_store()
    await store.record(entry("e-1", cost=30))
    assert await store.try_reserve(EXECUTION, "exec-1", 50, 100, tenant_id=TA) is True  # 80
    assert (
        await store.try_reserve(EXECUTION, "exec-1", 21, 100, tenant_id=TA) is False
    )  # would be 101
    assert (
        await store.total(EXECUTION, "exec-1", tenant_id=TA)
    ).cost_micros == 80  # refused: not added
    assert (
        await store.try_reserve(EXECUTION, "exec-1", 20, 100, tenant_id=TA) is True
    )  # exactly 100
    assert await store.try_reserve(EXECUTION, "exec-1", 1, 100, tenant_id=TA) is False
    assert await store.try_reserve(EXECUTION, "exec-1", 0, 100, tenant_id=TA) is True
    assert (
        await store.try_reserve(EXECUTION, "exec-1", 0, 99, tenant_id=TA) is False
    )  # already past 99
    assert (
        await store.try_reserve(EXECUTION, "exec-1", 50, 200, tenant_id=TA) is True
    )  # a higher limit
    assert (await store.total(EXECUTION, "exec-1", tenant_id=TA)).cost_micros == 150


async def test_a_refused_first_reservation_reserves_nothing(
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    store = make_store()
    assert await store.try_reserve(APPLICATION, "app-1", 101, 100) is False
    assert await store.total(APPLICATION, "app-1") == CostTotal()
    assert await store.try_reserve(APPLICATION, "app-1", 100, 100) is True


async def test_entries_recorded_later_count_against_the_limit(
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    store = make_store()
    assert await store.try_reserve(TENANT, "tenant-a", 60, 100) is True
    await store.record(entry("e-1", cost=30))
    assert await store.try_reserve(TENANT, "tenant-a", 11, 100) is False
    assert await store.try_reserve(TENANT, "tenant-a", 10, 100) is True


async def test_totals_are_served_by_the_scopes_index(
    sql: SqlConnection, make_store: Callable[..., SqlCostLedgerRepository]
) -> None:
    store = make_store()
    for scope, column in [
        (EXECUTION, "execution_id"),
        (TENANT, "tenant_id"),
        (APPLICATION, "application"),
    ]:
        plan = await plan_of(
            sql,
            store._sql.scopes[(scope, False)].total_since,
            {"scope": scope.value, "key": "k", "since": START, "tenant_id": ""},
        )
        assert f"ix_agboss_cost_entries_{column}_at" in plan, plan


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.record(entry("")),
        lambda s: s.record(entry("e", tenant="")),
        lambda s: s.record(entry("e", execution="x" * 256)),
        lambda s: s.record(entry("e", application="")),
        lambda s: s.total(TENANT, ""),
        lambda s: s.try_reserve(TENANT, "", 1, 10),
        lambda s: s.try_reserve(EXECUTION, "k" * 256, 1, 10, tenant_id=TA),
        lambda s: s.try_reserve(EXECUTION, "k", 1, 10),
        lambda s: s.total(EXECUTION, "k"),
    ],
)
async def test_identifiers_are_checked_before_any_statement(
    sql: SqlConnection,
    make_store: Callable[..., SqlCostLedgerRepository],
    call: Callable[[Any], Any],
) -> None:
    store = make_store()
    with statements(sql) as sent:
        with pytest.raises(InvalidIdentifierError):
            await call(store)
    assert sent == []


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.try_reserve(TENANT, "k", -1, 10),
        lambda s: s.try_reserve(TENANT, "k", 1, -10),
        lambda s: s.try_reserve(TENANT, "k", 1.5, 10),
        lambda s: s.try_reserve("budget", "k", 1, 10),
        lambda s: s.total("budget", "k"),
        lambda s: s.record(dataclasses.replace(entry("e"), cost_micros="100")),
        lambda s: s.record(dataclasses.replace(entry("e"), at=True)),
    ],
)
async def test_values_are_checked_before_any_statement(
    sql: SqlConnection,
    make_store: Callable[..., SqlCostLedgerRepository],
    call: Callable[[Any], Any],
) -> None:
    store = make_store()
    with statements(sql) as sent:
        with pytest.raises(ValueError):
            await call(store)
    assert sent == []


async def test_each_operation_sends_the_fewest_statements(
    sql: SqlConnection, make_store: Callable[..., SqlCostLedgerRepository]
) -> None:
    store = make_store()
    await store.try_reserve(TENANT, "warm-up", 0, 0)  # learns the server flavour first
    with statements(sql) as sent:
        await store.record(entry("e-1"))
    assert len(sent) == 1, sent
    with statements(sql) as sent:
        await store.total(TENANT, "tenant-a")
    assert len(sent) == 1, sent
    with statements(sql) as sent:
        await store.total(TENANT, "tenant-a", since=START)
    assert len(sent) == 1, sent

    # BEGIN, the locking upsert (with a read of the row when it cannot return it), the
    # addition, COMMIT; refused: no addition.
    reads = 1 if store.connection.capabilities.insert_returning else 2
    with statements(sql) as sent:
        assert await store.try_reserve(TENANT, "tenant-a", 10, 1_000) is True
    assert len(sent) == 2 + reads + 1, sent
    assert "BEGIN" in sent[0] and "INSERT" in sent[1] and sent[-1] == "COMMIT"
    with statements(sql) as sent:
        assert await store.try_reserve(TENANT, "tenant-a", 10_000, 1_000) is False
    assert len(sent) == 2 + reads, sent


# --- real concurrency: several connections are several instances -----------------------


async def test_fifty_concurrent_reservations_never_pass_the_limit(
    sql: SqlConnection,
    new_connection: Callable[[], SqlConnection],
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    stores = [make_store()] + [make_store(new_connection(), f"i-{i}") for i in range(4)]
    await stores[0].record(entry("spent", execution="exec-1", cost=10))
    for round_number, (scope, key) in enumerate(
        [(EXECUTION, "exec-1"), (TENANT, "tenant-z"), (APPLICATION, "app-z")]
    ):
        spent = 10 if key == "exec-1" else 0
        limit = 100
        outcomes = await asyncio.gather(
            *(
                stores[i % len(stores)].try_reserve(scope, key, 7, limit, tenant_id=TA)
                for i in range(50)
            )
        )
        granted = [7 for ok in outcomes if ok]
        reserved = (await stores[0].total(scope, key, tenant_id=TA)).cost_micros - spent
        within_limit(granted, reserved, limit - spent)
        # And no spurious refusal: a reservation is refused only when it cannot fit.
        assert len(granted) == (limit - spent) // 7, f"round {round_number}: {outcomes}"


async def test_concurrent_reservations_of_mixed_amounts_fill_the_limit_exactly(
    sql: SqlConnection,
    new_connection: Callable[[], SqlConnection],
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    stores = [make_store()] + [make_store(new_connection(), f"i-{i}") for i in range(4)]
    amounts = [(i * 37) % 23 + 1 for i in range(50)]
    limit = 250
    outcomes = await asyncio.gather(
        *(
            stores[i % len(stores)].try_reserve(TENANT, "tenant-m", amount, limit)
            for i, amount in enumerate(amounts)
        )
    )
    granted = [a for a, ok in zip(amounts, outcomes, strict=True) if ok]
    reserved = (await stores[0].total(TENANT, "tenant-m")).cost_micros
    within_limit(granted, reserved, limit)
    # Totals only grow, so every refused amount must still not fit at the end.
    refused = [a for a, ok in zip(amounts, outcomes, strict=True) if not ok]
    assert all(reserved + a > limit for a in refused), (reserved, refused)


async def test_concurrent_records_of_one_entry_count_once(
    sql: SqlConnection,
    new_connection: Callable[[], SqlConnection],
    make_store: Callable[..., SqlCostLedgerRepository],
) -> None:
    stores = [make_store()] + [make_store(new_connection(), f"i-{i}") for i in range(3)]
    for round_number in range(10):
        outcomes = await asyncio.gather(
            *(
                stores[i % 4].record(entry(f"e-{round_number}", execution=f"x-{round_number}"))
                for i in range(12)
            )
        )
        assert outcomes.count(True) == 1
        total = await stores[0].total(EXECUTION, f"x-{round_number}", tenant_id=TA)
        assert total == CostTotal(10, 20, 100)


# --- the tests bite: a check-then-add reservation passes the limit ----------------------

R = cost_reservations


class CheckThenAddReserve(SqlCostLedgerRepository):
    """Broken on purpose: reads the total without any lock, then adds without a condition."""

    def __init__(self, *args: Any, between: Callable[[], Any]) -> None:
        super().__init__(*args)
        self.between = between
        ops = self.connection.ops
        self._add_any = ops.upsert(
            R,
            ["scope", "tenant_id", "key"],
            {
                "scope": sa.bindparam("scope"),
                "tenant_id": sa.bindparam("tenant_id"),
                "key": sa.bindparam("key"),
                "reserved_micros": sa.bindparam("amount", type_=sa.BigInteger),
            },
            lambda new: {"reserved_micros": R.c.reserved_micros + new.reserved_micros},
        )

    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        spent = (await self.total(scope, key, tenant_id=tenant_id)).cost_micros
        await self.between()
        if spent + amount_micros > limit_micros:
            return False
        params = {"scope": BudgetScope(scope).value, "key": key, "amount": amount_micros}
        await self.connection.execute(self._add_any, {**params, "tenant_id": tenant_id or ""})
        return True


async def test_a_check_then_add_reservation_passes_the_limit(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    # Forced order on two connections: both checks, then both additions.
    both_checked = asyncio.Barrier(2)
    broken = [
        CheckThenAddReserve(
            connection, VirtualClock(START), ApplicationContext(f"i-{i}"), between=both_checked.wait
        )
        for i, connection in enumerate((sql, new_connection()))
    ]
    outcomes = await asyncio.gather(
        broken[0].try_reserve(TENANT, "tenant-a", 60, 100),
        broken[1].try_reserve(TENANT, "tenant-a", 60, 100),
    )
    assert outcomes == [True, True]
    reserved = (await broken[0].total(TENANT, "tenant-a")).cost_micros
    assert reserved == 120
    with pytest.raises(AssertionError, match="past the limit"):
        within_limit([60, 60], reserved, 100)

    # The real store, sent the same two at once from two connections: one fits.
    real = [
        SqlCostLedgerRepository(c, VirtualClock(START), ApplicationContext(f"i-{i}"))
        for i, c in enumerate((sql, new_connection()))
    ]
    outcomes = await asyncio.gather(
        real[0].try_reserve(TENANT, "tenant-b", 60, 100),
        real[1].try_reserve(TENANT, "tenant-b", 60, 100),
    )
    assert sorted(outcomes) == [False, True]
    within_limit([60], (await real[0].total(TENANT, "tenant-b")).cost_micros, 100)


async def test_backend_and_ping(
    sql: SqlConnection, make_store: Callable[..., SqlCostLedgerRepository]
) -> None:
    store = make_store()
    assert store.backend == sql.backend
    await store.ping()
