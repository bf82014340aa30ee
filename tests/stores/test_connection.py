"""`SqlConnection` keeps its promises on the database under test.

What is sent is read from the statement listener (BEGIN, COMMIT and ROLLBACK
included). Conflicts are real: deadlocks between two connections, serialization
failures, a writer blocked by another connection's `BEGIN IMMEDIATE`, server-side
kills of pooled connections. Concurrent callers use separate `SqlConnection`s, as
separate instances would.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from support.capabilities import (
    counts_session_statements,
    embedded,
    repeatable_read_raises_serialization_failures,
    require,
    row_locks,
    scripts,
    sessions_kept,
)
from support.drivers import deadlock_error, is_deadlock, raw_connection_class
from support.sql import (
    kill_sql,
    session_id_sql,
    sessions_alive_sql,
    sleep_condition,
    sleep_expression,
    sleep_sql,
    statement_past_its_bound,
)

from agboss_sql._dialects import inline_dialect
from agboss_sql.contracts.errors import (
    CommitOutcomeUnknownError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from agboss_sql.sql.connection import Exec, Result, SqlConnection, Step
from agboss_sql.sql.statements import Script
from agboss_sql.sql.timeouts import Timeouts
from agboss_sql.testing.database import sync_url

scratch = sa.MetaData()
counters = sa.Table(
    "connection_test_counters",
    scratch,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("n", sa.Integer(), nullable=False),
)
"""A table of this module only (created and dropped around it)."""

C = counters.c
READ = sa.select(C.n).where(C.id == sa.bindparam("key"))
READ_ALL = sa.select(C.id, C.n).order_by(C.id)
INSERT = sa.insert(counters).values(id=sa.bindparam("key"), n=sa.bindparam("value"))
INCREMENT = sa.update(counters).where(C.id == sa.bindparam("key")).values(n=C.n + 1)
SET_N = sa.update(counters).where(C.id == sa.bindparam("key")).values(n=sa.bindparam("value"))
DELETE_ALL = sa.delete(counters)


@pytest.fixture(scope="module")
def counters_table(sql_url: str) -> Iterator[None]:
    engine = sa.create_engine(sync_url(sql_url))
    try:
        scratch.drop_all(engine)
        scratch.create_all(engine)
    finally:
        engine.dispose()
    yield
    engine = sa.create_engine(sync_url(sql_url))
    try:
        scratch.drop_all(engine)
    finally:
        engine.dispose()


@pytest.fixture
async def db(sql: SqlConnection, counters_table: None) -> SqlConnection:
    """The test's connection, with an empty counters table."""
    await sql.execute(DELETE_ALL)
    return sql


# --- helpers --------------------------------------------------------------------------------


def _one(statement: Any, params: dict[str, Any] | None = None) -> Step[Result]:
    return (yield Exec(statement, params or {}))


def _server_only(sql: SqlConnection) -> None:
    # An embedded database has no server sessions or row locks (its own case covers it).
    require(not embedded(sql), "server sessions")


async def _session_of(connection: SqlConnection) -> int:
    return int((await connection.execute(session_id_sql(connection))).scalar())


async def _sessions_alive(sql: SqlConnection, sessions: set[int]) -> set[int]:
    rows = (await sql.execute(sessions_alive_sql(sql, sessions))).rows
    return {int(row[0]) for row in rows}


async def _counts(sql: SqlConnection) -> dict[int, int]:
    return {int(row[0]): int(row[1]) for row in (await sql.execute(READ_ALL)).rows}


async def _seed(sql: SqlConnection, values: dict[int, int]) -> None:
    for key, value in values.items():
        await sql.execute(INSERT, {"key": key, "value": value})


@asynccontextmanager
async def _row_held(holder: SqlConnection, key: int) -> AsyncIterator[None]:
    """Row `key` locked by `holder` (its transaction incremented it) while the block runs;
    committed after."""
    locked = asyncio.Event()
    release = asyncio.Event()

    async def hold_the_row() -> None:
        async with holder.transaction() as tx:
            await tx.execute(INCREMENT, {"key": key})
            locked.set()
            await release.wait()

    holding = asyncio.create_task(hold_the_row())
    try:
        await locked.wait()
        yield
    finally:
        release.set()
        await holding


@contextmanager
def recording(connection: SqlConnection) -> Iterator[list[str]]:
    sent: list[str] = []
    remove = connection.add_statement_listener(lambda statement, _params: sent.append(statement))
    try:
        yield sent
    finally:
        remove()


class Counted:
    """A step factory that counts how often it was asked for a fresh step (attempts)."""

    def __init__(self, make: Callable[[], Step[Any]]) -> None:
        self.make = make
        self.attempts = 0

    def __call__(self) -> Step[Any]:
        self.attempts += 1
        return self.make()


