"""SQLite runs inline on the event loop: waiting for the write lock must never block it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.capabilities import embedded, require

from agboss_sql.contracts import ApplicationContext, StoreClock, StoreTimeoutError
from agboss_sql.lab.business import insert_business_row
from agboss_sql.sql._inline_runner import _CALLS_PER_TURN
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.timeouts import Timeouts


@pytest.fixture
def sqlite_only(sql: SqlConnection) -> SqlConnection:
    require(embedded(sql), "inline (embedded) runner")
    return sql


async def test_a_writer_waiting_for_the_lock_leaves_the_loop_free(
    sqlite_only: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    holder, waiter = sqlite_only, new_connection()
    leases = SqlExecutionLeaseRepository(waiter, StoreClock(), ApplicationContext("b"))
    ticks = 0
    holding = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    async def hold_the_write_lock() -> None:
        async with holder.transaction() as tx:  # BEGIN IMMEDIATE: the database's write lock
            await insert_business_row(tx, "held")
            holding.set()
            await asyncio.sleep(0.3)

    tick_task = asyncio.create_task(ticker())
    hold = asyncio.create_task(hold_the_write_lock())
    await holding.wait()
    before = ticks
    taken = await asyncio.gather(*(leases.acquire("t", f"e-{i}", 60_000) for i in range(20)))
    after = ticks
    await hold
    tick_task.cancel()
    assert all(lease is not None for lease in taken), "every take waited and then went through"
    # The takes waited for the lock about 0.3 s, the holder (on this loop) let go of it, and
    # the loop kept turning all along: a blocked loop would neither let the holder commit
    # nor tick. (A few ticks, not sixty: on a loaded machine a 5 ms sleep takes longer.)
    assert after - before >= 5, f"the event loop was blocked while waiting ({after - before})"


async def test_a_loop_of_calls_does_not_starve_other_tasks(sqlite_only: SqlConnection) -> None:
    leases = SqlExecutionLeaseRepository(sqlite_only, StoreClock(), ApplicationContext("a"))
    other_ran = 0

    async def other() -> None:
        nonlocal other_ran
        while True:
            other_ran += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    for i in range(200):
        lease: Any = await leases.acquire("t", f"loop-{i}", 60_000)
        assert lease is not None
    task.cancel()
    # A turn at least every _CALLS_PER_TURN calls (more often when calls are slow).
    assert other_ran >= 200 // _CALLS_PER_TURN, (
        f"a tight loop of store calls starved the other task ({other_ran})"
    )


async def test_a_frozen_process_holding_the_write_lock_ends_in_a_lock_timeout(
    sqlite_only: SqlConnection, sql_url: str
) -> None:
    """Another process takes the write lock (`BEGIN IMMEDIATE`) and is frozen (SIGSTOP): a
    store call here waits at most `lock_ms`, then fails typed, naming the lock, with nothing
    applied (twelve retries of the wait would have made it a minute). Killed, the holder's
    lock goes with it and the next call goes through."""
    import os
    import signal
    import sys

    path = sqlite_only.url.database
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sqlite3, sys\n"
        f"c = sqlite3.connect({path!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    connection = SqlConnection(sql_url, timeouts=Timeouts(lock_ms=300))
    leases = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("b"))
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), 60) == b"held\n"
        os.kill(holder.pid, signal.SIGSTOP)
        with pytest.raises(StoreTimeoutError) as raised:
            # The outer bound only keeps a regression from hanging the suite.
            await asyncio.wait_for(leases.acquire("t", "frozen", 30_000), 60)
        assert raised.value.what == "lock"
        os.kill(holder.pid, signal.SIGKILL)
        await holder.wait()
        assert await leases.acquire("t", "frozen", 30_000) is not None
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await connection.close()


async def test_a_second_transaction_waits_for_the_first_and_its_wait_is_bounded(
    sqlite_only: SqlConnection, sql_url: str
) -> None:
    """One `transaction()` at a time per connection: the next waits for the one in flight
    (handed the work connection when it ends), and a wait that outlives `lock_ms` ends in
    `StoreTimeoutError(what="lock")` while the first goes on and commits."""
    connection = SqlConnection(sql_url, timeouts=Timeouts(lock_ms=200))
    order: list[str] = []
    try:
        first = connection.transaction()
        await first.__aenter__()
        order.append("first")
        second_began = asyncio.Event()

        async def second() -> None:
            second_began.set()
            async with connection.transaction():
                order.append("second")

        with pytest.raises(StoreTimeoutError) as raised:
            # The outer bound only keeps a regression from hanging the suite.
            await asyncio.wait_for(second(), 60)
        assert raised.value.what == "lock"
        assert order == ["first"], "a second transaction ran inside the first"
        waiting = asyncio.create_task(second())
        await second_began.wait()
        await asyncio.sleep(0)  # a loop turn: it queues for the work connection
        assert not waiting.done()
        await first.__aexit__(None, None, None)
        await asyncio.wait_for(waiting, 60)
        assert order == ["first", "second"]
    finally:
        await connection.close()
