"""Fixtures of the migration tests: a scratch database of their own.

Migrations create and drop the whole schema, so they never run on the database
the other test modules use: on a server they get `<database>_migrations`
(created for the session, dropped after), on SQLite a file of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from migration_support import drop_every_table
from sqlalchemy.engine import make_url
from support.capabilities import embedded_url
from support.sql import server_admin

from agboss_sql.sql.migrate import sync_url


@pytest.fixture(scope="session")
def scratch_url(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database for migration tests alone, on the server (or SQLite) under test."""
    url = make_url(database_url)
    if embedded_url(database_url):
        yield f"sqlite:///{tmp_path_factory.mktemp('migrations') / 'migrations.sqlite'}"
        return
    name = f"{url.database}_migrations"
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), name
    admin_url, quote, force = server_admin(sync_url(url))
    engine = sa.create_engine(admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    charset = " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin" if quote == "`" else ""
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")
            connection.exec_driver_sql(f"CREATE DATABASE {quote}{name}{quote}{charset}")
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")
        engine.dispose()


@pytest.fixture
def empty_url(scratch_url: str) -> str:
    """The scratch database with no table at all (dropped before the test)."""
    drop_every_table(scratch_url)
    return scratch_url