# --- drivers and URLs -------------------------------------------------------------------------


async def test_the_raw_driver_is_psycopg_aiomysql_or_the_stdlib_sqlite(db: SqlConnection) -> None:
    await db.ping()
    if embedded(db):
        assert isinstance(db._runner._raw, sqlite3.Connection)
        return
    async with db._runner.connection() as raw:
        assert isinstance(raw, raw_connection_class(db))


async def test_driver_url_forms_reach_the_same_database(db: SqlConnection, sql_url: str) -> None:
    await _seed(db, {1: 41})
    rest = sql_url.split("://", 1)[1]
    forms = {
        "sqlite": ["sqlite+pysqlite", "sqlite+aiosqlite"],
        "postgresql": ["postgresql+psycopg2", "postgresql+psycopg"],
        "mysql": ["mysql+pymysql", "mariadb", "mysql+aiomysql"],
    }[db.dialect_name]
    for form in forms:
        other = SqlConnection(f"{form}://{rest}")
        try:
            assert (await other.execute(READ, {"key": 1})).scalar() == 41
            assert other.dialect_name == db.dialect_name
            assert other.capabilities == db.capabilities
        finally:
            await other.close()


# --- what is sent -------------------------------------------------------------------------------


async def test_a_single_statement_is_sent_alone_without_begin_or_commit(db: SqlConnection) -> None:
    with recording(db) as sent:
        result = await db.execute(INSERT, {"key": 1, "value": 0})
    assert sent == [db.compiled(INSERT).sql]
    assert result.rowcount == 1
    with recording(db) as sent:
        assert (await db.execute(READ, {"key": 1})).scalar() == 0
    assert sent == [db.compiled(READ).sql]


async def test_insert_if_absent_sends_one_statement_whatever_the_answer(db: SqlConnection) -> None:
    statement = db.ops.insert_if_absent(counters, ["id"])
    with recording(db) as sent:
        assert await db.insert_if_absent(statement, {"id": 1, "n": 5}) is True
        assert await db.insert_if_absent(statement, {"id": 1, "n": 6}) is False
    assert sent == [db.compiled(statement).sql] * 2
    assert await _counts(db) == {1: 5}


async def test_a_transaction_step_sends_begin_its_statements_and_commit(db: SqlConnection) -> None:
    def step() -> Step[int]:
        yield Exec(INSERT, {"key": 1, "value": 0})
        yield Exec(INCREMENT, {"key": 1})
        return int((yield Exec(READ, {"key": 1})).scalar())

    with recording(db) as sent:
        assert await db.run(step) == 1
    begin = db.dialect.BEGIN
    assert sent == [
        begin,
        db.compiled(INSERT).sql,
        db.compiled(INCREMENT).sql,
        db.compiled(READ).sql,
        "COMMIT",
    ]


async def test_the_server_counts_exactly_the_statements_the_listener_saw(
    db: SqlConnection, sql_url: str
) -> None:
    require(counts_session_statements(db), "per-session statement counter")
    connection = SqlConnection(sql_url, pool_size=1)
    questions = "SHOW SESSION STATUS LIKE 'Questions'"

    async def asked() -> int:
        return int((await connection.execute(questions)).rows[0][1])

    def step() -> Step[None]:
        yield Exec(INSERT, {"key": 1, "value": 0})
        yield Exec("SELECT 1/0", {})  # warns: no hidden SHOW WARNINGS may follow
        yield Exec(INCREMENT, {"key": 1})

    try:
        before = await asked()
        with recording(connection) as sent:
            await connection.execute("SELECT 1/0")
            await connection.run(step)
        after = await asked()
        assert len(sent) == 1 + 5
        assert after - before == len(sent) + 1  # and the first SHOW itself
    finally:
        await connection.close()


async def test_a_step_without_transaction_sends_only_its_statements(db: SqlConnection) -> None:
    def step() -> Step[None]:
        yield Exec(INSERT, {"key": 1, "value": 0})
        yield Exec(INCREMENT, {"key": 1})

    with recording(db) as sent:
        await db.run(step, transaction=False)
    assert sent == [db.compiled(INSERT).sql, db.compiled(INCREMENT).sql]
    assert await _counts(db) == {1: 1}


async def test_statements_with_percent_signs_run_with_and_without_params(db: SqlConnection) -> None:
    modulo = sa.select(sa.literal_column("7") % sa.literal_column("4"))
    assert (await db.execute(modulo)).scalar() == 3
    assert (await db.execute(sa.text("SELECT 7 % 4"))).scalar() == 3
    assert (await db.execute("SELECT '100%'")).scalar() == "100%"
    with_params = sa.select(sa.bindparam("a", type_=sa.Integer) % 4)
    assert (await db.execute(with_params, {"a": 7})).scalar() == 3


