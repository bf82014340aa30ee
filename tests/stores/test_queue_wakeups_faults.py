"""The child queue's wake-up listener when its connection fails, hangs or is closed, on a
database that notifies (PostgreSQL `LISTEN`): every wait ends within its bound, answers
False rather than raising (claimers poll meanwhile), and the listener listens again later,
not more often than once a second. A relay before the server (`support.relay`) makes it
answer the `LISTEN` late, never, or with an error, refuse every connection, or go silent.

Bounds on the wall clock are generous (several seconds for waits of tenths) because the
machine running the suite may be loaded; lower bounds are exact (a sleep never ends early).
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from support.capabilities import require, sessions_kept
from support.ports import closed_port, silent_listener
from support.relay import Relay
from support.sql import kill_sql

from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts import ApplicationContext, QueuedChild, VirtualClock
from agboss_sql.sql._queue_batch import WAKE_CHANNEL
from agboss_sql.sql._queue_wakeups import NotifiedWakeups
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository

pytestmark = pytest.mark.database

NewConnection = Callable[[], SqlConnection]
BOUND_S = 5.0
"""Far above every wait asked here: only a wait that overran its own bound reaches it."""
LISTENERS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    f"AND query = 'LISTEN {WAKE_CHANNEL}' AND pid <> pg_backend_pid()"
)
"""The server's sessions of this database whose last statement was the listener's."""


def _listening(sql: SqlConnection) -> None:
    require(
        sql.capabilities.notifications and sessions_kept(sql),
        "notifications with a session kept to listen on",
    )


async def _listeners(sql: SqlConnection, others: frozenset[int] = frozenset()) -> list[int]:
    """The listening sessions but `others` (those listening before the test's own opened,
    so that a listener left by another test or client is not taken for this one)."""
    rows = (await sql.execute(LISTENERS)).rows
    return sorted(pid for pid in (int(row[0]) for row in rows) if pid not in others)


async def _timed(wait: Awaitable[bool]) -> tuple[bool, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await asyncio.wait_for(wait, BOUND_S)
    return got, loop.time() - started


async def _shortest_of_three_zero_waits(wakeups: NotifiedWakeups) -> float:
    """The shortest of three waits of 0 ms, each answering False. A wait must not outlast
    what it was asked by a fixed floor (a claimer polling at 0 would stall); the shortest of
    three is taken so that one stall of a loaded machine is not read as such a floor."""
    took = []
    for _ in range(3):
        got, spent = await _timed(wakeups.wait(0))
        assert got is False
        took.append(spent)
    return min(took)


def _child(child_id: str) -> QueuedChild:
    return QueuedChild("tenant-1", "root-1", "parent-1", child_id, 1, {"id": child_id})


async def _heard_after_enqueue(wakeups: NotifiedWakeups, other: SqlConnection, child: str) -> bool:
    """Whether a wait of 60 s is told (long before 5 s) of a child queued on `other`."""
    while await wakeups.wait(20):  # hints already received are taken first
        pass
    waiting = asyncio.create_task(wakeups.wait(60_000))
    queue = SqlChildExecutionQueueRepository(
        other, VirtualClock(1_700_000_000_000), ApplicationContext("instance-2")
    )
    await queue.enqueue(_child(child))
    return await asyncio.wait_for(waiting, BOUND_S)


async def test_a_listener_whose_connection_is_killed_answers_false_and_listens_again(
    sql: SqlConnection, new_connection: NewConnection
) -> None:
    """The listening session ended by the server while a wait of 0.5 s runs: that wait
    answers False, not before its time (a claimer polling meanwhile does not spin) and
    long before 5 s; no exception escapes; a later wait opens a new session, which hears
    a child queued on another connection."""
    _listening(sql)
    others = frozenset(await _listeners(sql))
    wakeups = NotifiedWakeups(sql)
    try:
        assert await wakeups.wait(1) is False  # opens and listens; nothing queued
        (pid,) = await _listeners(sql, others)
        waiting = asyncio.create_task(_timed(wakeups.wait(500)))
        await asyncio.sleep(0)  # the wait is under way on the listening session
        await sql.execute(kill_sql(sql, pid))
        got, took = await waiting
        assert got is False
        assert took >= 0.45, f"a lost listener answered after {took:.3f} s of a 0.5 s wait"
        reopened = asyncio.get_running_loop().time() + BOUND_S
        while not await _listeners(sql, others):
            assert asyncio.get_running_loop().time() < reopened, "the listener never reopened"
            assert await wakeups.wait(100) is False
        assert pid not in await _listeners(sql, others)
        assert await _heard_after_enqueue(wakeups, new_connection(), "after-kill")
    finally:
        await wakeups.close()


@pytest.fixture
async def unreachable(sql: SqlConnection) -> AsyncIterator[Callable[[int], SqlConnection]]:
    """Connections to this database's dialect at loopback ports: `made(port)`."""
    made: list[SqlConnection] = []

    def make(port: int) -> SqlConnection:
        connection = SqlConnection(
            sql.url.set(host="127.0.0.1", port=port), timeouts=Timeouts(connect_ms=300)
        )
        made.append(connection)
        return connection

    yield make
    for connection in made:
        await connection.close()


