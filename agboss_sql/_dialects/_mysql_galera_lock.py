"""The migration lock on a MariaDB Galera cluster: a row every taker writes (`GET_LOCK` is
local to one node there)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator

import sqlalchemy as sa

from agboss_sql._dialects.base import migration_lock_timeout

MIGRATION_LOCK_TABLE = "agboss_migration_lock"
"""The table of the migration lock row on a Galera cluster (outside the project's metadata:
it must exist before the first migration, and migrations never touch it)."""
MIGRATION_LOCK_POLL_S = 0.2


@contextlib.contextmanager
def galera_lock(
    connection: sa.Connection,
    name: str,
    timeout_s: int,
    conflict: Callable[[BaseException], bool],
) -> Iterator[None]:
    """Hold the migration lock row: a row every taker writes, so of takers on different
    nodes one commits and the others fail certification (or find the row taken) and wait.
    A holder that died without releasing it holds it until its expiry,
    `timeout_s` after it was taken. `conflict` tells a lost race (retried) from an error."""
    holder = uuid.uuid4().hex
    with connection.begin():
        # DDL runs in total order on every node: concurrent creators all succeed.
        connection.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {MIGRATION_LOCK_TABLE} ("
            "name VARCHAR(64) NOT NULL PRIMARY KEY, holder VARCHAR(64) NOT NULL, "
            "expires_at BIGINT NOT NULL) ENGINE=InnoDB"
        )
    now_ms = "FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000)"
    # Assignments run left to right: the holder is decided first, the expiry follows it.
    take = sa.text(
        f"INSERT INTO {MIGRATION_LOCK_TABLE} (name, holder, expires_at) "
        f"VALUES (:name, :holder, {now_ms} + :ttl) ON DUPLICATE KEY UPDATE "
        f"holder = IF(expires_at <= {now_ms}, VALUES(holder), holder), "
        "expires_at = IF(holder = VALUES(holder), VALUES(expires_at), expires_at)"
    )
    read = sa.text(f"SELECT holder FROM {MIGRATION_LOCK_TABLE} WHERE name = :name")
    params = {"name": name, "holder": holder, "ttl": timeout_s * 1000}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with connection.begin():
                connection.execute(take, params)
            with connection.begin():
                if connection.execute(read, params).scalar() == holder:
                    break
        except sa.exc.DBAPIError as exc:
            # Another taker's write won certification, or its insert came first.
            if not conflict(exc):
                raise
        if time.monotonic() >= deadline:
            raise migration_lock_timeout(timeout_s, f"a row of {MIGRATION_LOCK_TABLE}")
        time.sleep(MIGRATION_LOCK_POLL_S)
    try:
        yield
    finally:
        if not connection.invalidated:
            with connection.begin():
                connection.execute(
                    sa.text(
                        f"DELETE FROM {MIGRATION_LOCK_TABLE} "
                        "WHERE name = :name AND holder = :holder"
                    ),
                    params,
                )
