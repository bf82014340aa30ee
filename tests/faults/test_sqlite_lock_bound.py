"""SQLite: each call's wait for the write lock is bounded from its own start.

Another process holds the database's write lock (`BEGIN IMMEDIATE`, kept open). The process
under test sends several writes at once on one `SqlConnection`, then a few reads: every
write fails with `StoreTimeoutError(what="lock")` about `lock_ms` after it began (not one
`lock_ms` per write queued before it), and the reads answer at once, beside the waiting
writes (WAL serves readers beside a writer). docs/limits.md states both.

SQLite only: the servers' lock waits are their own (`lock_timeout`), per statement.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agboss_sql.contracts import ApplicationContext, StoreClock, StoreTimeoutError
from agboss_sql.lab.database import create_schema
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import execution_leases
from agboss_sql.sql.timeouts import Timeouts

pytestmark = [pytest.mark.faults]

LOCK_MS = 1_000
WRITES = 4
READS = 3

# The other process: takes the write lock and keeps it until its stdin closes.
LOCKER = """
import sqlite3, sys
raw = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
raw.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
raw.execute("ROLLBACK")
"""


@pytest.fixture
def path(tmp_path: Path) -> str:
    made = str(tmp_path / "locked.sqlite")
    create_schema(f"sqlite:///{made}")
    return made


@pytest.fixture
def locker(path: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", LOCKER, path],
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
        process.stdin.close()
        process.wait(timeout=30)


@pytest.fixture
async def connection(path: str) -> AsyncIterator[SqlConnection]:
    made = SqlConnection(f"sqlite:///{path}", timeouts=Timeouts(lock_ms=LOCK_MS))
    # Opened before the lock is taken: the first statements need no write.
    await made.execute(sa.select(execution_leases.c.execution_id))
    yield made
    await made.close()


async def timed(call: Any) -> tuple[float, Any]:
    """Seconds from the call's start to its end, and its answer or error."""
    started = time.monotonic()
    try:
        answer = await call
    except Exception as error:
        answer = error
    return time.monotonic() - started, answer


async def test_each_write_waits_lock_ms_from_its_own_start_and_reads_do_not_wait(
    connection: SqlConnection, locker: subprocess.Popen[str]
) -> None:
    leases = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("pod"))
    writes = [
        asyncio.create_task(timed(leases.acquire("tenant", f"run-{n}", 30_000)))
        for n in range(WRITES)
    ]
    # Every write has sent its first statement and found the database locked: each task
    # runs until its first wait, and these yields let all of them get there.
    for _ in range(WRITES * 3):
        await asyncio.sleep(0)
    reads = [
        await timed(connection.execute(sa.select(execution_leases.c.execution_id)))
        for _ in range(READS)
    ]
    for elapsed, answer in reads:
        # Alone a read takes milliseconds; queued behind the writes it took WRITES x lock_ms.
        assert not isinstance(answer, Exception), answer
        assert answer.rows == []
        assert elapsed < LOCK_MS / 1000, f"a read waited {elapsed:.2f} s behind the writes"
    for elapsed, error in await asyncio.gather(*writes):
        assert isinstance(error, StoreTimeoutError) and error.what == "lock", error
        assert elapsed >= LOCK_MS / 1000
        # One lock_ms, with room for a small shared machine; queued one behind the other,
        # the k-th write took k x lock_ms.
        assert elapsed < 2 * LOCK_MS / 1000, f"a write gave up after {elapsed:.2f} s"