@pytest.mark.parametrize("server", ["refusing", "silent"])
async def test_a_listener_that_cannot_connect_answers_false_within_its_bound(
    sql: SqlConnection, unreachable: Callable[[int], SqlConnection], server: str
) -> None:
    """Nothing listening at the port (refused) or a server that never greets (its opening
    bounded by `connect_ms`): each wait of 0.2 s answers False, not before its time and
    long before 5 s, without raising, waits of 0 ms well before 1 s, and nothing is
    listened to."""
    _listening(sql)

    async def waits(port: int) -> None:
        wakeups = NotifiedWakeups(unreachable(port))
        try:
            for _ in range(2):  # the first try, then one within the pause between tries
                got, took = await _timed(wakeups.wait(200))
                assert got is False
                assert took >= 0.19, f"a wait of 0.2 s answered after {took:.3f} s"
            # Within the pause between two tries: answered at once, without a try.
            assert await _shortest_of_three_zero_waits(wakeups) < 0.9
            assert not wakeups.listening
        finally:
            await wakeups.close()

    if server == "refusing":
        await waits(closed_port())
    else:
        with silent_listener() as port:
            await waits(port)


async def test_a_closed_listener_leaves_no_session_on_the_server(sql: SqlConnection) -> None:
    """After `close()` the server has no session of the listener left (its session gone
    within 5 s), and a wait after it answers False without opening one."""
    _listening(sql)
    others = frozenset(await _listeners(sql))
    wakeups = NotifiedWakeups(sql)
    assert await wakeups.wait(1) is False
    assert len(await _listeners(sql, others)) == 1
    await wakeups.close()
    gone = asyncio.get_running_loop().time() + BOUND_S
    while await _listeners(sql, others):
        assert asyncio.get_running_loop().time() < gone, "the closed listener's session stays"
        await asyncio.sleep(0.05)
    assert await wakeups.wait(1) is False
    assert not await _listeners(sql, others)


async def test_a_listening_wait_returns_by_its_timeout_and_keeps_listening(
    sql: SqlConnection, new_connection: NewConnection
) -> None:
    """Waits of 0.2 s with nothing queued answer False, not before 0.2 s and long before
    5 s, waits of 0 ms well before 1 s, on the same listening session (not dropped and opened again), which then hears
    a child queued on another connection."""
    _listening(sql)
    others = frozenset(await _listeners(sql))
    wakeups = NotifiedWakeups(sql)
    try:
        assert await wakeups.wait(1) is False
        (pid,) = await _listeners(sql, others)
        for _ in range(3):
            got, took = await _timed(wakeups.wait(200))
            assert got is False
            assert took >= 0.19, f"a wait of 0.2 s answered after {took:.3f} s"
        assert await _shortest_of_three_zero_waits(wakeups) < 0.9
        assert await _listeners(sql, others) == [pid]
        assert await _heard_after_enqueue(wakeups, new_connection(), "later")
        assert await _listeners(sql, others) == [pid]
    finally:
        await wakeups.close()


Relayed = Callable[[int], Awaitable[tuple[Relay, SqlConnection]]]


@pytest.fixture
async def relayed(sql: SqlConnection) -> AsyncIterator[Relayed]:
    """`await made(connect_ms)`: a relay before this database's server (`support.relay`)
    and a connection through it with that `connect_ms`; both closed after the test."""
    made: list[tuple[Relay, SqlConnection]] = []

    async def make(connect_ms: int) -> tuple[Relay, SqlConnection]:
        relay = await Relay(sql.url.host or "127.0.0.1", sql.url.port or 5432).__aenter__()
        made.append(
            (relay, SqlConnection(relay.url_for(sql.url), timeouts=Timeouts(connect_ms=connect_ms)))
        )
        return made[-1]

    yield make
    for relay, connection in made:
        await connection.close()
        await relay.__aexit__()


async def _until(done: Callable[[], bool], failure: str) -> None:
    """Wait (polling) until `done()`, failing with `failure` after 5 s."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + BOUND_S
    while not done():
        assert loop.time() < ends, failure
        await asyncio.sleep(0.02)


LISTEN = f"LISTEN {WAKE_CHANNEL}".encode()
"""The listener's statement, as its connection sends it."""


async def test_a_listen_answered_within_connect_ms_is_listened_to(
    sql: SqlConnection,
    relayed: Relayed,
    new_connection: NewConnection,
) -> None:
    """A server that answers the listener's `LISTEN` only once `connect_ms` (2 s) has passed
    since the connection was opened: the opening (bounded by twice `connect_ms`) still
    listens, and a child queued on another connection is heard."""
    _listening(sql)
    relay, through = await relayed(2000)
    relay.hold(LISTEN, 2.0)
    wakeups = NotifiedWakeups(through)
    try:
        assert await _heard_after_enqueue(wakeups, new_connection(), "late-listen")
        assert relay.held == 1  # one opening, its LISTEN held
    finally:
        await wakeups.close()


