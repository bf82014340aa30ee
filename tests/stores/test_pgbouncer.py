"""PostgreSQL behind a transaction pooler (PgBouncer, `?agboss_pooling=transaction`).

Run by the `postgresql-pgbouncer` tox env (dialects/postgresql/pgbouncer.sh: PgBouncer in
`pool_mode = transaction`, with `ignore_startup_parameters = options`, so startup options
are silently dropped); skipped on any other database. The bounds must still end every wait,
by the server's own timeouts (the cause is the server's `query_canceled` or
`lock_not_available`, not the client's deadline, which would end a wait too, `GRACE_S`
later), in each way a statement is sent: alone in autocommit, in a step's transaction, in
the engine's transaction (`transaction()`), and on the checkpoint saver's synchronous
driver. A URL without the option is refused, never used with its bounds dropped.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from agboss_sql._dialects import _pg_pooling
from agboss_sql._dialects import postgresql as pg
from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import StoreTimeoutError
from agboss_sql.sql import migrate
from agboss_sql.sql.checkpoint._sync_drivers import driver_for
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.statements import Exec, Step

BOUNDED = Timeouts(statement_ms=400, lock_ms=300)
"""Short bounds; every wait tested lasts far longer (`LONG_S`) unless a bound ends it."""
LONG_S = 20
"""A wait no bound here lets last (the client's own deadline is `statement_ms` + 5 s)."""


@pytest.fixture
def pooled_url(sql_url: str) -> str:
    """The database under test, when it is reached through a transaction pooler."""
    if make_url(sql_url).query.get(_pg_pooling.POOLING_OPTION) is None:
        pytest.skip(
            f"the database under test is not behind a pooler ({_pg_pooling.POOLING_OPTION})"
        )
    return sql_url


def _libpq(url: str) -> dict[str, Any]:
    """psycopg's arguments for `url`, without any option: what PgBouncer forwards."""
    parsed = make_url(url)
    return {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username or "postgres",
        "dbname": parsed.database,
        "prepare_threshold": None,
    }


def _sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of the server's error behind `exc` (a driver's error, or SQLAlchemy's
    wrapping one)."""
    if exc is None:
        return None
    found = getattr(exc, "sqlstate", None) or getattr(getattr(exc, "orig", None), "sqlstate", None)
    return found if isinstance(found, str) else None


QUERY_CANCELED = "57014"
LOCK_NOT_AVAILABLE = "55P03"


@contextlib.asynccontextmanager
async def _held(url: str) -> AsyncIterator[int]:
    """An advisory lock (its key) held in an open transaction by another client of the pooler
    (which keeps that transaction's server session its own until it ends)."""
    key = random.randrange(1, 2**62)
    holder = await psycopg.AsyncConnection.connect(**_libpq(url))
    try:
        await holder.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        yield key
    finally:
        await holder.rollback()
        await holder.close()


def _sleep() -> sa.TextClause:
    return sa.text(f"SELECT pg_sleep({LONG_S})")


def _lock(key: int) -> sa.TextClause:
    return sa.text(f"SELECT pg_advisory_xact_lock({key})")


def _step(statement: sa.TextClause) -> Step[None]:
    yield Exec(statement, {})


def _ended_by_server(exc: StoreTimeoutError, what: str, sqlstate: str) -> None:
    assert exc.what == what
    assert _sqlstate(exc.__cause__) == sqlstate, (
        f"the wait ended by {exc.__cause__!r}, not by the server's bound ({sqlstate})"
    )


@pytest.fixture
async def bounded(pooled_url: str) -> AsyncIterator[SqlConnection]:
    connection = SqlConnection(pooled_url, timeouts=BOUNDED)
    yield connection
    await connection.close()


async def test_the_url_without_the_option_is_refused_not_used_unbounded(pooled_url: str) -> None:
    """PgBouncer here drops startup options (`ignore_startup_parameters = options`): the
    direct mode's bounds would silently vanish, so the connection is refused."""
    # The hazard is real: options sent to this pooler do not reach the session.
    plain = await psycopg.AsyncConnection.connect(
        **_libpq(pooled_url), options="-c statement_timeout=400", autocommit=True
    )
    try:
        row = await (await plain.execute("SELECT current_setting('statement_timeout')")).fetchone()
        assert row is not None and row[0] != "400ms"
    finally:
        await plain.close()
    direct = make_url(pooled_url).difference_update_query([_pg_pooling.POOLING_OPTION])
    connection = SqlConnection(direct, timeouts=BOUNDED)
    try:
        with pytest.raises(_pg_pooling.BoundsDroppedError, match=_pg_pooling.POOLING_OPTION):
            await connection.execute(sa.text("SELECT 1"))
    finally:
        await connection.close()


async def test_every_kind_of_transaction_carries_its_own_bounds(pooled_url: str) -> None:
    """Two clients with different bounds, through one pooler's server sessions: each
    statement sees its own client's bounds, alone, in a step and in the engine's
    transaction (a session setting would leak to the other; a missing one reads 0)."""
    short = SqlConnection(pooled_url, timeouts=Timeouts(statement_ms=7_001, lock_ms=3_001))
    long = SqlConnection(pooled_url, timeouts=Timeouts(statement_ms=9_002, lock_ms=4_002))
    read = sa.text(
        "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
        "current_setting('idle_in_transaction_session_timeout')"
    )

    def step() -> Step[Any]:
        return (yield Exec(read, {})).first()

    try:
        for _ in range(5):
            for connection, wanted in ((short, ("7001ms", "3001ms")), (long, ("9002ms", "4002ms"))):
                idle = wanted[0]  # the larger of the two bounds
                alone = (await connection.execute(read)).first()
                in_step = await connection.run(step)
                async with connection.transaction() as transaction:
                    in_engine = (await transaction.execute(read)).first()
                for found in (alone, in_step, tuple(in_engine or ())):
                    assert tuple(found or ()) == (*wanted, idle)
    finally:
        await short.close()
        await long.close()


async def test_a_statement_alone_past_its_bound_ends_in_a_typed_timeout(
    bounded: SqlConnection,
) -> None:
    with pytest.raises(StoreTimeoutError) as caught:
        await bounded.execute(_sleep())
    _ended_by_server(caught.value, "statement", QUERY_CANCELED)
    await bounded.ping()  # the pool goes on


async def test_a_step_past_its_bound_ends_in_a_typed_timeout(bounded: SqlConnection) -> None:
    with pytest.raises(StoreTimeoutError) as caught:
        await bounded.run(lambda: _step(_sleep()))
    _ended_by_server(caught.value, "statement", QUERY_CANCELED)


async def test_an_engine_transaction_past_its_bound_ends_in_a_typed_timeout(
    bounded: SqlConnection,
) -> None:
    with pytest.raises(StoreTimeoutError) as caught:
        async with bounded.transaction() as transaction:
            await transaction.execute(_sleep())
    _ended_by_server(caught.value, "statement", QUERY_CANCELED)


async def test_a_lock_wait_alone_past_lock_ms_ends_in_a_typed_timeout(
    bounded: SqlConnection, pooled_url: str
) -> None:
    async with _held(pooled_url) as key:
        with pytest.raises(StoreTimeoutError) as caught:
            await bounded.execute(_lock(key))
    _ended_by_server(caught.value, "lock", LOCK_NOT_AVAILABLE)


async def test_a_lock_wait_in_a_step_past_lock_ms_ends_in_a_typed_timeout(
    bounded: SqlConnection, pooled_url: str
) -> None:
    async with _held(pooled_url) as key:
        with pytest.raises(StoreTimeoutError) as caught:
            await bounded.run(lambda: _step(_lock(key)))
    _ended_by_server(caught.value, "lock", LOCK_NOT_AVAILABLE)


async def test_a_lock_wait_in_an_engine_transaction_past_lock_ms_ends_in_a_typed_timeout(
    bounded: SqlConnection, pooled_url: str
) -> None:
    async with _held(pooled_url) as key:
        with pytest.raises(StoreTimeoutError) as caught:
            async with bounded.transaction() as transaction:
                await transaction.execute(_lock(key))
    _ended_by_server(caught.value, "lock", LOCK_NOT_AVAILABLE)


async def test_the_savers_sync_driver_bounds_statements_and_lock_waits(
    bounded: SqlConnection, pooled_url: str
) -> None:
    """The checkpoint saver's synchronous path (`_sync_drivers.PostgresDriver`): alone and in
    its own `BEGIN`, the server ends a long statement and a long lock wait."""
    driver = driver_for(bounded.url, BOUNDED)
    raw = driver.connect()
    try:
        async with _held(pooled_url) as key:
            for statement in (f"SELECT pg_sleep({LONG_S})", f"SELECT pg_advisory_xact_lock({key})"):
                wanted = QUERY_CANCELED if "sleep" in statement else LOCK_NOT_AVAILABLE
                with pytest.raises(psycopg.Error) as caught:
                    driver.execute(raw, statement, None)
                assert _sqlstate(caught.value) == wanted
                driver.execute(raw, pg.BEGIN, None)
                with pytest.raises(psycopg.Error) as caught:
                    driver.execute(raw, statement, None)
                assert _sqlstate(caught.value) == wanted
                driver.execute(raw, "ROLLBACK", None)
        assert driver.is_usable(raw)
    finally:
        driver.close(raw)


async def test_no_listening_behind_the_pooler(bounded: SqlConnection) -> None:
    """`LISTEN` would listen on a session the pooler lends to others: the queue polls."""
    from agboss_sql.sql._queue_wakeups import NotifiedWakeups

    await bounded.ping()
    assert NotifiedWakeups.of(bounded) is None  # the queue's `wakeups()`: nobody to listen
    wakeups = NotifiedWakeups(bounded)
    try:
        assert await wakeups.wait(10) is False
        assert not wakeups.listening
    finally:
        await wakeups.close()


def test_the_migration_lock_is_held_through_the_pooler(pooled_url: str) -> None:
    """The migration lock is the migration transaction's own (a session lock would stay on a
    server session the pooler lends to others): held while the body runs, gone after."""
    probe = psycopg.connect(**_libpq(pooled_url), autocommit=True)

    def free() -> bool:
        row = probe.execute(
            "SELECT pg_try_advisory_xact_lock(%s)", (pg.MIGRATION_LOCK_KEY,)
        ).fetchone()
        return bool(row and row[0])

    try:
        with migrate.connect(pooled_url) as connection:
            with migrate.migration_lock(connection):
                assert not free()
                assert migrate._current_on(connection) == migrate.head()
            assert free()
    finally:
        probe.close()


def _pooler_setting(url: str, *names: str) -> list[int]:
    """PgBouncer's settings `names`, from its admin console (a simple-protocol `SHOW CONFIG`:
    the console takes no other)."""
    admin = psycopg.connect(**{**_libpq(url), "dbname": "pgbouncer"}, autocommit=True)
    try:
        shown = admin.pgconn.exec_(b"SHOW CONFIG")
        config = {
            (shown.get_value(i, 0) or b"").decode(): (shown.get_value(i, 1) or b"").decode()
            for i in range(shown.ntuples)
        }
    finally:
        admin.close()
    return [int(config[name]) for name in names]


@contextlib.asynccontextmanager
async def _every_server_connection_lent(url: str) -> AsyncIterator[None]:
    """Every server connection of the database's pool held in an open transaction by other
    clients of the pooler (`default_pool_size`, and `reserve_pool_size` it adds after a
    while): a transaction begun meanwhile waits in PgBouncer's queue."""
    pool, reserve = _pooler_setting(url, "default_pool_size", "reserve_pool_size")
    holders: list[psycopg.AsyncConnection[Any]] = []
    try:
        for _ in range(pool + reserve):
            holder = await psycopg.AsyncConnection.connect(**_libpq(url))
            holders.append(holder)
            await holder.execute("SELECT 1")  # begins: a server connection is the holder's
        yield
    finally:
        for holder in holders:
            with contextlib.suppress(psycopg.Error):
                await holder.rollback()
            await holder.close()


WAITING = Timeouts(pool_ms=300, statement_ms=60_000)
"""A short pool bound; a statement bound (and the client's deadline after it) far longer."""
WAIT_ENDED_S = 30
"""The bound a wait for a server connection must end within: far under the statement bound
(60 s) and PgBouncer's `query_wait_timeout` (checked above it), which would end it
otherwise; far over `pool_ms` + the margin (0.8 s), for a loaded machine."""


async def test_waiting_for_a_server_connection_ends_at_pool_ms(pooled_url: str) -> None:
    """PgBouncer's pool all lent out: a transaction's first round trip waits in its queue, a
    wait it bounds by `query_wait_timeout` only. Ours ends it at `pool_ms`, in every way a
    transaction begins: a statement alone, a step, the engine's transaction, the saver's sync
    driver (alone and its own `BEGIN`). Each ends in `StoreTimeoutError(what="pool")`, its
    connection dropped: once the pool is free again, the same connection answers."""
    import time

    (query_wait_s,) = _pooler_setting(pooled_url, "query_wait_timeout")
    assert query_wait_s == 0 or query_wait_s > WAIT_ENDED_S, "the pooler would end it itself"
    connection = SqlConnection(pooled_url, timeouts=WAITING)
    driver = driver_for(connection.url, WAITING)
    read = sa.text("SELECT 1")
    try:

        async def in_engine() -> None:
            async with connection.transaction() as transaction:
                await transaction.execute(read)

        async def on_sync_driver(sql: str) -> None:
            raw = driver.connect()
            try:
                driver.execute(raw, sql, None)
            finally:
                assert not driver.is_usable(raw)  # dropped, never reused
                driver.close(raw)

        calls = {
            # First: SQLAlchemy's first connection asks the server its version, outside any
            # transaction of ours.
            "engine's first": in_engine,
            "alone": lambda: connection.execute(read),
            "step": lambda: connection.run(lambda: _step(read)),
            "engine": in_engine,
            "sync alone": lambda: on_sync_driver("SELECT 1"),
            "sync BEGIN": lambda: on_sync_driver(pg.BEGIN),
        }
        async with _every_server_connection_lent(pooled_url):
            for name, call in calls.items():
                started = time.monotonic()
                with pytest.raises(StoreTimeoutError) as caught:
                    await call()
                waited = time.monotonic() - started
                assert caught.value.what == "pool", (name, caught.value)
                assert caught.value.bound_ms == WAITING.pool_ms
                assert waited < WAIT_ENDED_S, (name, waited)
        assert (await connection.execute(read)).rows == [(1,)]
        assert await connection.run(lambda: _answer(read)) == [(1,)]
        async with connection.transaction() as transaction:
            assert (await transaction.execute(read)).all() == [(1,)]
    finally:
        await connection.close()


def _answer(statement: sa.TextClause) -> Step[Any]:
    return (yield Exec(statement, {})).rows
