"""Fixtures of the migration tests: a scratch database of their own.

Migrations create and drop the whole schema, so they never run on the database
the other test modules use: on a server they get `<database>_migrations`
(created for the session, dropped after), on SQLite a file of their own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from migration_support import drop_every_table, scratch_database
from sqlalchemy.engine import make_url
from support.capabilities import embedded_url


@pytest.fixture(scope="session")
def scratch_url(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database for migration tests alone, on the server (or SQLite) under test."""
    url = make_url(database_url)
    if embedded_url(database_url):
        yield f"sqlite:///{tmp_path_factory.mktemp('migrations') / 'migrations.sqlite'}"
        return
    with scratch_database(database_url, f"{url.database}_migrations") as scratch:
        yield scratch


@pytest.fixture
def empty_url(scratch_url: str) -> str:
    """The scratch database with no table at all (dropped before the test)."""
    drop_every_table(scratch_url)
    return scratch_url