async def test_literal_defaults_are_merged_into_the_callers_params(db: SqlConnection) -> None:
    await _seed(db, {1: 0})
    set_to_42 = sa.update(counters).where(C.id == sa.bindparam("key")).values(n=42)
    assert (await db.execute(set_to_42, {"key": 1})).rowcount == 1
    assert await _counts(db) == {1: 42}
    assert db.compiled(set_to_42) is db.compiled(set_to_42)


# --- failures inside a step ------------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["python", "sql"])
async def test_an_exception_in_a_step_rolls_it_back_and_the_connection_is_reused(
    db: SqlConnection, sql_url: str, failure: str
) -> None:
    connection = SqlConnection(sql_url, pool_size=1)
    try:
        await connection.ping()
        session = None if embedded(db) else await _session_of(connection)

        def step() -> Step[None]:
            yield Exec(INSERT, {"key": 1, "value": 0})
            if failure == "python":
                raise RuntimeError("the step failed")
            yield Exec(INSERT, {"key": 1, "value": 1})  # a duplicate key

        counted = Counted(step)
        with recording(connection) as sent:
            with pytest.raises(Exception) as raised:
                await connection.run(counted)
        if failure == "python":
            assert isinstance(raised.value, RuntimeError)
        else:
            assert connection.ops.is_unique_violation(raised.value)
        assert counted.attempts == 1
        assert sent[0] in ("BEGIN", "BEGIN IMMEDIATE")
        assert sent[-1] == "ROLLBACK"
        assert "COMMIT" not in sent
        assert await _counts(db) == {}
        if embedded(db):
            assert connection._runner._raw.in_transaction is False
        else:
            # The same raw connection served the next call: returned to the pool healthy.
            assert await _session_of(connection) == session
            assert connection._runner.open_connections == 1
        await connection.execute(INSERT, {"key": 2, "value": 0})
        assert await _counts(db) == {2: 0}
    finally:
        await connection.close()


