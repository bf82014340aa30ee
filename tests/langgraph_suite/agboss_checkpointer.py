"""`SqlCheckpointSaver` fixtures for LangGraph's own checkpointer-parametrized tests.

Copied into a LangGraph checkout's `libs/langgraph/tests/` by `patch_conftest.py` (see
`run.sh`); not collected by this project's test run. Every test gets an empty store: a fresh
copy of a migrated SQLite file, or the three checkpoint tables emptied on the server database
named by `AGBOSS_LG_POSTGRES_URL` / `AGBOSS_LG_MYSQL_URL`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import sqlalchemy as sa

from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.migrate import upgrade
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints
from agboss_sql.testing.database import sync_url

_ENV = {"postgres": "AGBOSS_LG_POSTGRES_URL", "mysql": "AGBOSS_LG_MYSQL_URL"}
_migrated: set[str] = set()
_template: list[Path] = []


def _sqlite_url() -> str:
    """A fresh SQLite file at the project's head revision (a copy of one migrated file)."""
    if not _template:
        folder = Path(tempfile.mkdtemp(prefix="agboss-lg-"))
        template = folder / "template.sqlite"
        upgrade(f"sqlite:///{template}")
        _template.append(template)
    target = Path(tempfile.mkdtemp(prefix="agboss-lg-")) / "checkpoints.sqlite"
    shutil.copyfile(_template[0], target)
    return f"sqlite:///{target}"


def _server_url(database: str) -> str:
    """The server database of `database`, migrated once, its checkpoint tables emptied."""
    url = os.environ.get(_ENV[database])
    if not url:
        raise RuntimeError(f"set {_ENV[database]} to run the agboss_{database} fixtures")
    if url not in _migrated:
        upgrade(url)
        _migrated.add(url)
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            for table in (checkpoint_writes, checkpoint_blobs, checkpoints):
                conn.execute(sa.delete(table))
    finally:
        engine.dispose()
    return url


def _url(database: str) -> str:
    return _sqlite_url() if database == "sqlite" else _server_url(database)


@contextmanager
def agboss_checkpointer(database: str) -> Iterator[SqlCheckpointSaver]:
    """A sync-used saver on an empty store of `database` (sqlite, postgres, mysql)."""
    with SqlCheckpointSaver.from_conn_string(_url(database)) as saver:
        yield saver


@asynccontextmanager
async def agboss_checkpointer_aio(database: str) -> AsyncIterator[SqlCheckpointSaver]:
    """An async-used saver on an empty store of `database` (sqlite, postgres, mysql)."""
    async with SqlCheckpointSaver.from_conn_string(_url(database)) as saver:
        yield saver
