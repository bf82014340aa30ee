"""A held lease survives takes of another lease blocked on a locked row (servers).

Another process takes lease B and holds its row locked (`SELECT … FOR UPDATE` in an open
transaction). The process under test holds lease A with a `LeaseKeeper` and a short lease,
and on the same `SqlConnection` four tasks keep taking B: each take waits `lock_ms` on the
locked row, so takes fill the lease operations' lane for as long as the lock lasts. The
holder of A must keep A through several lease lengths: its renewals never queue behind
those takes (the holders' lane, `Lane.HOLD`), and a renewal that fails transiently is sent
again within the trust window (docs/limits.md).

SQLite is skipped: its one lock is the database's write lock, which a renewal needs too.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from support.capabilities import embedded_url

from agboss_sql.contracts import (
    ApplicationContext,
    LeaseEventKind,
    StoreClock,
    StoreTimeoutError,
    StoreUnavailableError,
    SystemClock,
)
from agboss_sql.lab.database import create_schema, truncate_all
from agboss_sql.runtime import LeaseKeeper
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository

pytestmark = [pytest.mark.database, pytest.mark.faults]

TENANT = "tenant-starve"
HELD = "lease-a"
LOCKED = "lease-b"
LEASE_MS = 3_000
"""Short, so that a renewal queued for one `lock_ms` (5 s) outlives the trust window (2 s)."""
HOLD_FOR_S = 4 * LEASE_MS / 1000
"""How long the holder must keep A while B's takes are blocked: several lease lengths."""
TAKERS = 4

# The other process: takes B (so its row exists), locks the row in an open transaction, says
# so on stdout, and keeps the lock until its stdin closes.
LOCKER = """
import asyncio, sys
import sqlalchemy as sa
from agboss_sql.contracts import ApplicationContext, StoreClock
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import execution_leases as L

async def main(url, tenant, execution):
    connection = SqlConnection(url)
    leases = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("locker"))
    assert await leases.acquire(tenant, execution, 600_000) is not None
    async with connection.transaction() as tx:
        await tx.execute(
            sa.select(L.c.lease_epoch)
            .where(L.c.tenant_id == tenant, L.c.execution_id == execution)
            .with_for_update()
        )
        print("locked", flush=True)
        await asyncio.to_thread(sys.stdin.read)
    await connection.close()

asyncio.run(main(*sys.argv[1:4]))
"""


@pytest.fixture
def server_url(database_url: str) -> str:
    if embedded_url(database_url):
        pytest.skip(
            "an embedded database has no row locks: its write lock holds up every writer alike"
        )
    create_schema(database_url, drop_first=True)
    return database_url


@pytest.fixture
async def connection(server_url: str) -> AsyncIterator[SqlConnection]:
    made = SqlConnection(server_url)
    await truncate_all(made)
    yield made
    await made.close()


@pytest.fixture
def locker(server_url: str, connection: SqlConnection) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", LOCKER, server_url, TENANT, LOCKED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "locked"
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()  # its stdin closing ends the transaction and the process
        process.wait(timeout=30)


async def test_a_held_lease_is_kept_while_takes_of_a_locked_row_fill_the_lease_lane(
    connection: SqlConnection, locker: subprocess.Popen[str]
) -> None:
    application = ApplicationContext("holder")
    leases = SqlExecutionLeaseRepository(connection, StoreClock(), application)
    events = SqlExecutionLeaseEventRepository(connection, SystemClock(), application)
    keeper = LeaseKeeper(leases, events, SystemClock(), lease_ms=LEASE_MS)
    assert await keeper.take(TENANT, HELD) is not None
    keeper.start()

    blocked: list[float] = []
    taken: list[object] = []
    stop = asyncio.Event()

    async def take_b() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                lease = await leases.acquire(TENANT, LOCKED, LEASE_MS)
            except StoreUnavailableError as error:
                if isinstance(error, StoreTimeoutError) and error.what == "lock":
                    blocked.append(time.monotonic() - started)
                continue
            if lease is not None:
                taken.append(lease)

    takers = [asyncio.create_task(take_b()) for _ in range(TAKERS)]
    try:
        # The holder's abort signal, not a sleep, ends the wait when the lease is lost.
        lost = asyncio.create_task(keeper.signal.wait())
        done, _ = await asyncio.wait([lost], timeout=HOLD_FOR_S)
        lost.cancel()
        assert not done, f"the holder lost its lease: {keeper.signal.reason!r}"
        assert keeper.held and keeper.trusted()
    finally:
        stop.set()
        await keeper.stop()
        for task in takers:
            task.cancel()
        await asyncio.gather(*takers, return_exceptions=True)
    assert blocked, "no take of B was held up by the row lock: the scenario did not bite"
    assert taken == []  # B stayed the locker's
    kinds = [event.kind for event in await events.list(TENANT, HELD)]
    assert LeaseEventKind.LOST not in kinds
    assert kinds == [LeaseEventKind.ACQUIRED]
    assert await keeper.release()
