"""A MySQL/MariaDB session's lock waits bounded for a while (a migration's body): its
metadata-lock and row-lock waits, set on the connection and given back after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa

_LOCK_WAITS = ("lock_wait_timeout", "innodb_lock_wait_timeout")
"""The session's bounds on a statement's lock waits: metadata locks (DDL), row locks."""


@contextlib.contextmanager
def bounded_lock_waits(connection: sa.Connection, lock_ms: int) -> Iterator[None]:
    """The session's lock waits bounded by `lock_ms` (whole seconds, at least one) while in
    the body, then given back their values before it (unless the connection was lost)."""
    seconds = max(1, -(-int(lock_ms) // 1000))
    with connection.begin():
        before = connection.exec_driver_sql(
            "SELECT " + ", ".join(f"@@SESSION.{name}" for name in _LOCK_WAITS)
        ).one()
        connection.exec_driver_sql(
            "SET " + ", ".join(f"SESSION {name} = {seconds}" for name in _LOCK_WAITS)
        )
    try:
        yield
    finally:
        if not connection.invalidated:
            with contextlib.suppress(Exception), connection.begin():
                connection.exec_driver_sql(
                    "SET "
                    + ", ".join(
                        f"SESSION {name} = {int(value)}"
                        for name, value in zip(_LOCK_WAITS, before, strict=True)
                    )
                )
