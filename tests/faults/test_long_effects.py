"""Long fenced effects, the same on every database (docs/limits.md, "Long effects"), with
the effect in a process of its own.

- An effect that outlasts its lease holds the lease row to its end: a take meanwhile
  waits `lock_ms` and fails typed (`StoreTimeoutError`, `what="lock"`), even once the
  lease is over by the database's time; the effect commits; its holder's keeper loses the
  lease at the lease's end; the next take takes it over and replays the effect's result.
- An effect whose work leaves its transaction idle past `max(statement_ms, lock_ms)` is
  ended as a server ends it (SQLite: by the store): `StoreUnavailableError`, nothing
  committed, the business row included. A shorter idle commits.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from fault_support import fault_url

from agboss_sql.contracts import (
    ApplicationContext,
    LeaseHolder,
    StoreClock,
    StoreTimeoutError,
)
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.types import ExecutionContext, StepRef
from agboss_sql.lab.faults.suite import reset_database
from agboss_sql.sql import Timeouts
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import execution_leases as L

pytestmark = [pytest.mark.database, pytest.mark.faults]

TENANT = "tenant-long"
EXECUTION = "long-effect"
LEASE_MS = 3_000
BOUND_S = 30.0
"""How long any step of these tests may wait for another process (it fails past it)."""

# The holder: takes the lease with a keeper, runs one fenced effect that says "holding"
# from its work (the fence passed: the row is locked) and goes on when stdin says so; then
# answers what its keeper and its effect came to.
HOLDER = """
import asyncio, json, sys
import sqlalchemy as sa
from agboss_sql.contracts import ApplicationContext, StoreClock, SystemClock
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.types import ExecutionContext, StepRef
from agboss_sql.runtime import LeaseKeeper
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository

async def main(url, tenant, execution, lease_ms):
    connection = SqlConnection(url)
    app = ApplicationContext("holder")
    leases = SqlExecutionLeaseRepository(connection, StoreClock(), app)
    effects = SqlFencedEffectRepository(connection, StoreClock(), app)
    keeper = LeaseKeeper(leases, None, SystemClock(), lease_ms=int(lease_ms))
    lease = await keeper.take(tenant, execution)
    keeper.start()
    step = StepRef(execution, "long", "long")
    key = fenced_effect_key_of(ExecutionContext(tenant, execution, execution, lease, step), "long")
    async with keeper.effect() as held:
        async def work(tx):
            held()
            await tx.execute(sa.text("SELECT 1"))
            print("holding", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
            await tx.execute(sa.text("SELECT 1"))
            return {"done": True}
        result = await effects.save_result_if_absent(key, work)
    print(json.dumps({"effect": result.value, "lost": keeper.lost,
                      "reason": str(keeper.signal.reason)}), flush=True)
    await keeper.stop()
    await connection.close()

asyncio.run(main(*sys.argv[1:5]))
"""


@pytest.fixture
async def connection() -> AsyncIterator[SqlConnection]:
    url = fault_url()
    reset_database(url)
    made = SqlConnection(url, timeouts=Timeouts(lock_ms=1_000, statement_ms=5_000))
    yield made
    await made.close()


async def _expired_by_database_time(connection: SqlConnection) -> None:
    """Wait (bounded, polling the database's own clock) until the lease row's expiry is
    past by the database's time."""
    ops = connection.ops
    read = sa.select(L.c.expires_at, ops.now_ms()).where(
        L.c.tenant_id == TENANT, L.c.execution_id == EXECUTION
    )
    for _ in range(int(BOUND_S / 0.1)):
        row = (await connection.execute(read)).first()
        if row is not None and row[0] < row[1]:
            return
        await asyncio.sleep(0.1)  # a poll of the database's clock, not a synchronisation
    raise AssertionError("the lease never ran out by the database's time")


async def test_an_effect_longer_than_its_lease_commits_and_its_holder_loses_the_lease(
    connection: SqlConnection,
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, fault_url(), TENANT, EXECUTION, str(LEASE_MS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdin is not None and holder.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), BOUND_S)
        assert line.strip() == "holding"
        await _expired_by_database_time(connection)
        other = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("other"))
        # Over by the database's time, but its row is locked by the holder's effect.
        with pytest.raises(StoreTimeoutError) as blocked:
            await other.acquire(TENANT, EXECUTION, LEASE_MS)
        assert blocked.value.what == "lock"
        holder.stdin.write("go\n")
        holder.stdin.flush()
        out, _ = await asyncio.wait_for(asyncio.to_thread(holder.communicate), BOUND_S)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer["effect"] == {"done": True}
    assert answer["lost"], answer
    assert "its own effect held the lease past the lease's end" in answer["reason"]
    taken = await other.acquire(TENANT, EXECUTION, LEASE_MS)
    assert taken is not None and taken.taken_over_from == LeaseHolder("holder", 1)
    ctx = ExecutionContext(TENANT, EXECUTION, EXECUTION, taken, StepRef(EXECUTION, "long", "long"))
    effects = SqlFencedEffectRepository(connection, StoreClock(), ApplicationContext("other"))
    replay = await effects.get_result(fenced_effect_key_of(ctx, "long"))
    assert replay is not None and replay.value == {"done": True}


# The effect: one fenced effect that writes a business row, then leaves its transaction
# idle for the given seconds; answers how it ended and whether the row committed.
IDLE = """
import asyncio, json, sys
import sqlalchemy as sa
from agboss_sql.contracts import ApplicationContext, StoreClock
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.types import ExecutionContext, StepRef
from agboss_sql.lab.database import committed_business_rows, insert_business_row
from agboss_sql.sql import Timeouts
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository

async def main(url, tenant, execution, idle_s):
    connection = SqlConnection(url, timeouts=Timeouts(statement_ms=1_000, lock_ms=1_000))
    app = ApplicationContext("idler")
    leases = SqlExecutionLeaseRepository(connection, StoreClock(), app)
    effects = SqlFencedEffectRepository(connection, StoreClock(), app)
    lease = await leases.acquire(tenant, execution, 60_000)
    step = StepRef(execution, "idle-" + idle_s, "idle")
    key = fenced_effect_key_of(ExecutionContext(tenant, execution, execution, lease, step), "idle")
    row = "idle-" + idle_s
    async def work(tx):
        await insert_business_row(tx, row)
        await asyncio.sleep(float(idle_s))  # the work's own idle time, its transaction open
        return {"idle": idle_s}
    try:
        answer = {"value": (await effects.save_result_if_absent(key, work)).value}
    except Exception as error:
        answer = {"error": type(error).__name__, "message": str(error)}
    answer["committed"] = row in await committed_business_rows(connection)
    answer["stored"] = await effects.get_result(key) is not None
    print(json.dumps(answer), flush=True)
    await connection.close()

asyncio.run(main(*sys.argv[1:5]))
"""


def _idle_effect(idle_s: str, execution: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", IDLE, fault_url(), TENANT, execution, idle_s],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=True,
    )
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_an_effect_idle_past_the_bound_is_ended_alike_on_every_database() -> None:
    reset_database(fault_url())
    # Bound: max(statement_ms, lock_ms) = 1 s (MariaDB counts whole seconds: 1 s too).
    ended = _idle_effect("2.5", "idle-long")
    assert ended["error"] == "StoreUnavailableError", ended
    assert not ended["committed"] and not ended["stored"], ended
    kept = _idle_effect("0.2", "idle-short")
    assert kept == {"value": {"idle": "0.2"}, "committed": True, "stored": True}, kept
