"""What differs per database, behind one interface (`base.Dialect`).

Each dialect module (`sqlite`, `postgresql`, `mysql`) implements `base.Dialect` in full,
plus the driver protocol of its kind (`base.InlineDriver` for SQLite, `base.ServerDriver`
for the servers); mypy checks each module against them here. Callers never branch on a
database's name: they read `Capabilities`.
"""

from __future__ import annotations

from agboss_sql._dialects.base import (
    Capabilities,
    Dialect,
    InlineDialect,
    ServerDialect,
    Suffixed,
)


def dialect_for(backend: str) -> Dialect:
    """The dialect of a SQLAlchemy backend name (`sqlite`, `postgresql`, `mysql`,
    `mariadb`); `ValueError` for any other."""
    if backend == "sqlite":
        return inline_dialect(backend)
    return server_dialect(backend)


def inline_dialect(backend: str) -> InlineDialect:
    """The dialect of an embedded database (SQLite)."""
    if backend == "sqlite":
        from agboss_sql._dialects import sqlite

        checked: InlineDialect = sqlite
        return checked
    raise ValueError(f"unsupported database {backend!r}: use sqlite, postgresql or mysql")


def server_dialect(backend: str) -> ServerDialect:
    """The dialect of a server database (PostgreSQL, MySQL/MariaDB)."""
    if backend == "postgresql":
        from agboss_sql._dialects import postgresql

        checked: ServerDialect = postgresql
        return checked
    if backend in ("mysql", "mariadb"):
        from agboss_sql._dialects import mysql

        checked = mysql
        return checked
    raise ValueError(f"unsupported database {backend!r}: use sqlite, postgresql or mysql")


__all__ = [
    "Capabilities",
    "Dialect",
    "InlineDialect",
    "ServerDialect",
    "Suffixed",
    "dialect_for",
    "inline_dialect",
    "server_dialect",
]
