"""The SQL store set through the interleaving explorer, on the database under test
(`AGBOSS_TEST_DATABASE_URL`, else a temporary SQLite file).

Every schedule starts from an emptied lease, effect, call and business table; each
instance is its own `SqlConnection`, and the store decides by the run's time (a bound
`now`). The depth and the walks are chosen per database so the six worlds of the fencing
stores take at most a few minutes there on two cores (measured; see `BUDGET`), and the four
worlds of the other stores (`lease_closing`, `child_tree`, `pause`, `cost_ledger`) under 20
s together (`OTHER_BUDGET`); `AGBOSS_EXPLORER_DEEP=1` runs the deep search instead
(`DEEP_BUDGET`, `OTHER_DEEP_BUDGET`).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from support.capabilities import embedded
from support.nodes import node_url
from support.rows import counts, fill

from agboss_sql.contracts.clocks import StoreClock
from agboss_sql.lab.business import (
    business_rows,
    committed_business_rows,
    insert_business_row,
)
from agboss_sql.sql.connection import Exec, SqlConnection, Step
from agboss_sql.sql.costs import SqlCostLedgerRepository
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository
from agboss_sql.sql.pauses import SqlPausedExecutionRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository
from agboss_sql.sql.schema import (
    child_executions,
    child_parents,
    cost_entries,
    cost_reservations,
    execution_leases,
    fenced_effect_results,
    outbound_calls,
    paused_executions,
)
from agboss_sql.testing._case import BusinessRows, Seam, StoreFactory
from agboss_sql.testing.explorer import WORLDS, InterleavingFailure, explore

pytestmark = [pytest.mark.database, pytest.mark.asyncio(loop_scope="session")]

BUDGET: dict[str, tuple[int, int]] = {"embedded": (6, 100), "server": (5, 100)}
"""(depth, walks) in the default run, for an embedded database (no round trips to a server:
one level deeper in about the same time) and a server. Since instances also act out of turn
with every context they held, each state has several times the steps it had, so the search
is one level shallower than before for about the same work: the five worlds make 47,864
steps at depth 5 (the four worlds of before made 56,434 at depth 6) and 186,554 at depth 6
(156,947 at depth 7), counted on the in-memory set. Measured on a loaded two-core machine
(load 4-8, other suites running): SQLite at depth 6, 65 s for the five worlds; PostgreSQL
15 at depth 5, 15 min (10-23 schedules/s, where an idle machine runs several times that);
MariaDB 10.11 at depth 5, see docs/figures.md."""

SHALLOWER: dict[str, int] = {"outbound_call_takeover": 1}
"""How many levels less than the budget's depth a world searches: every schedule of the
takeover world first replays its five-step set-up, so at the same depth it sends about
four times the statements of the business-key world (67,000 against 15,600 at depth 5 on
the in-memory set); one level less is 19,000, about what the other call worlds send."""

MUTATION_ENV = "AGBOSS_MUTATION_RUN"
"""Set to 1 by `tox -e mutation` (tools/mutation): `MUTATION_BUDGET`, for each mutant."""

MUTATION_BUDGET: dict[str, tuple[int, int]] = {"embedded": (4, 30), "server": (3, 30)}
"""(depth, walks) with `AGBOSS_MUTATION_RUN=1`: seconds per world on SQLite."""

DEEP_ENV = "AGBOSS_EXPLORER_DEEP"
"""Set to 1 for the deep search (`DEEP_BUDGET`): not in the default run."""

DEEP_BUDGET: dict[str, tuple[int, int]] = {"embedded": (8, 1000), "server": (7, 1000)}
"""(depth, walks) with `AGBOSS_EXPLORER_DEEP=1`: tens of minutes per database."""

OTHER_BUDGET: dict[str, dict[str, tuple[int, int]]] = {
    "lease_closing": {"embedded": (4, 30), "server": (3, 5)},
    "child_tree": {"embedded": (3, 20), "server": (2, 5)},
    "pause": {"embedded": (5, 30), "server": (2, 5)},
    "cost_ledger": {"embedded": (3, 30), "server": (2, 5)},
}
"""(depth, walks) of the worlds of the other stores in the default run: under 20 s for
the four together on each database on a loaded two-core machine (measured; figures in
docs/testing.md). Their whole state space is small (the pause world has 64 states), so
the deep run reaches most of it."""

OTHER_DEEP_BUDGET: dict[str, dict[str, tuple[int, int]]] = {
    "lease_closing": {"embedded": (7, 300), "server": (6, 200)},
    "child_tree": {"embedded": (5, 200), "server": (4, 100)},
    "pause": {"embedded": (8, 300), "server": (8, 200)},
    "cost_ledger": {"embedded": (8, 300), "server": (6, 200)},
}
"""(depth, walks) of the worlds of the other stores with `AGBOSS_EXPLORER_DEEP=1`."""

SEED = 533
_TABLES = (
    execution_leases,
    fenced_effect_results,
    outbound_calls,
    child_executions,
    child_parents,
    paused_executions,
    cost_entries,
    cost_reservations,
    business_rows,
)
_DELETES = [sa.delete(table) for table in _TABLES]
_WRITTEN = sa.select(*(sa.exists().select_from(table).label(table.name) for table in _TABLES))
"""Which of the tables hold a row, in one statement: a reset deletes from those alone."""


class SqlSet:
    """One `SqlConnection` per instance on the database under test, opened on first use."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.connections: dict[str, SqlConnection] = {}

    def connection(self, instance_id: str) -> SqlConnection:
        found = self.connections.get(instance_id)
        if found is None:
            if self.url is None:
                raise RuntimeError("the database fixture has not run")
            found = self.connections[instance_id] = SqlConnection(
                node_url(self.url, len(self.connections))
            )
        return found

    @property
    def dialect(self) -> str:
        return self.connection("instance-1").dialect_name

    @property
    def kind(self) -> str:
        """Which budget the database gets: "embedded" or "server"."""
        return "embedded" if embedded(self.connection("instance-1")) else "server"

    async def reset(self) -> None:
        """Empty the tables the explorer's worlds write, in one step on one connection.

        A schedule writes one to three of the nine tables: asking which hold a row first
        takes two to four round trips instead of nine, which on a server was about half
        of the search's time (every schedule is replayed from an emptied store)."""

        def step() -> Step[None]:
            written = (yield Exec(_WRITTEN, {})).first()
            for holds_rows, statement in zip(written, _DELETES, strict=True):
                if holds_rows:
                    yield Exec(statement, {})

        await self.connection("instance-1").run(step, transaction=False)

    @property
    def business_rows(self) -> BusinessRows:
        async def committed() -> list[str]:
            return await committed_business_rows(self.connection("instance-1"))

        return BusinessRows(insert=insert_business_row, committed=committed)

    def factories(self, *, leases_on_callers_clock: bool = False) -> dict[str, StoreFactory]:
        def make(
            cls: type[Any], *, callers_clock: bool = False, application_clock: bool = False
        ) -> StoreFactory:
            def build(seam: Seam) -> Any:
                clock: Any = StoreClock(seam.clock) if callers_clock else seam.store_clock
                if application_clock:
                    clock = seam.clock
                connection = self.connection(seam.application.instance_id)
                return cls(connection, clock, seam.application)

            return StoreFactory(build)

        return {
            "execution_lease": make(
                SqlExecutionLeaseRepository, callers_clock=leases_on_callers_clock
            ),
            "fenced_effect": make(SqlFencedEffectRepository),
            "outbound_call": make(SqlOutboundCallRepository),
            "child_queue": make(SqlChildExecutionQueueRepository, application_clock=True),
            "paused_execution": make(SqlPausedExecutionRepository, application_clock=True),
            "cost_ledger": make(SqlCostLedgerRepository, application_clock=True),
        }

    async def close(self) -> None:
        for connection in self.connections.values():
            await connection.close()
        self.connections.clear()


