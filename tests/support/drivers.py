"""Each driver's own errors and connection class, for tests that raise what a driver would
raise or check which driver sits under a connection.

The driver is picked by the connection's dialect here, in this one place.
"""

from __future__ import annotations

from typing import Any

from agboss_sql.sql.connection import SqlConnection


def deadlock_error(connection: SqlConnection) -> Exception:
    """The driver's own error for a transaction the server gave up (a deadlock)."""
    if connection.dialect_name == "postgresql":
        import psycopg.errors

        return psycopg.errors.DeadlockDetected("deadlock detected")
    import pymysql.err

    return pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")


def is_deadlock(connection: SqlConnection, error: BaseException) -> bool:
    """Whether `error` is the server's own deadlock error, by its code."""
    if connection.dialect_name == "postgresql":
        return getattr(error, "sqlstate", None) == "40P01"
    return bool(error.args) and error.args[0] == 1213


def lock_timeout_error(connection: SqlConnection) -> Exception:
    """The driver's own error for a lock not granted within its bound."""
    if connection.dialect_name == "postgresql":
        import psycopg.errors

        return psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    if connection.dialect_name == "mysql":
        import pymysql.err

        return pymysql.err.OperationalError(1205, "Lock wait timeout exceeded")
    import sqlite3

    return sqlite3.OperationalError("database is locked")


def raw_connection_class(connection: SqlConnection) -> type[Any]:
    """The class of the raw connections under a server's pool (psycopg's, aiomysql's)."""
    if connection.dialect_name == "postgresql":
        import psycopg

        return psycopg.AsyncConnection
    import aiomysql

    return aiomysql.Connection
