"""Helpers of the migration tests, importable by the processes they spawn."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import make_url

from agboss_sql._dialects import dialect_for
from agboss_sql._dialects.mysql import MIGRATION_LOCK_TABLE
from agboss_sql.sql import migrate
from agboss_sql.sql.schema import metadata


@contextlib.contextmanager
def connected(url: str) -> Iterator[sa.Connection]:
    """A plain synchronous connection to `url` (no lock, no transaction begun)."""
    engine = sa.create_engine(migrate.sync_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


@contextlib.contextmanager
def scratch_database(url: str, name: str, options: str = "") -> Iterator[str]:
    """A database `name` of its own on `url`'s server, created anew (`utf8mb4_bin` on MySQL
    and MariaDB, as the project asks; then `options`, more of `CREATE DATABASE`), its URL
    yielded, dropped after."""
    # Imported here: the processes the tests spawn import this module without it.
    from support.sql import server_admin

    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), name
    server = make_url(url)
    admin_url, quote, force = server_admin(migrate.sync_url(server))
    engine = sa.create_engine(admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")
            charset = " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin" if quote == "`" else ""
            connection.exec_driver_sql(f"CREATE DATABASE {quote}{name}{quote}{charset}{options}")
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")
        engine.dispose()


def table_names(url: str) -> set[str]:
    """Every table of the database at `url`, but the migration lock row's table a Galera
    cluster keeps (created by the first migration there, outside the schema)."""
    with connected(url) as connection:
        return set(sa.inspect(connection).get_table_names()) - {MIGRATION_LOCK_TABLE}


def drop_every_table(url: str) -> None:
    """Drop every table of the database at `url`, ours or not."""
    with connected(url) as connection, connection.begin():
        found = sa.MetaData()
        found.reflect(connection)
        found.drop_all(connection)


def schema_difference(url: str) -> list[Any]:
    """What autogenerate finds between the database at `url` and the project's metadata,
    compared exactly as the migration environment compares."""
    with connected(url) as connection:
        context = MigrationContext.configure(
            connection, opts=migrate.context_options(connection.dialect.name)
        )
        return list(compare_metadata(context, metadata))


def version_rows(url: str, table: str = migrate.VERSION_TABLE) -> list[str]:
    """The revisions recorded in a version table."""
    with connected(url) as connection:
        rows = connection.execute(sa.text(f"SELECT version_num FROM {table}"))
        return sorted(row[0] for row in rows)


def upgrade_in_process(
    url: str,
    barrier: Barrier | None,
    results: Queue[Any],
    locked: bool,
    calling: Event | None = None,
) -> None:
    """A process's `migrate.upgrade(url)`, its answer (or error) put on `results`;
    `calling` is set just before the call.

    With `locked`, the real upgrade, started when every process reached `barrier`.
    Without, the broken twin: the migration lock replaced by a plain transaction, every
    process waiting at `barrier` inside its transaction before its first read.
    """
    try:
        if not locked:
            _replace_the_lock(url, barrier)
        elif barrier is not None:
            barrier.wait(timeout=60)
        if calling is not None:
            calling.set()
        done = migrate.upgrade(url)
        results.put(("ok", done.before, done.after))
    except BaseException as exc:
        results.put(("error", f"{type(exc).__name__}: {exc}", None))


def _replace_the_lock(url: str, barrier: Barrier | None) -> None:
    ops = dialect_for(make_url(url).get_backend_name())

    @contextlib.contextmanager
    def transaction_only(connection: sa.Connection, lock_ms: int) -> Iterator[None]:
        with connection.begin():
            if barrier is not None:
                barrier.wait(timeout=60)
            yield

    ops.lock_database = transaction_only
