"""What the database under test can do, asked of its connection, never of its name.

Tests skip by capability through these helpers, so the day the dialect interface names its
capabilities differently, only this module changes.
"""

from __future__ import annotations

import pytest

from agboss_sql.sql.connection import SqlConnection


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


# The connection has no flag for the two below: the dialect is asked here, in this one place.


def counts_session_statements(connection: SqlConnection) -> bool:
    """Whether the server counts each session's statements (MySQL/MariaDB's `Questions`)."""
    return connection.dialect_name == "mysql"


def repeatable_read_raises_serialization_failures(connection: SqlConnection) -> bool:
    """Whether a write under REPEATABLE READ that conflicts with a concurrent commit fails
    with a serialization failure (PostgreSQL) instead of waiting on a row lock."""
    return connection.dialect_name == "postgresql"
