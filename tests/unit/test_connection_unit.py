"""`SqlConnection` without a database: URL handling, statement caches, the pool's bookkeeping
under cancellation and unreachable servers (a local TCP port that accepts and never answers,
or refuses)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from agboss_sql._dialects import mysql, postgresql, sqlite
from agboss_sql.contracts.errors import StoreTimeoutError, StoreUnavailableError
from agboss_sql.sql.connection import SqlBuilder, SqlConnection, Suffixed, normalize_url
from agboss_sql.sql.timeouts import Timeouts

# --- URLs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("sqlite:////tmp/agboss/x.sqlite", "sqlite+aiosqlite"),
        ("sqlite+pysqlite:////tmp/agboss/x.sqlite", "sqlite+aiosqlite"),
        ("sqlite+aiosqlite:////tmp/agboss/x.sqlite", "sqlite+aiosqlite"),
        ("postgresql://u:p@db:5433/app", "postgresql+psycopg"),
        ("postgresql+psycopg2://u:p@db:5433/app", "postgresql+psycopg"),
        ("postgresql+asyncpg://u:p@db:5433/app", "postgresql+psycopg"),
        ("mysql://u:p@db:3307/app", "mysql+aiomysql"),
        ("mysql+pymysql://u:p@db:3307/app", "mysql+aiomysql"),
        ("mariadb://u:p@db:3307/app", "mysql+aiomysql"),
        ("mariadb+mariadbconnector://u:p@db:3307/app", "mysql+aiomysql"),
    ],
)
def test_a_plain_or_driver_url_becomes_the_async_driver_url(url: str, driver: str) -> None:
    normalized = normalize_url(url)
    assert normalized.drivername == driver
    original = sa.make_url(url)
    assert (normalized.host, normalized.port, normalized.database) == (
        original.host,
        original.port,
        original.database,
    )
    assert (normalized.username, normalized.password) == (original.username, original.password)


def test_url_query_is_kept() -> None:
    normalized = normalize_url("postgresql://u@db/app?application_name=agboss&sslmode=disable")
    assert dict(normalized.query) == {"application_name": "agboss", "sslmode": "disable"}


@pytest.mark.parametrize("url", ["oracle://u:p@db/app", "mssql+pyodbc://u:p@db/app"])
def test_an_unsupported_database_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="use sqlite, postgresql or mysql"):
        normalize_url(url)
    with pytest.raises(ValueError, match="use sqlite, postgresql or mysql"):
        SqlConnection(url)


@pytest.mark.parametrize(
    "url",
    ["sqlite:///:memory:", "sqlite://", "sqlite:///", "sqlite+aiosqlite:///:memory:"],
)
def test_an_in_memory_or_empty_sqlite_path_is_refused_with_a_clear_error(url: str) -> None:
    with pytest.raises(ValueError, match=r"use a file") as raised:
        SqlConnection(url)
    assert "one database per connection" in str(raised.value)


@pytest.mark.parametrize(
    ("url", "dialect", "module"),
    [
        ("sqlite:///{tmp}/a.sqlite", "sqlite", sqlite),
        ("postgresql://u@db/app", "postgresql", postgresql),
        ("mysql://u@db/app", "mysql", mysql),
        ("mariadb://u@db/app", "mysql", mysql),
    ],
)
async def test_backend_is_the_dialect_or_dialect_colon_database(
    url: str, dialect: str, module: object, tmp_path: Path
) -> None:
    url = url.format(tmp=tmp_path)
    plain = SqlConnection(url)
    named = SqlConnection(url, database="orders")
    try:
        assert plain.dialect_name == dialect
        assert plain.ops is module
        assert plain.backend == dialect
        assert named.backend == f"{dialect}:orders"
    finally:
        await plain.close()
        await named.close()


async def test_sqlite_creates_the_files_directory(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "deeper" / "store.sqlite"
    connection = SqlConnection(f"sqlite:///{path}")
    try:
        assert path.parent.is_dir()
        await connection.ping()
        assert path.exists()
    finally:
        await connection.close()


async def test_repr_hides_the_password() -> None:
    connection = SqlConnection("postgresql://user:secret@db/app")
    assert "secret" not in repr(connection)
    await connection.close()


# --- statement caches ----------------------------------------------------------------------

_T = sa.table("t", sa.column("id"), sa.column("n"), sa.column("state"))


@pytest.mark.parametrize("url", ["postgresql://u@db/app", "mysql://u@db/app"])
async def test_compiled_is_cached_per_statement_object(url: str) -> None:
    connection = SqlConnection(url)
    statement = sa.select(_T.c.n).where(_T.c.id == sa.bindparam("id"))
    twin = sa.select(_T.c.n).where(_T.c.id == sa.bindparam("id"))
    first = connection.compiled(statement)
    assert connection.compiled(statement) is first
    assert connection.compiled(twin) is not first
    assert connection.compiled(twin).sql == first.sql
    assert "%(id)s" in first.sql
    await connection.close()


async def test_compiled_merges_literal_defaults_and_caller_params_win() -> None:
    connection = SqlConnection("postgresql://u@db/app")
    statement = (
        sa.update(_T).where(_T.c.id == sa.bindparam("id")).values(n=5, state=sa.literal("done"))
    )
    compiled = connection.compiled(statement)
    literal_values = sorted(str(value) for value in compiled.defaults.values() if value is not None)
    assert literal_values == ["5", "done"]
    merged = connection._cache.params(compiled, {"id": 7})
    assert merged is not None
    assert merged["id"] == 7
    assert sorted(str(v) for k, v in merged.items() if k != "id") == ["5", "done"]
    await connection.close()


async def test_compiled_keeps_plain_text_verbatim_and_appends_a_suffix() -> None:
    connection = SqlConnection("mysql://u@db/app")
    assert connection.compiled("SELECT '100%'").sql == "SELECT '100%'"
    inner = sa.insert(_T).values(id=sa.bindparam("id"))
    suffixed = Suffixed(inner, " RETURNING id")
    assert connection.compiled(suffixed).sql == connection.compiled(inner).sql + " RETURNING id"
    await connection.close()


async def test_an_expanding_in_is_refused_when_compiled() -> None:
    connection = SqlConnection("postgresql://u@db/app")
    statement = sa.select(_T.c.id).where(_T.c.id.in_(sa.bindparam("ids", expanding=True)))
    with pytest.raises(ValueError, match="expanding"):
        connection.compiled(statement)
    await connection.close()


async def test_prepared_builds_a_statement_set_once_per_factory_and_time_source() -> None:
    connection = SqlConnection("postgresql://u@db/app")
    built: list[tuple[str, bool]] = []

    class Statements:
        def __init__(self, sql: SqlBuilder) -> None:
            built.append((sql.ops.NAME, sql.database_time))
            self.source, self.now = sql.now()

    class Other(Statements):
        pass

    first = connection.prepared(Statements)
    assert connection.prepared(Statements) is first
    assert connection.prepared(Statements, database_time=False) is first
    on_database_time = connection.prepared(Statements, database_time=True)
    assert on_database_time is not first
    assert connection.prepared(Statements, database_time=True) is on_database_time
    assert connection.prepared(Other) is not first
    assert built == [("postgresql", False), ("postgresql", True), ("postgresql", False)]
    await connection.close()


# --- the pool against unreachable servers ----------------------------------------------------


class BlackHole:
    """A TCP port that accepts connections and never sends a byte."""

    def __init__(self) -> None:
        self.accepted = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.append(writer)

    async def stop(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def black_hole() -> AsyncIterator[BlackHole]:
    hole = BlackHole()
    await hole.start()
    yield hole
    await hole.stop()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_a_connect_cancelled_by_a_timeout_frees_its_slot_and_stays_a_timeout(
    scheme: str, black_hole: BlackHole
) -> None:
    connection = SqlConnection(f"{scheme}://u@127.0.0.1:{black_hole.port}/app", pool_size=1)
    try:
        for attempt in (1, 2, 3):
            with pytest.raises(TimeoutError) as raised:
                await asyncio.wait_for(connection.ping(), 0.3)
            assert not isinstance(raised.value, StoreUnavailableError)
            # The slot came back: each attempt (pool of one) reached the server anew.
            assert black_hole.accepted == attempt
            assert connection._runner.open_connections == 0
    finally:
        await connection.close()


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_a_connect_cancelled_by_its_caller_re_raises_cancelled_error(
    scheme: str, black_hole: BlackHole
) -> None:
    connection = SqlConnection(f"{scheme}://u@127.0.0.1:{black_hole.port}/app", pool_size=1)
    try:
        task = asyncio.create_task(connection.ping())
        while black_hole.accepted == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert connection._runner.open_connections == 0
    finally:
        await connection.close()


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_a_refused_connect_is_store_unavailable_and_frees_its_slot(scheme: str) -> None:
    port = _closed_port()
    connection = SqlConnection(f"{scheme}://u:secret@127.0.0.1:{port}/app", pool_size=1)
    try:
        for _ in range(2):
            with pytest.raises(StoreUnavailableError) as raised:
                await connection.ping()
            assert "secret" not in str(raised.value)
            assert str(port) in str(raised.value)
            assert connection._runner.open_connections == 0
    finally:
        await connection.close()


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_waiters_for_a_connection_fail_when_the_connection_is_closed(
    scheme: str, black_hole: BlackHole
) -> None:
    connection = SqlConnection(f"{scheme}://u@127.0.0.1:{black_hole.port}/app", pool_size=1)
    connecting = asyncio.create_task(connection.ping())
    waiting = asyncio.create_task(connection.ping())
    while black_hole.accepted == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    await connection.close()
    connecting.cancel()
    with pytest.raises(StoreUnavailableError):
        await asyncio.wait_for(waiting, 2)
    with pytest.raises(asyncio.CancelledError):
        await connecting
    with pytest.raises(StoreUnavailableError):
        await connection.ping()


async def test_close_makes_later_calls_fail_on_sqlite(tmp_path: Path) -> None:
    connection = SqlConnection(f"sqlite:///{tmp_path / 'closed.sqlite'}")
    await connection.ping()
    await connection.close()
    await connection.close()  # idempotent
    with pytest.raises(StoreUnavailableError):
        await connection.ping()
    with pytest.raises(StoreUnavailableError):
        await connection.execute("SELECT 1")
    with pytest.raises(StoreUnavailableError):
        async with connection.transaction():
            pass


async def test_an_unopenable_sqlite_file_is_store_unavailable(tmp_path: Path) -> None:
    directory = tmp_path / "a-directory.sqlite"
    directory.mkdir()
    connection = SqlConnection(f"sqlite:///{directory}")
    try:
        with pytest.raises(StoreUnavailableError, match="cannot open"):
            await connection.ping()
    finally:
        await connection.close()


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_a_black_holed_connect_ends_in_a_connect_timeout(
    scheme: str, black_hole: BlackHole
) -> None:
    """A server that accepts and never answers: the connect wait ends at `connect_ms` in a
    typed error naming the wait, and its pool slot comes back."""
    bounds = Timeouts(connect_ms=300)
    connection = SqlConnection(
        f"{scheme}://u@127.0.0.1:{black_hole.port}/app", pool_size=1, timeouts=bounds
    )
    try:
        for attempt in (1, 2):
            # The outer bound only stops a hang from hanging the suite; generous for a
            # loaded machine.
            with pytest.raises(StoreTimeoutError) as raised:
                await asyncio.wait_for(connection.ping(), 30)
            assert raised.value.what == "connect"
            assert raised.value.bound_ms == 300
            assert black_hole.accepted == attempt
            assert connection._runner.open_connections == 0
    finally:
        await connection.close()


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_all_pooled_connections_busy_ends_in_a_pool_timeout(
    scheme: str, black_hole: BlackHole
) -> None:
    """With the only pooled connection stuck connecting, a second call waits for the pool
    at most `pool_ms`, then fails typed, naming the pool."""
    bounds = Timeouts(connect_ms=20_000, pool_ms=200)
    connection = SqlConnection(
        f"{scheme}://u@127.0.0.1:{black_hole.port}/app", pool_size=1, timeouts=bounds
    )
    stuck = asyncio.create_task(connection.ping())
    try:
        while black_hole.accepted == 0:
            await asyncio.sleep(0.01)
        with pytest.raises(StoreTimeoutError) as raised:
            await asyncio.wait_for(connection.ping(), 30)
        assert raised.value.what == "pool"
    finally:
        stuck.cancel()
        with contextlib.suppress(BaseException):
            await stuck
        await connection.close()


def test_timeouts_refuse_non_positive_bounds() -> None:
    with pytest.raises(ValueError, match="lock_ms"):
        Timeouts(lock_ms=0)
    with pytest.raises(ValueError, match="pool_ms"):
        Timeouts(pool_ms=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Timeouts"):
        SqlConnection("sqlite:///x.sqlite", timeouts={"lock_ms": 5})  # type: ignore[arg-type]


# --- the backoff between attempts ----------------------------------------------------------


def test_the_backoff_doubles_from_4_ms_up_to_200_ms_with_jitter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agboss_sql.sql import _backoff

    monkeypatch.setattr(_backoff.random, "uniform", lambda low, high: high)
    assert [_backoff.backoff_s(n) for n in (1, 2, 3, 6, 7, 12, 5000)] == pytest.approx(
        [0.006, 0.012, 0.024, 0.192, 0.3, 0.3, 0.3]
    )
    monkeypatch.setattr(_backoff.random, "uniform", lambda low, high: low)
    assert _backoff.backoff_s(1) == pytest.approx(0.002)


# --- a statement deadline meeting a cancellation ----------------------------------------------


async def _bounded_forever(connection: SqlConnection) -> tuple[asyncio.Task[object], float]:
    """A statement that never answers, under the runner's client deadline; the task and
    the deadline in seconds."""
    from agboss_sql.sql._pool_runner import PoolRunner

    runner = connection._runner
    assert isinstance(runner, PoolRunner)
    never: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    task = asyncio.get_running_loop().create_task(runner.bounded(never, None))
    await asyncio.sleep(0)  # sent: the deadline is armed
    return task, runner._statement_s


async def test_a_statement_past_its_client_deadline_is_a_typed_error() -> None:
    from agboss_sql.sql._deadline import DeadlinePassed

    connection = SqlConnection("mysql://u@127.0.0.1:1/x", timeouts=Timeouts(statement_ms=10))
    task, _ = await _bounded_forever(connection)
    with pytest.raises(DeadlinePassed):
        await task


@pytest.mark.parametrize("dialect_url", ["mysql://u@127.0.0.1:1/x", "postgresql://u@127.0.0.1:1/x"])
async def test_a_cancellation_that_meets_a_statement_deadline_stays_a_cancellation(
    dialect_url: str,
) -> None:
    """A process frozen (SIGSTOP) past a statement's deadline and stopped as it thaws: the
    deadline's timer and the caller's cancellation reach the task in one loop pass. The
    caller's cancellation must win: turned into `DeadlinePassed`, it was swallowed, and a
    worker's loop that handles store errors went on, holding its graceful stop past its
    bound (what the cluster saw on MariaDB right after a thaw)."""
    import time

    connection = SqlConnection(dialect_url, timeouts=Timeouts(statement_ms=10))
    task, deadline_s = await _bounded_forever(connection)
    # The caller's cancel, due just after the deadline; the loop frozen past both (a
    # blocking sleep is the freeze itself here, not a synchronisation).
    asyncio.get_running_loop().call_later(deadline_s, task.cancel)
    time.sleep(deadline_s + 0.05)
    await asyncio.wait([task])
    assert task.cancelled()


def test_an_idle_in_transaction_timeout_is_a_lost_session_on_postgresql() -> None:
    import psycopg.errors

    from agboss_sql._dialects import postgresql

    exc = psycopg.errors.IdleInTransactionSessionTimeout("terminating connection")
    assert postgresql.is_disconnect(exc)
    assert postgresql.is_disconnect(sa.exc.InternalError("INSERT", {}, exc))
    assert not postgresql.is_disconnect(psycopg.errors.UniqueViolation("duplicate"))
