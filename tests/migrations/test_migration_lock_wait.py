"""A migration's statements wait for a lock another session holds for `lock_ms` at most.

An application's transaction left open on a table a revision alters (it read a row and has
not ended) holds a lock the revision's DDL needs. Unbounded, the upgrade waited for it as
long as it stayed open, and on PostgreSQL and MySQL every later statement on that table
queued behind the waiting DDL. Bounded, the upgrade stops at `lock_ms` with
`StoreTimeoutError(what="lock")`, the database at the revision it was at, and runs to head
once the transaction has ended. On SQLite a reader never holds up a writer (WAL): the
upgrade runs through.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from migration_support import connected
from sqlalchemy.engine import make_url
from support.capabilities import embedded_url

from agboss_sql._dialects import dialect_for
from agboss_sql.cli import FAILED, MISUSED, main
from agboss_sql.contracts.errors import StoreTimeoutError
from agboss_sql.sql import migrate

pytestmark = pytest.mark.database

BEFORE = "0008_lz4_values"
ALTERED = "agboss_checkpoint_blobs"
"""The table the next revision (0009_appended_values) alters on every database."""

REPOSITORY = Path(__file__).resolve().parents[2]

RELEASE_S = 60
"""When the holder's transaction ends on its own: were the bound not applied, the upgrade
would wait this long and then succeed, failing the test rather than hanging it."""


@pytest.fixture
def at_before(empty_url: str) -> str:
    migrate.upgrade(empty_url, BEFORE)
    return empty_url


@pytest.fixture
def reader(at_before: str) -> Iterator[sa.Connection]:
    """A session whose transaction has read the table the next revision alters, and stays
    open (at most `RELEASE_S`)."""
    with connected(at_before) as connection:
        connection.execute(sa.text(f"SELECT count(*) FROM {ALTERED}")).scalar()
        release = threading.Timer(RELEASE_S, connection.rollback)
        release.start()
        try:
            yield connection
        finally:
            release.cancel()
            if connection.in_transaction():
                connection.rollback()


def _columns(url: str) -> set[str]:
    with connected(url) as connection:
        return {c["name"] for c in sa.inspect(connection).get_columns(ALTERED)}


def test_an_open_transaction_stops_the_upgrade_at_its_bound(
    at_before: str, reader: sa.Connection
) -> None:
    if embedded_url(at_before):
        done = migrate.upgrade(at_before, lock_ms=1_000)
        assert (done.before, done.after) == (BEFORE, migrate.head())
        reader.rollback()
        return
    with pytest.raises(StoreTimeoutError) as stopped:
        migrate.upgrade(at_before, lock_ms=1_000)
    assert stopped.value.what == "lock"
    assert stopped.value.bound_ms == 1_000
    assert f"the database is at revision {BEFORE}, as before" in str(stopped.value)
    # 0009's one statement waited: on every database nothing of the upgrade stayed.
    assert migrate.current(at_before) == BEFORE
    assert "base_version" not in _columns(at_before)
    assert reader.in_transaction(), "the holder's transaction ended before the bound"

    reader.rollback()
    done = migrate.upgrade(at_before, lock_ms=1_000)
    assert (done.before, done.after) == (BEFORE, migrate.head())
    assert "base_version" in _columns(at_before)


def test_the_bound_leaves_the_callers_connection_as_it_was(at_before: str) -> None:
    """`upgrade_on` a caller's own connection: after it, that connection's statements wait
    for locks as they did before (the bound was the migration's only)."""
    with connected(at_before) as connection:
        before = _lock_waits(connection)
        migrate.upgrade_on(connection, lock_ms=2_000)
        assert not connection.in_transaction()
        assert _lock_waits(connection) == before
    assert migrate.current(at_before) == migrate.head()


def _lock_waits(connection: sa.Connection) -> tuple[object, ...]:
    """The session's bounds on lock waits, each database's own (none on SQLite but its
    busy timeout)."""
    with connection.begin():
        if embedded_url(str(connection.engine.url)):
            return (connection.exec_driver_sql("PRAGMA busy_timeout").scalar(),)
        if connection.dialect.name == "postgresql":
            return (connection.exec_driver_sql("SHOW lock_timeout").scalar(),)
        return tuple(
            connection.exec_driver_sql(
                "SELECT @@SESSION.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout"
            ).one()
        )


def test_a_bound_below_one_millisecond_is_refused(at_before: str) -> None:
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="lock_ms"):
            migrate.upgrade(at_before, lock_ms=bad)  # type: ignore[arg-type]
    assert migrate.current(at_before) == BEFORE


def test_the_command_takes_the_bound_and_says_why_it_stopped(
    at_before: str, reader: sa.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["upgrade", "--url", at_before, "--lock-ms", "0"]) == MISUSED
    assert "--lock-ms must be at least 1" in capsys.readouterr().err
    assert migrate.current(at_before) == BEFORE

    status = main(["upgrade", "--url", at_before, "--lock-ms", "1000"])
    err = capsys.readouterr().err
    if embedded_url(at_before):
        assert status == 0, err
        return
    assert status == FAILED
    assert len(err.splitlines()) == 1, err
    assert "waited 1000 ms (lock_ms) for a lock another session holds" in err
    assert f"the database is at revision {BEFORE}" in err
    assert migrate.current(at_before) == BEFORE


def _alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`alembic` in the checkout (`alembic.ini`), on `url`."""
    ini = str(REPOSITORY / "alembic.ini")
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", ini, "-x", f"url={url}", *args],
        capture_output=True,
        text=True,
        timeout=RELEASE_S * 2,
        check=False,
    )


def test_alembic_in_a_checkout_takes_the_bound_as_an_x_argument(
    at_before: str, reader: sa.Connection
) -> None:
    refused = _alembic(at_before, "-x", "lock_ms=soon", "upgrade", "head")
    assert refused.returncode != 0
    assert "-x lock_ms must be a whole number of milliseconds" in refused.stderr
    assert migrate.current(at_before) == BEFORE

    done = _alembic(at_before, "-x", "lock_ms=1000", "upgrade", "head")
    if embedded_url(at_before):
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode != 0, "the upgrade waited out the holder"
    # The same typed error as the library's and the command's, not the driver's.
    assert "StoreTimeoutError" in done.stderr, done.stderr
    assert f"the upgrade to {migrate.head()} stopped" in done.stderr, done.stderr
    assert "waited 1000 ms (lock_ms) for a lock another session holds" in done.stderr
    assert f"the database is at revision {BEFORE}" in done.stderr, done.stderr
    assert migrate.current(at_before) == BEFORE
    assert reader.in_transaction(), "the holder's transaction ended before the bound"


def test_the_migration_locks_wait_ends_in_a_typed_error(
    at_before: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another migration holds the migration lock past `MIGRATION_LOCK_TIMEOUT_S` (1 s
    here): the upgrade ends in `StoreTimeoutError(what="lock")` saying so, nothing ran."""
    monkeypatch.setattr(
        dialect_for(make_url(at_before).get_backend_name()), "MIGRATION_LOCK_TIMEOUT_S", 1
    )
    with connected(at_before) as holder, migrate.migration_lock(holder):
        with pytest.raises(StoreTimeoutError) as waited:
            migrate.upgrade(at_before)
    assert waited.value.what == "lock"
    assert waited.value.bound_ms == 1_000
    assert "another agboss-sql migration is still running" in str(waited.value)
    assert migrate.current(at_before) == BEFORE
