"""Contract suite of `CostLedgerRepository` (docs/contracts.md): spend across instances.

An entry counts once by its id (a replayed step does not count twice), totals add up per
execution, tenant and application (and from a time on), and a reservation is added only
while the scope's total stays within its limit — atomically, whichever instances race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.stores import CostLedgerRepository
from agboss_sql.contracts.types import BudgetScope, CostEntry, CostTotal
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._limits import limit_cases

CONTRACT = "cost_ledger"
EXECUTION = BudgetScope.EXECUTION
TENANT = BudgetScope.TENANT
T1 = "tenant-1"
APPLICATION = BudgetScope.APPLICATION


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _ledger(ctx: CaseContext, instance: int = 0) -> CostLedgerRepository:
    store: CostLedgerRepository = ctx.store(CONTRACT, instance)
    return store


def _entry(
    entry_id: str,
    at: int,
    *,
    tenant: str = "tenant-1",
    execution: str = "exec-1",
    application: str = "support",
    tokens_in: int = 100,
    tokens_out: int = 10,
    cost: int = 1_000,
) -> CostEntry:
    return CostEntry(entry_id, tenant, execution, application, tokens_in, tokens_out, cost, at)


async def records_an_entry_once(ctx: CaseContext) -> None:
    """A second `record` of one entry id — a replayed step, on either instance, even with
    other amounts — returns False and does not count."""
    now = ctx.clock.now()
    first = await _ledger(ctx, 0).record(_entry("step-1:call-1", now))
    _expect(first, "record-once", "the first record returned False")
    again = await _ledger(ctx, 1).record(_entry("step-1:call-1", now + 5, cost=9_999))
    _expect(not again, "record-once", "a replayed entry was recorded again")
    total = await _ledger(ctx, 1).total(EXECUTION, "exec-1", tenant_id=T1)
    _expect(
        total == CostTotal(100, 10, 1_000),
        "record-once",
        f"after a replay the execution's total is {total}, expected CostTotal(100, 10, 1000)",
    )


async def records_an_entry_once_under_concurrent_replays(ctx: CaseContext) -> None:
    """Ten records of one entry id at once through both instances: one returns True and
    the entry counts once."""
    now = ctx.clock.now()
    for round_ in range(3):
        entry = _entry(f"entry-{round_}", now, cost=500)
        done = await asyncio.gather(*(_ledger(ctx, i % 2).record(entry) for i in range(10)))
        _expect(
            done.count(True) == 1,
            "record-once",
            f"round {round_ + 1}: {done.count(True)} of 10 concurrent records returned True",
        )
    total = await _ledger(ctx, 0).total(EXECUTION, "exec-1", tenant_id=T1)
    _expect(
        total == CostTotal(300, 30, 1_500),
        "record-once",
        f"three entries recorded ten times each total {total}, expected CostTotal(300, 30, 1500)",
    )


async def totals_spend_per_scope(ctx: CaseContext) -> None:
    """`total` adds tokens in, tokens out and cost of the entries of the execution, the
    tenant or the application named; an unknown key totals zero."""
    now = ctx.clock.now()
    entries = [
        _entry(
            "e-1",
            now,
            tenant="t-1",
            execution="x-1",
            application="app-1",
            tokens_in=1,
            tokens_out=2,
            cost=3,
        ),
        _entry(
            "e-2",
            now,
            tenant="t-1",
            execution="x-1",
            application="app-1",
            tokens_in=10,
            tokens_out=20,
            cost=30,
        ),
        _entry(
            "e-3",
            now,
            tenant="t-1",
            execution="x-2",
            application="app-2",
            tokens_in=100,
            tokens_out=200,
            cost=300,
        ),
        _entry(
            "e-4",
            now,
            tenant="t-2",
            execution="x-3",
            application="app-1",
            tokens_in=1000,
            tokens_out=2000,
            cost=3000,
        ),
    ]
    for i, entry in enumerate(entries):
        await _ledger(ctx, i % 2).record(entry)
    want = {
        (EXECUTION, "x-1"): CostTotal(11, 22, 33),
        (EXECUTION, "x-2"): CostTotal(100, 200, 300),
        (TENANT, "t-1"): CostTotal(111, 222, 333),
        (TENANT, "t-2"): CostTotal(1000, 2000, 3000),
        (APPLICATION, "app-1"): CostTotal(1011, 2022, 3033),
        (APPLICATION, "app-2"): CostTotal(100, 200, 300),
        (EXECUTION, "t-1"): CostTotal(),
        (TENANT, "x-1"): CostTotal(),
        (APPLICATION, "nobody"): CostTotal(),
    }
    for (scope, key), total in want.items():
        tenant = "t-1" if scope is EXECUTION else None
        got = await _ledger(ctx, 1).total(scope, key, tenant_id=tenant)
        _expect(got == total, "scope-total", f"total({scope.value}, {key}) = {got}, want {total}")


async def totals_spend_recorded_at_or_after_since(ctx: CaseContext) -> None:
    """`total(..., since)` counts the entries recorded at or after `since` (by the entry's
    `at`), in every scope."""
    now = ctx.clock.now()
    for i, offset in enumerate([0, 1_000, 2_000, 3_000]):
        await _ledger(ctx, i % 2).record(_entry(f"e-{i}", now + offset, cost=10**i))
    for scope, key in [(EXECUTION, "exec-1"), (TENANT, "tenant-1"), (APPLICATION, "support")]:
        for since, cost in [
            (None, 1111),
            (now, 1111),
            (now + 1, 1110),
            (now + 2_000, 1100),
            (now + 2_001, 1000),
            (now + 3_001, 0),
        ]:
            tenant = T1 if scope is EXECUTION else None
            got = await _ledger(ctx, 0).total(scope, key, since, tenant_id=tenant)
            _expect(
                got.cost_micros == cost,
                "since",
                f"total({scope.value}, {key}, since={since}) counts {got.cost_micros}, want {cost}",
            )


async def reserves_only_within_the_limit(ctx: CaseContext) -> None:
    """`try_reserve` adds while the total stays within the limit (reaching it exactly is
    within), refuses and adds nothing past it, and counts in `total`."""
    a, b = _ledger(ctx, 0), _ledger(ctx, 1)
    _expect(await a.try_reserve(TENANT, "tenant-1", 600, 1_000), "reserve-within-limit", "600")
    _expect(
        not await b.try_reserve(TENANT, "tenant-1", 401, 1_000),
        "reserve-within-limit",
        "a reservation past the limit was added (600 + 401 > 1000)",
    )
    _expect(
        await b.try_reserve(TENANT, "tenant-1", 400, 1_000),
        "reserve-within-limit",
        "a reservation reaching the limit exactly was refused (600 + 400 = 1000)",
    )
    _expect(
        not await a.try_reserve(TENANT, "tenant-1", 1, 1_000),
        "reserve-within-limit",
        "a reservation past a full limit was added",
    )
    total = await a.total(TENANT, "tenant-1")
    _expect(total.cost_micros == 1_000, "reserve-within-limit", f"total after reserving: {total}")
    _expect(
        await a.try_reserve(TENANT, "tenant-1", 500, 2_000),
        "reserve-within-limit",
        "a higher limit did not make room",
    )


async def never_reserves_past_the_limit_under_concurrent_reservations(ctx: CaseContext) -> None:
    """Fifty reservations at once through both instances: the ones that win fit the limit
    exactly, and the total says so."""
    amounts = [100 + 10 * (i % 5) for i in range(50)]
    done = await asyncio.gather(
        *(
            _ledger(ctx, i % 2).try_reserve(EXECUTION, "exec-1", n, 2_000, tenant_id=T1)
            for i, n in enumerate(amounts)
        )
    )
    reserved = sum(n for n, ok in zip(amounts, done, strict=True) if ok)
    total = await _ledger(ctx, 0).total(EXECUTION, "exec-1", tenant_id=T1)
    _expect(
        reserved <= 2_000 and total.cost_micros == reserved,
        "reserve-within-limit",
        f"{done.count(True)} of 50 concurrent reservations won {reserved} against a limit of "
        f"2000; the total reads {total.cost_micros}",
    )
    _expect(
        reserved > 2_000 - max(amounts),
        "reserve-within-limit",
        f"only {reserved} of 2000 reserved by 50 reservations of at most {max(amounts)}: one "
        "was refused while it fit",
    )


async def counts_recorded_spend_against_a_reservation(ctx: CaseContext) -> None:
    """A reservation's limit counts what was recorded in the scope too: the total, not the
    reservations alone."""
    now = ctx.clock.now()
    await _ledger(ctx, 0).record(_entry("e-1", now, cost=600))
    over = await _ledger(ctx, 1).try_reserve(EXECUTION, "exec-1", 500, 1_000, tenant_id=T1)
    _expect(not over, "reserve-counts-spend", "600 recorded + 500 reserved passed a 1000 limit")
    fits = await _ledger(ctx, 1).try_reserve(EXECUTION, "exec-1", 400, 1_000, tenant_id=T1)
    _expect(fits, "reserve-counts-spend", "600 recorded + 400 reserved was refused at 1000")
    total = await _ledger(ctx, 0).total(EXECUTION, "exec-1", tenant_id=T1)
    _expect(total.cost_micros == 1_000, "reserve-counts-spend", f"total: {total}")


async def keeps_a_reservation_in_its_own_scope_and_key(ctx: CaseContext) -> None:
    """A reservation counts in the total of its scope and key only."""
    a = _ledger(ctx, 0)
    _expect(
        await a.try_reserve(EXECUTION, "exec-1", 700, 1_000, tenant_id=T1), "scope-total", "refused"
    )
    for scope, key in [(TENANT, "exec-1"), (APPLICATION, "exec-1"), (EXECUTION, "exec-2")]:
        tenant = T1 if scope is EXECUTION else None
        got = await _ledger(ctx, 1).total(scope, key, tenant_id=tenant)
        _expect(got == CostTotal(), "scope-total", f"total({scope.value}, {key}) = {got}")
        ok = await _ledger(ctx, 1).try_reserve(scope, key, 1_000, 1_000, tenant_id=tenant)
        _expect(ok, "scope-total", f"{scope.value} {key} saw exec-1's reservation")


async def keeps_entry_ids_per_tenant(ctx: CaseContext) -> None:
    """Entry ids are per tenant: another tenant's entry under an id one tenant used first is
    recorded (and counted), not dropped as a replay."""
    now = ctx.clock.now()
    a = await _ledger(ctx, 0).record(_entry("call-1", now, tenant="t-1", cost=10))
    b = await _ledger(ctx, 1).record(_entry("call-1", now, tenant="t-2", cost=20))
    _expect(a, "tenant-apart", "the first tenant's entry was not recorded")
    _expect(b, "tenant-apart", "another tenant's entry under the same id was dropped")
    again = await _ledger(ctx, 1).record(_entry("call-1", now + 1, tenant="t-2", cost=99))
    _expect(not again, "record-once", "a tenant's replayed entry was recorded again")
    for tenant, cost in (("t-1", 10), ("t-2", 20)):
        got = await _ledger(ctx, 0).total(TENANT, tenant)
        _expect(got.cost_micros == cost, "tenant-apart", f"{tenant}'s total is {got}")


async def keeps_an_executions_spend_in_its_tenant(ctx: CaseContext) -> None:
    """The EXECUTION scope is per tenant: two tenants' executions of one id total and
    reserve apart, and a total or reservation without the tenant is refused
    (`InvalidIdentifierError`) with nothing reserved."""
    now = ctx.clock.now()
    await _ledger(ctx, 0).record(_entry("e-1", now, tenant="t-1", execution="x-1", cost=300))
    await _ledger(ctx, 1).record(_entry("e-2", now, tenant="t-2", execution="x-1", cost=500))
    for tenant, cost in (("t-1", 300), ("t-2", 500)):
        got = await _ledger(ctx, 0).total(EXECUTION, "x-1", tenant_id=tenant)
        _expect(got.cost_micros == cost, "tenant-apart", f"{tenant}'s x-1 totals {got}")
    fits = await _ledger(ctx, 1).try_reserve(EXECUTION, "x-1", 600, 1_000, tenant_id="t-1")
    _expect(fits, "tenant-apart", "t-1's reservation counted t-2's spend of x-1")
    over = await _ledger(ctx, 1).try_reserve(EXECUTION, "x-1", 600, 1_000, tenant_id="t-2")
    _expect(not over, "reserve-within-limit", "t-2's 500 + 600 passed a 1000 limit")
    got = await _ledger(ctx, 0).total(EXECUTION, "x-1", tenant_id="t-2")
    _expect(got.cost_micros == 500, "tenant-apart", f"t-1's reservation counts in t-2's: {got}")
    for what, call in (
        ("total", lambda: _ledger(ctx, 0).total(EXECUTION, "x-1")),
        ("try_reserve", lambda: _ledger(ctx, 0).try_reserve(EXECUTION, "x-1", 1, 10**9)),
    ):
        try:
            await call()
        except InvalidIdentifierError:
            pass
        else:
            _expect(False, "tenant-apart", f"{what} of an execution without its tenant answered")
    got = await _ledger(ctx, 0).total(EXECUTION, "x-1", tenant_id="t-1")
    _expect(got.cost_micros == 900, "tenant-apart", f"a refused reservation counted: {got}")


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("keeps entry ids per tenant", keeps_entry_ids_per_tenant),
    ("keeps an execution's spend in its tenant", keeps_an_executions_spend_in_its_tenant),
    ("records an entry once", records_an_entry_once),
    (
        "records an entry once under concurrent replays",
        records_an_entry_once_under_concurrent_replays,
    ),
    ("totals spend per execution, tenant and application", totals_spend_per_scope),
    ("totals spend recorded at or after since", totals_spend_recorded_at_or_after_since),
    ("reserves only within the limit", reserves_only_within_the_limit),
    (
        "never reserves past the limit under 50 concurrent reservations",
        never_reserves_past_the_limit_under_concurrent_reservations,
    ),
    (
        "counts recorded spend against a reservation",
        counts_recorded_spend_against_a_reservation,
    ),
    (
        "keeps a reservation in its own scope and key",
        keeps_a_reservation_in_its_own_scope_and_key,
    ),
]


def cases() -> list[Case]:
    """The cost ledger's cases (none is a fencing case: the ledger is not fenced)."""
    return [Case(CONTRACT, name, run) for name, run in CASES] + limit_cases(CONTRACT)


__all__ = ["CONTRACT", "cases"]
