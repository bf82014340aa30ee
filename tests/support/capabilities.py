"""What the database under test can do, asked of its connection, never of its name.

Tests skip by capability through these helpers, so the day the dialect interface names its
capabilities differently, only this module changes. A fixture that runs before any
connection (or a collection-time parametrization) asks the dialect of its URL instead:
what every server of that dialect can do.
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from agboss_sql._dialects import dialect_for
from agboss_sql._dialects._pg_pooling import pooling_of
from agboss_sql._dialects.base import Dialect
from agboss_sql.sql.connection import SqlConnection, normalize_url
from support.server_watch import server_of


def row_locks(connection: SqlConnection) -> bool:
    """Whether the database locks single rows (`SELECT ... FOR UPDATE`); SQLite locks the
    whole database for each writer instead."""
    return connection.capabilities.row_locks


def skip_locked(connection: SqlConnection) -> bool:
    """Whether a locking read can pass over rows another transaction holds (`SKIP LOCKED`)."""
    return connection.capabilities.skip_locked


def update_returning(connection: SqlConnection) -> bool:
    """Whether an `UPDATE` can return the rows it changed (`UPDATE ... RETURNING`)."""
    return connection.capabilities.update_returning


def scripts(connection: SqlConnection) -> bool:
    """Whether a transaction's statements can be sent as one text (`Script`)."""
    return connection.capabilities.scripts


def require(capable: bool, why: str) -> None:
    """Skip the calling test unless `capable`; `why` says what the test needs."""
    if not capable:
        pytest.skip(f"the database under test has no {why}")


def upsert_returning(connection: SqlConnection) -> bool:
    """Whether an upsert can return its row on the server under test (MariaDB can, MySQL 8
    cannot; known once the server first answered)."""
    return connection.capabilities.insert_returning


def embedded(connection: SqlConnection) -> bool:
    """Whether the database runs inside this process, its statements on the caller's
    thread (SQLite's inline runner), rather than behind a server's pool.

    """
    return connection.capabilities.inline


def insert_if_absent_raises(connection: SqlConnection) -> bool:
    """Whether inserting a row that is already there fails (a unique violation the caller
    reads as "already there") instead of being skipped: the MySQL family, whose stores then
    read a row before inserting it."""
    return connection.capabilities.insert_if_absent_raises


def conditional_upsert_returns_row(connection: SqlConnection) -> bool:
    """Whether an upsert with a `WHERE` returns the row it met (`ON CONFLICT DO UPDATE …
    WHERE … RETURNING`), so a claim that finds its row already there needs no read after."""
    capabilities = connection.capabilities
    return capabilities.insert_returning and capabilities.upsert_where


def driver_sends_begin(connection: SqlConnection) -> bool:
    """Whether the async driver sends its own `BEGIN` before a SQLAlchemy transaction's first
    statement (psycopg), a round trip no statement event reports."""
    return connection.dialect.DRIVER_SENDS_BEGIN


def transaction_sends_begin(connection: SqlConnection) -> bool:
    """Whether a SQLAlchemy transaction costs a `BEGIN` round trip of its own: SQLite's
    `BEGIN IMMEDIATE`, or a driver's own `BEGIN`; aiomysql's first statement starts it."""
    return embedded(connection) or driver_sends_begin(connection)


def _dialect_of(url: str) -> Dialect:
    return dialect_for(normalize_url(url).get_backend_name())


def embedded_url(url: str) -> bool:
    """Whether `url` names a database inside this process (a file), not one on a server."""
    return _dialect_of(url).CAPABILITIES.inline


def servers_differ_in_upsert_returning(url: str) -> bool:
    """Whether servers of `url`'s dialect differ in returning an upsert's row (MariaDB does,
    MySQL 8 does not): its stores then have a path for either."""
    return not _dialect_of(url).CAPABILITIES.insert_returning


def proxied_network_path(url: str) -> bool:
    """Whether the database is a server reached over TCP (a host and a port), which a test
    can put a proxy in front of; an embedded file has no network path."""
    return server_of(url) is not None


# The connection has no flag for those below: the dialect is asked here, in this one place.


def counts_session_statements(connection: SqlConnection) -> bool:
    """Whether the server counts each session's statements (MySQL/MariaDB's `Questions`)."""
    return connection.dialect_name == "mysql"


def pool_reset_sends_rollback(connection: SqlConnection) -> bool:
    """Whether a connection given back to the pool is reset with a `ROLLBACK` round trip even
    after a transaction that ended (aiomysql); psycopg skips it on an idle connection."""
    return connection.dialect_name == "mysql"


def lock_waits_in_whole_seconds(url: str) -> bool:
    """Whether the server bounds a lock wait in whole seconds (MySQL/MariaDB's
    `innodb_lock_wait_timeout`), so a bound in milliseconds is rounded up."""
    return _dialect_of(url).NAME == "mysql"


def column_compression(url: str) -> bool:
    """Whether the server compresses a column's values with a method a column names
    (PostgreSQL's `COMPRESSION lz4`, when the server was built with it)."""
    return _dialect_of(url).NAME == "postgresql"


def executed_plan_rows(connection: SqlConnection) -> bool:
    """Whether the server runs a statement under `EXPLAIN (ANALYZE)` and reports the rows
    each node of its plan returned (PostgreSQL)."""
    return connection.dialect_name == "postgresql"


def repeatable_read_raises_serialization_failures(connection: SqlConnection) -> bool:
    """Whether a write under REPEATABLE READ that conflicts with a concurrent commit fails
    with a serialization failure (PostgreSQL) instead of waiting on a row lock."""
    return connection.dialect_name == "postgresql"


def prepares_statements(connection: SqlConnection) -> bool:
    """Whether the driver prepares the statements a connection runs often, each session
    listing its own (psycopg on PostgreSQL, in `pg_prepared_statements`); not behind a
    transaction pooler, where it prepares none."""
    return connection.dialect_name == "postgresql" and pooling_of(connection.url) is None


def sessions_kept(connection: SqlConnection) -> bool:
    """Whether a client connection keeps one server session from one transaction to the next:
    not behind a transaction pooler (`?agboss_pooling=transaction`, PgBouncer's `pool_mode =
    transaction`), which lends its server sessions to whichever client runs a transaction
    and keeps them open when a client closes. A test of a session's own state (a session
    setting, its server id, killing it, seeing it close) needs it."""
    return pooling_of(connection.url) is None


def pooled_url(url: str) -> bool:
    """Whether the database at `url` is reached through a transaction pooler
    (`?agboss_pooling=transaction`), not directly: what a command that connects to the
    server on its own (a ready script's URL) does not know."""
    return pooling_of(make_url(url)) is not None