async def test_a_listen_never_answered_ends_the_opening_within_twice_connect_ms(
    sql: SqlConnection, relayed: Relayed
) -> None:
    """A server that never answers the listener's `LISTEN` (connected, then silent): a wait
    of 0 ms answers False within the opening's bound, twice `connect_ms` (2 x 3 s), and
    half a `connect_ms` more (1.5 s, for a loaded machine); the listener closes that
    connection."""
    _listening(sql)
    relay, through = await relayed(3000)
    relay.hold(LISTEN, None)
    wakeups = NotifiedWakeups(through)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await asyncio.wait_for(wakeups.wait(0), 4 * 3.0)
        took = loop.time() - started
        assert got is False
        assert relay.held == 1
        assert took < 2.5 * 3.0, f"a wait of 0 ms answered after {took:.3f} s"
        await _until(lambda: relay.clients_closed == 1, "the given-up connection stays open")
    finally:
        await wakeups.close()


async def test_a_listen_refused_by_the_server_leaves_no_connection_open(
    sql: SqlConnection, relayed: Relayed
) -> None:
    """The server answers the listener's `LISTEN` with an error (as a standby does; here
    the relay turns it into a statement that fails) on a session that stays: the wait
    answers False, and the listener closes that connection itself, none left for the
    garbage collector to find open (psycopg's ResourceWarning) nor on the server."""
    _listening(sql)
    relay, through = await relayed(2000)
    relay.rewrite(LISTEN, b"SELECT 1/0".ljust(len(LISTEN)))
    wakeups = NotifiedWakeups(through)
    try:
        gc.collect()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, _ = await _timed(wakeups.wait(0))
            gc.collect()
        assert got is False
        assert relay.held == 1
        left_open = [str(w.message) for w in caught if "deleted while still open" in str(w.message)]
        assert not left_open, left_open
        await _until(lambda: relay.clients_closed == 1, "the refused connection stays open")
    finally:
        await wakeups.close()


async def test_a_listener_refused_at_every_try_tries_at_most_once_a_second(
    sql: SqlConnection, relayed: Relayed
) -> None:
    """A server that closes every connection at once: six waits of 0 ms each answer False,
    and the server sees at most one try per second that passed (one at the first wait,
    one more for each full second since), never one per wait."""
    _listening(sql)
    relay, through = await relayed(2000)
    relay.closing = True
    wakeups = NotifiedWakeups(through)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(6):
            got, _ = await _timed(wakeups.wait(0))
            assert got is False
        took = loop.time() - started
        assert 1 <= relay.accepted <= 1 + int(took / 1.0), f"{relay.accepted} tries in {took:.3f} s"
    finally:
        await wakeups.close()


async def test_a_wait_that_finds_its_connection_lost_answers_by_its_timeout(
    sql: SqlConnection,
) -> None:
    """A listening session ended by the server between two waits: the next wait (0.1 s)
    finds it lost and answers False by its own timeout, not after a floor of its own (the
    shortest of three such waits, each on a session opened again, well before 1 s), and
    the listener's `listening` says it no longer listens."""
    _listening(sql)
    others = frozenset(await _listeners(sql))
    wakeups = NotifiedWakeups(sql)
    took: list[float] = []
    try:
        loop = asyncio.get_running_loop()
        for _ in range(3):
            reopened = loop.time() + BOUND_S
            while not await _listeners(sql, others):
                assert loop.time() < reopened, "the listener never (re)opened"
                assert await wakeups.wait(100) is False
            (pid,) = await _listeners(sql, others)
            await sql.execute(kill_sql(sql, pid))
            gone = loop.time() + BOUND_S
            while pid in await _listeners(sql, others):
                assert loop.time() < gone, "the killed session stays"
                await asyncio.sleep(0.02)
            got, spent = await _timed(wakeups.wait(100))
            assert got is False
            assert not wakeups.listening  # its status no longer claims a connection
            took.append(spent)
        assert min(took) < 0.9, f"waits of 0.1 s on a lost connection took {took}"
    finally:
        await wakeups.close()


async def test_a_black_holed_listener_ends_each_wait_by_its_timeout_and_closes(
    sql: SqlConnection,
    relayed: Relayed,
    new_connection: NewConnection,
) -> None:
    """A listening connection whose server goes silent without a word (the relay forwards
    nothing more; both sockets stay open): waits of 0.2 s answer False, not before their
    time and long before 5 s, and `close()` lets go of the connection."""
    _listening(sql)
    relay, through = await relayed(2000)
    wakeups = NotifiedWakeups(through)
    try:
        assert await _heard_after_enqueue(wakeups, new_connection(), "before-silence")
        relay.silent = True
        for _ in range(2):
            got, took = await _timed(wakeups.wait(200))
            assert got is False
            assert took >= 0.19, f"a wait of 0.2 s answered after {took:.3f} s"
        assert relay.accepted == 1 and relay.clients_closed == 0
    finally:
        await asyncio.wait_for(wakeups.close(), BOUND_S)
    await _until(lambda: relay.clients_closed == 1, "the closed listener's connection stays")