SQL = SqlSet()


@pytest_asyncio.fixture(scope="module", loop_scope="session", autouse=True)
async def _database(sql_url: str) -> AsyncIterator[None]:
    SQL.url = sql_url
    yield
    await SQL.close()


async def test_a_reset_empties_every_table_the_worlds_write() -> None:
    assert SQL.url is not None
    for written in (_TABLES, _TABLES[:1], _TABLES[-1:]):
        fill(SQL.url, written)
        await SQL.reset()
        assert counts(SQL.url, _TABLES) == dict.fromkeys((t.name for t in _TABLES), 0), written


@pytest.mark.parametrize("world", list(WORLDS))
async def test_the_sql_set_passes_every_world(world: str) -> None:
    deep = os.environ.get(DEEP_ENV) == "1"
    budget = MUTATION_BUDGET if os.environ.get(MUTATION_ENV) == "1" else BUDGET
    if world in OTHER_BUDGET:
        depth, walks = (OTHER_DEEP_BUDGET if deep else OTHER_BUDGET)[world][SQL.kind]
    else:
        depth, walks = (DEEP_BUDGET if deep else budget)[SQL.kind]
        depth -= SHALLOWER.get(world, 0)
    started = time.perf_counter()
    report = await explore(
        SQL.factories(),
        world=world,
        depth=depth,
        walks=walks,
        seed=SEED,
        time_limit=4 * 3600 if deep else 480,
        reset=SQL.reset,
        business_rows=SQL.business_rows,
        name=f"SQL on {SQL.dialect}",
    )
    print(f"{report.summary()} [{time.perf_counter() - started:.1f} s in all]")
    assert report.skipped is None
    assert report.states > 10 and report.schedules >= report.states, report.summary()
    assert report.walk_steps == walks * 30
    assert report.skews_searched == 1
    assert report.race_orders > 0


async def test_a_sql_lease_store_on_the_callers_clock_gives_two_live_holders() -> None:
    with pytest.raises(InterleavingFailure) as caught:
        await explore(
            SQL.factories(leases_on_callers_clock=True),
            world="lease",
            depth=2,
            walks=0,
            reset=SQL.reset,
            name=f"SQL on {SQL.dialect}, leases on the caller's clock",
        )
    assert caught.value.invariant == "one-live-holder"
    assert caught.value.schedule == (
        "instance-1 acquire tree-1 → epoch 1, 30000 ms left",
        "instance-2 acquire tree-1 → epoch 2, 30000 ms left, taken over from instance-1 at 1",
    )
