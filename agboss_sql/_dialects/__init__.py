"""What differs per database, behind the same names in each module.

Each dialect module exports: `NAME`, capability flags (`UPDATE_RETURNING`,
`INSERT_RETURNING`, `UPSERT_RETURNING`, `ROW_LOCKS`, `SKIP_LOCKED`),
`BEGIN` (the statement that opens a write transaction), `compile_dialect()`,
`now_ms()` (the database clock in ms), `now_source(database_time)`,
`insert(table)` (the dialect's insert with its upsert), `insert_if_absent`,
`greatest`, `least`, `for_update`, `for_share`, `skip_locked`, `connect(url)` (the raw async
driver connection), `is_retryable(exc)`, `is_unique_violation(exc)`,
`is_disconnect(exc)`, and for migrations `SYNC_DRIVER` (the synchronous driver's
name) and `lock_database(connection)` (the migration lock around one transaction).
"""

from __future__ import annotations

from types import ModuleType


def dialect_module(name: str) -> ModuleType:
    """The module for a SQLAlchemy backend name (`sqlite`, `postgresql`, `mysql`, `mariadb`)."""
    if name == "sqlite":
        from agboss_sql._dialects import sqlite

        return sqlite
    if name == "postgresql":
        from agboss_sql._dialects import postgresql

        return postgresql
    if name in ("mysql", "mariadb"):
        from agboss_sql._dialects import mysql

        return mysql
    raise ValueError(f"unsupported database {name!r}: use sqlite, postgresql or mysql")