async def test_a_failed_step_on_sqlite_leaves_no_write_lock_behind(
    db: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    require(embedded(db), "database-wide write lock")

    def step() -> Step[None]:
        yield Exec(INSERT, {"key": 1, "value": 0})
        raise RuntimeError("mid-way")

    with pytest.raises(RuntimeError):
        await db.run(step)
    other = new_connection()
    started = time.monotonic()
    await other.execute(INSERT, {"key": 2, "value": 0})
    # A leftover BEGIN IMMEDIATE would make this wait out the 10 s busy timeout.
    assert time.monotonic() - started < 2
    assert await _counts(db) == {2: 0}


async def test_a_non_retryable_error_is_raised_at_once(db: SqlConnection) -> None:
    await _seed(db, {1: 0})
    duplicate = Counted(lambda: _one(INSERT, {"key": 1, "value": 1}))
    with pytest.raises(Exception) as raised:
        await db.run(duplicate)
    assert db.ops.is_unique_violation(raised.value)
    assert duplicate.attempts == 1

    broken = Counted(lambda: _one("SELEC 1"))
    with pytest.raises(Exception) as raised:
        await db.run(broken, transaction=False)
    assert not db.ops.is_retryable(raised.value)
    assert broken.attempts == 1


# --- transient conflicts ------------------------------------------------------------------------


def _crossing(sql: SqlConnection, first: int, second: int) -> Step[str]:
    """Lock `first`, wait, then lock `second`: run against its mirror, a deadlock."""
    yield Exec(INCREMENT, {"key": first})
    yield Exec(sleep_sql(sql, 0.5), {})
    yield Exec(INCREMENT, {"key": second})
    return "done"


async def test_a_real_deadlock_is_retried_and_both_steps_apply_once(
    db: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    _server_only(db)
    await _seed(db, {1: 0, 2: 0})
    one, two = new_connection(), new_connection()
    await asyncio.gather(one.ping(), two.ping())  # warm: both steps start together
    forward = Counted(lambda: _crossing(one, 1, 2))
    backward = Counted(lambda: _crossing(two, 2, 1))
    assert await asyncio.gather(one.run(forward), two.run(backward)) == ["done", "done"]
    assert sorted([forward.attempts, backward.attempts]) == [1, 2]
    assert await _counts(db) == {1: 2, 2: 2}


async def test_a_real_deadlock_is_classified_retryable(
    db: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    _server_only(db)
    await _seed(db, {1: 0, 2: 0})
    one, two = new_connection(), new_connection()
    await asyncio.gather(one.ping(), two.ping())
    # Bare generators are not re-run: the deadlock surfaces.
    outcomes = await asyncio.gather(
        one.run(_crossing(one, 1, 2)), two.run(_crossing(two, 2, 1)), return_exceptions=True
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1 and outcomes.count("done") == 1
    error = errors[0]
    assert is_deadlock(db, error)
    assert db.ops.is_retryable(error)
    assert not db.ops.is_unique_violation(error)
    assert not db.ops.is_disconnect(error)
    # The loser rolled back: only the winner's two increments are there.
    assert sum((await _counts(db)).values()) == 2


async def test_a_serialization_failure_is_retried_on_postgresql(
    db: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    require(
        repeatable_read_raises_serialization_failures(db),
        "serialization failures under REPEATABLE READ",
    )
    await _seed(db, {1: 0})
    other = new_connection()
    await other.ping()

    def read_then_write() -> Step[int]:
        yield Exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", {})
        seen = int((yield Exec(READ, {"key": 1})).scalar())
        yield Exec(sleep_sql(db, 0.5), {})
        yield Exec(SET_N, {"key": 1, "value": seen + 1})
        return seen

    counted = Counted(read_then_write)

    async def concurrent_write() -> None:
        await asyncio.sleep(0.2)
        await other.execute(INCREMENT, {"key": 1})

    seen, _ = await asyncio.gather(db.run(counted), concurrent_write())
    assert counted.attempts == 2
    assert seen == 1
    assert await _counts(db) == {1: 2}

    # The same failure from a bare generator surfaces, classified retryable.
    async def write_again() -> None:
        await asyncio.sleep(0.2)
        await other.execute(INCREMENT, {"key": 1})

    outcomes = await asyncio.gather(
        db.run(read_then_write()), write_again(), return_exceptions=True
    )
    error = outcomes[0]
    assert isinstance(error, Exception)
    assert getattr(error, "sqlstate", None) == "40001"
    assert db.ops.is_retryable(error)


async def test_a_lock_not_granted_within_its_bound_is_a_lock_timeout_never_retried(
    db: SqlConnection, sql_url: str, new_connection: Callable[[], SqlConnection]
) -> None:
    """A row lock another session holds past `lock_ms` ends the wait in a typed error naming
    the lock; the step is not run again (twelve more waits would turn 1 s into minutes),
    and it applied nothing."""
    _server_only(db)
    await _seed(db, {1: 0})
    holder = new_connection()
    waiter = SqlConnection(sql_url, timeouts=Timeouts(lock_ms=300))
    try:
        async with _row_held(holder, 1):
            counted = Counted(lambda: _one(INCREMENT, {"key": 1}))
            with pytest.raises(StoreTimeoutError) as raised:
                await waiter.run(counted)
            assert raised.value.what == "lock"
            assert not isinstance(raised.value, CommitOutcomeUnknownError)
            assert counted.attempts == 1
    finally:
        await waiter.close()
    assert await _counts(db) == {1: 1}  # the holder's increment only


async def test_a_sqlite_writer_waits_for_another_connections_write_lock(
    db: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    require(embedded(db), "busy timeout on the database-wide write lock")
    await _seed(db, {1: 0})
    other = new_connection()
    counted = Counted(lambda: _one(INCREMENT, {"key": 1}))
    async with other.transaction() as holder:  # BEGIN IMMEDIATE: the write lock, held
        await holder.execute(INCREMENT, {"key": 1})
        started = time.monotonic()
        writer = asyncio.create_task(db.run(counted))
        await asyncio.sleep(0.5)
        assert not writer.done()
    result = await writer
    assert time.monotonic() - started >= 0.45
    assert result.rowcount == 1
    assert counted.attempts == 1  # it waited (busy_timeout); it was not retried
    assert await _counts(db) == {1: 2}


async def test_a_sqlite_busy_error_is_a_lock_timeout_not_a_retry(db: SqlConnection) -> None:
    """A busy error reaching a classifier has already waited its whole bound: retrying it
    would multiply the bound (12 tries of the lock wait), so it is a lock timeout."""
    require(embedded(db), "busy error of an embedded database (SQLITE_BUSY)")
    path = db._runner.path
    holder = db.ops.connect_sync(path, 0)
    victim = db.ops.connect_sync(path, 0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        victim.execute("PRAGMA busy_timeout = 0")
        with pytest.raises(sqlite3.OperationalError) as raised:
            victim.execute("BEGIN IMMEDIATE")
        assert db.ops.is_lock_timeout(raised.value)
        assert not db.ops.is_retryable(raised.value)
        assert not db.ops.is_unique_violation(raised.value)
        assert not db.ops.is_disconnect(raised.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        victim.close()


def _exclusively_locked(path: str) -> sqlite3.Connection:
    """Another connection holding the database file's exclusive lock, as the last connection
    of a WAL database does while it checkpoints and deletes the log on close."""
    holder = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    holder.execute("PRAGMA journal_mode = DELETE")
    holder.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_opening_a_sqlite_connection_waits_out_a_lock_another_connection_holds(
    tmp_path: Any,
) -> None:
    # Opening used to set its session with busy timeout 0: a connection opened while another
    # closed (and held the file's lock for a moment) failed with "database is locked".
    dialect = inline_dialect("sqlite")
    path = str(tmp_path / "opened.sqlite")
    holder = _exclusively_locked(path)
    # A release from another thread a little later: the open below has begun to wait by then
    # or begins after it; either way it must succeed within its 30 s bound.
    release = threading.Timer(0.2, holder.execute, args=("COMMIT",))
    release.start()
    try:
        raw = dialect.connect_sync(path, 30_000)
    finally:
        release.join()
        holder.close()
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    finally:
        raw.close()


def test_opening_a_sqlite_connection_waits_no_longer_than_its_lock_bound(tmp_path: Any) -> None:
    dialect = inline_dialect("sqlite")
    path = str(tmp_path / "held.sqlite")
    holder = _exclusively_locked(path)
    try:
        with pytest.raises(sqlite3.OperationalError) as raised:
            dialect.connect_sync(path, 50)
        assert dialect.is_busy(raised.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


async def test_errors_are_classified_on_this_database(db: SqlConnection) -> None:
    await _seed(db, {1: 0})
    with pytest.raises(Exception) as raised:
        await db.execute(INSERT, {"key": 1, "value": 0})
    duplicate = raised.value
    assert db.ops.is_unique_violation(duplicate)
    assert not db.ops.is_retryable(duplicate)
    assert not db.ops.is_disconnect(duplicate)

    with pytest.raises(Exception) as raised:
        await db.execute("SELEC 1")
    syntax = raised.value
    assert not db.ops.is_unique_violation(syntax)
    assert not db.ops.is_retryable(syntax)
    assert not db.ops.is_disconnect(syntax)


async def test_a_statement_timeout_is_not_a_disconnect(db: SqlConnection) -> None:
    _server_only(db)
    require(sessions_kept(db), "session kept between transactions (a pooler lends its sessions)")
    raw = await db.ops.connect(db.url, db.timeouts)
    try:
        setup, slow = statement_past_its_bound(db)
        for statement in setup:
            await db.drive(raw, _one(statement), False)
        with pytest.raises(Exception) as raised:
            await db.drive(raw, _one(slow), False)
        assert not db.ops.is_disconnect(raised.value)
        assert not db.ops.is_retryable(raised.value)
        assert (await db.drive(raw, _one("SELECT 1"), False)).scalar() == 1
    finally:
        await db.ops.close(raw)


async def test_a_killed_session_is_classified_a_disconnect(db: SqlConnection) -> None:
    _server_only(db)
    require(sessions_kept(db), "session kept between transactions (a pooler lends its sessions)")
    raw = await db.ops.connect(db.url, db.timeouts)
    try:
        session = (await db.drive(raw, _one(session_id_sql(db)), False)).scalar()
        await db.execute(kill_sql(db, session))
        await asyncio.sleep(0.2)
        with pytest.raises(Exception) as raised:
            await db.drive(raw, _one("SELECT 1"), False)
        assert db.ops.is_disconnect(raised.value)
        assert not db.ops.is_retryable(raised.value)
        assert not db.ops.is_unique_violation(raised.value)
        # And once the driver knows it is closed.
        with pytest.raises(Exception) as raised:
            await db.drive(raw, _one("SELECT 1"), False)
        assert db.ops.is_disconnect(raised.value)
    finally:
        await db.ops.close(raw)


# --- the pool -------------------------------------------------------------------------------


async def test_the_pool_never_opens_more_than_pool_size_connections(
    db: SqlConnection, sql_url: str
) -> None:
    if embedded(db):
        connection = SqlConnection(sql_url, pool_size=4)
        await _seed(db, {1: 0})
        try:
            await asyncio.gather(
                *(connection.run(lambda: _one(INCREMENT, {"key": 1})) for _ in range(50))
            )
        finally:
            await connection.close()
        assert await _counts(db) == {1: 50}
        return
    connection = SqlConnection(sql_url, pool_size=4)
    slow = f"{session_id_sql(db)}, {sleep_expression(db, 0.02)}"
    try:
        sessions = await asyncio.gather(*(connection.run(lambda: _one(slow)) for _ in range(50)))
        distinct = {int(result.rows[0][0]) for result in sessions}
        assert len(distinct) == 4
        assert connection._runner.open_connections == 4
        assert await _sessions_alive(db, distinct) == distinct
    finally:
        await connection.close()


async def test_a_step_cancelled_while_waiting_for_a_connection_frees_nothing_it_did_not_take(
    db: SqlConnection, sql_url: str
) -> None:
    _server_only(db)
    connection = SqlConnection(sql_url, pool_size=1)
    try:
        session = await _session_of(connection)
        holder = asyncio.create_task(connection.execute(sleep_sql(db, 0.5)))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError) as raised:
            await asyncio.wait_for(connection.execute("SELECT 1"), 0.1)
        assert not isinstance(raised.value, StoreUnavailableError)
        waiter = asyncio.create_task(connection.execute("SELECT 1"))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await holder
        assert connection._runner.open_connections == 1
        assert await _session_of(connection) == session
    finally:
        await connection.close()


async def test_a_waiter_cancelled_after_its_wake_up_passes_the_connection_on(
    db: SqlConnection, sql_url: str
) -> None:
    _server_only(db)
    connection = SqlConnection(sql_url, pool_size=1)
    try:
        await connection.ping()
        async with connection._runner.connection():
            first = asyncio.create_task(connection.execute("SELECT 1"))
            second = asyncio.create_task(connection.execute("SELECT 2"))
            await asyncio.sleep(0.05)
        # The connection is back and `first` was woken for it; cancelled before it ran, it
        # must hand the wake-up on, or `second` waits for ever beside an idle connection.
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert (await asyncio.wait_for(second, 2)).scalar() == 2
    finally:
        await connection.close()


async def test_a_step_cancelled_mid_statement_discards_its_connection(
    db: SqlConnection, sql_url: str
) -> None:
    _server_only(db)
    connection = SqlConnection(sql_url, pool_size=1)
    try:
        await connection.ping()

        def step() -> Step[None]:
            yield Exec(INSERT, {"key": 1, "value": 0})
            yield Exec(sleep_sql(db, 2), {})

        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(connection.run(step), 0.3)
        assert time.monotonic() - started < 1.5  # not held until the statement ends
        assert connection._runner.open_connections == 0
        assert (await connection.execute("SELECT 1")).scalar() == 1
        assert connection._runner.open_connections == 1
        for _ in range(50):  # the server rolls the discarded session's transaction back
            if await _counts(db) == {}:
                break
            await asyncio.sleep(0.1)
        assert await _counts(db) == {}
    finally:
        await connection.close()


async def test_a_connection_killed_while_idle_is_replaced_unnoticed(
    db: SqlConnection, sql_url: str
) -> None:
    _server_only(db)
    connection = SqlConnection(sql_url, pool_size=1)
    try:
        session = await _session_of(connection)
        await db.execute(kill_sql(db, session))
        await asyncio.sleep(0.2)
        replacement = await _session_of(connection)
        assert replacement != session
        assert connection._runner.open_connections == 1
    finally:
        await connection.close()


async def test_a_connection_killed_mid_statement_is_discarded_and_the_next_call_works(
    db: SqlConnection, sql_url: str
) -> None:
    _server_only(db)
    connection = SqlConnection(sql_url, pool_size=1)
    try:
        session = await _session_of(connection)
        # A read that lost its session changes nothing when sent again: it is, on a new one.
        slow = asyncio.create_task(connection.execute(sleep_sql(db, 1)))
        await asyncio.sleep(0.3)
        await db.execute(kill_sql(db, session))
        await slow
        assert connection._runner.open_connections == 1
        assert await _session_of(connection) != session
        assert connection._runner.open_connections == 1
        # A write that lost its session may have applied: its outcome is unknown, and it is
        # not sent again.
        session = await _session_of(connection)
        write = "UPDATE connection_test_counters SET n = n + 1 WHERE id = 1 AND " + sleep_condition(
            db, 1
        )
        await _seed(db, {1: 0})
        slow = asyncio.create_task(connection.execute(write))
        await asyncio.sleep(0.3)
        await db.execute(kill_sql(db, session))
        with pytest.raises(CommitOutcomeUnknownError) as raised:
            await slow
        assert connection.ops.is_disconnect(raised.value.__cause__)
        assert connection._runner.open_connections == 0
    finally:
        await connection.close()


async def test_a_transaction_killed_before_commit_is_run_again(
    db: SqlConnection, sql_url: str
) -> None:
    _server_only(db)
    connection = SqlConnection(sql_url, pool_size=1)
    try:
        session = await _session_of(connection)

        def step() -> Step[str]:
            yield Exec(INCREMENT, {"key": 1})
            yield Exec(sleep_sql(db, 0.8), {})
            return "done"

        await _seed(db, {1: 0})
        counted = Counted(step)
        running = asyncio.create_task(connection.run(counted))
        await asyncio.sleep(0.3)
        await db.execute(kill_sql(db, session))
        assert await running == "done"
        assert counted.attempts == 2
        assert await _counts(db) == {1: 1}
    finally:
        await connection.close()


async def test_close_closes_every_connection_and_later_calls_fail(
    db: SqlConnection, sql_url: str
) -> None:
    require(sessions_kept(db), "session closed with its client (a pooler keeps its sessions)")
    connection = SqlConnection(sql_url, pool_size=3)
    if embedded(db):
        await connection.ping()
        await connection.close()
        assert connection._runner._raw is None
    else:
        slow = f"{session_id_sql(db)}, {sleep_expression(db, 0.1)}"
        results = await asyncio.gather(*(connection.execute(slow) for _ in range(3)))
        sessions = {int(r.rows[0][0]) for r in results}
        assert len(sessions) == 3
        await connection.close()
        for _ in range(50):
            if not await _sessions_alive(db, sessions):
                break
            await asyncio.sleep(0.05)
        assert await _sessions_alive(db, sessions) == set()
    with pytest.raises(StoreUnavailableError):
        await connection.execute("SELECT 1")
    with pytest.raises(StoreUnavailableError):
        await connection.run(lambda: _one("SELECT 1"))
    with pytest.raises(StoreUnavailableError):
        async with connection.transaction():
            pass


async def test_two_connections_serialise_their_writers(
    db: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    await _seed(db, {1: 0})
    read_locked = db.ops.for_update(READ)

    def increment() -> Step[None]:
        seen = int((yield Exec(read_locked, {"key": 1})).scalar())
        yield Exec(SET_N, {"key": 1, "value": seen + 1})

    other = new_connection()
    await asyncio.gather(*(c.run(increment) for c in [db, other] * 100))
    assert await _counts(db) == {1: 200}


# --- sharing a SQLAlchemy transaction -------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_drive_on_shares_the_callers_transaction(db: SqlConnection, outcome: str) -> None:
    def step() -> Step[int]:
        yield Exec(INSERT, {"key": 1, "value": 10})
        return int((yield Exec(READ, {"key": 1})).scalar())

    with pytest.raises(RuntimeError) if outcome == "rollback" else _nothing():
        async with db.transaction() as tx:
            assert await db.drive_on(tx, step()) == 10
            await tx.execute(INSERT, {"key": 2, "value": 20})
            # Each sees the other's uncommitted row: one transaction.
            assert (await tx.execute(READ, {"key": 1})).scalar() == 10
            assert (await db.drive_on(tx, _one(READ, {"key": 2}))).scalar() == 20
            if outcome == "rollback":
                raise RuntimeError("roll it all back")
    expected = {1: 10, 2: 20} if outcome == "commit" else {}
    assert await _counts(db) == expected


@contextmanager
def _nothing() -> Iterator[None]:
    yield


async def test_conflicts_that_persist_past_retry_ms_end_in_a_typed_retry_timeout(
    db: SqlConnection, sql_url: str
) -> None:
    """A step that meets a transient conflict on every attempt is run again until
    `retry_ms`, then fails typed (`what="retry"`), never as the raw driver error."""
    require(row_locks(db), "transient conflicts (SQLite has none)")
    conflict = deadlock_error(db)
    # 1 s: room for a second attempt on a loaded machine (with 200 ms, a first attempt
    # that took that long was the only one). The pool's connection is opened first, so no
    # attempt waits for a new one.
    connection = SqlConnection(sql_url, timeouts=Timeouts(retry_ms=1_000))
    await connection.execute("SELECT 1")
    attempts = 0

    def step() -> Step[None]:
        nonlocal attempts
        attempts += 1
        yield Exec("SELECT 1", {})
        raise conflict

    try:
        with pytest.raises(StoreTimeoutError) as raised:
            await connection.run(step)
        assert raised.value.what == "retry"
        assert attempts >= 2
        assert raised.value.__cause__ is conflict
    finally:
        await connection.close()


async def test_a_transaction_cancelled_mid_statement_never_hands_its_connection_out_again(
    db: SqlConnection, sql_url: str
) -> None:
    # The connection a cancelled statement was on may be mid-statement (aiomysql answers
    # every later call on it with "Cancelled during execution"): the pool must drop it.
    _server_only(db)
    connection = SqlConnection(sql_url, pool_size=1)
    try:

        def sleep() -> Step[None]:
            yield Exec(sleep_sql(db, 2), {})

        async def slow() -> None:
            # As a fenced effect runs its statements: on the transaction's driver connection.
            async with connection.transaction() as tx:
                await connection.drive_on(tx, sleep())

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slow(), 0.3)
        for _ in range(3):
            async with connection.transaction() as tx:
                assert (await tx.execute(sa.text("SELECT 1"))).scalar() == 1
    finally:
        await connection.close()


# --- scripts: a transaction in one text -----------------------------------------------------

INSERT_OTHER = sa.insert(counters).values(id=sa.bindparam("other"), n=sa.bindparam("other_n"))
INCREMENT_OTHER = sa.update(counters).where(C.id == sa.bindparam("other")).values(n=C.n + 1)

_SCRIPT_FAULTS = (
    "CREATE TABLE connection_test_faults (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=MyISAM",
    "INSERT INTO connection_test_faults VALUES (1, 0)",
    f"""CREATE TRIGGER connection_test_fault BEFORE INSERT ON {counters.name} FOR EACH ROW
BEGIN
  IF NEW.id = 2 AND (SELECT n FROM connection_test_faults WHERE id = 1) > 0 THEN
    UPDATE connection_test_faults SET n = n - 1 WHERE id = 1;
    SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'forced deadlock';
  END IF;
END""",
)
"""A trigger that fails the next `n` inserts of row 2 with the server's deadlock error (its
count in a table the failed transaction's rollback leaves alone)."""


async def test_a_script_is_one_text_and_one_transaction(db: SqlConnection) -> None:
    """`Script`: `BEGIN`, its statements and `COMMIT` in one text, one round trip; every row
    committed together."""
    require(scripts(db), "statement scripts")
    with recording(db) as sent:
        await db.execute(
            Script(INSERT, INSERT_OTHER), {"key": 1, "value": 10, "other": 2, "other_n": 20}
        )
    assert len(sent) == 1
    assert sent[0].startswith("BEGIN;") and sent[0].endswith(";\nCOMMIT"), sent
    assert await _counts(db) == {1: 10, 2: 20}
    # Parameters share one namespace: one name, one value.
    one, two = (SET_N.values(n=sa.bindparam("n_default", value=v)) for v in (1, 2))
    with pytest.raises(ValueError, match="two values"):
        db.compiled(Script(one, two))


async def test_a_script_whose_statement_fails_applies_nothing_and_drops_its_connection(
    db: SqlConnection, sql_url: str
) -> None:
    """The server stops a script at the statement that fails and leaves its transaction open:
    the connection is dropped (the server rolls the transaction back), never handed out
    again with the first statement's row uncommitted."""
    require(scripts(db), "statement scripts")
    connection = SqlConnection(sql_url, pool_size=1)
    try:
        session = await _session_of(connection)
        counted = Counted(
            lambda: _one(
                Script(INSERT, INSERT_OTHER), {"key": 1, "value": 0, "other": 1, "other_n": 0}
            )
        )
        with pytest.raises(Exception) as raised:
            await connection.run(counted, transaction=False)
        assert connection.ops.is_unique_violation(raised.value)
        assert counted.attempts == 1
        assert await _counts(db) == {}
        assert await _session_of(connection) != session
        assert session not in await _sessions_alive(db, {session})
        await connection.execute(INSERT, {"key": 3, "value": 0})
        assert await _counts(db) == {3: 0}
    finally:
        await connection.close()


async def test_a_script_meeting_a_held_lock_ends_in_a_lock_timeout_and_applies_nothing(
    db: SqlConnection, sql_url: str, new_connection: Callable[[], SqlConnection]
) -> None:
    """A script waiting on a row lock past `lock_ms` ends in the typed lock timeout; what it
    wrote before the wait is rolled back with its dropped connection."""
    require(scripts(db), "statement scripts")
    await _seed(db, {2: 0})
    holder = new_connection()
    waiter = SqlConnection(sql_url, timeouts=Timeouts(lock_ms=300))
    try:
        async with _row_held(holder, 2):
            with pytest.raises(StoreTimeoutError) as raised:
                await waiter.execute(
                    Script(INSERT, INCREMENT_OTHER), {"key": 1, "value": 0, "other": 2}
                )
            assert raised.value.what == "lock"
            assert not isinstance(raised.value, CommitOutcomeUnknownError)
    finally:
        await waiter.close()
    assert await _counts(db) == {2: 1}  # the holder's increment; the script's row is gone


async def test_a_script_that_meets_a_deadlock_is_run_again_and_applies_once(
    db: SqlConnection, sql_url: str
) -> None:
    """A deadlock (the server's error 1213, forced by a trigger on the script's second
    statement) undoes the script; the step runs again and its rows are written once."""
    require(scripts(db), "statement scripts")
    for statement in _SCRIPT_FAULTS:
        await db.execute(statement)
    try:
        await db.execute("UPDATE connection_test_faults SET n = 2 WHERE id = 1")
        counted = Counted(
            lambda: _one(
                Script(INSERT, INSERT_OTHER), {"key": 1, "value": 0, "other": 2, "other_n": 0}
            )
        )
        await db.run(counted, transaction=False)
        assert counted.attempts == 3
        assert await _counts(db) == {1: 0, 2: 0}
    finally:
        await db.execute("DROP TRIGGER IF EXISTS connection_test_fault")
        await db.execute("DROP TABLE IF EXISTS connection_test_faults")
