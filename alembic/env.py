"""Alembic environment of agboss-sql.

The database URL comes from `-x url=...`, else the config's `sqlalchemy.url`
(set by `agboss_sql.sql.migrate.alembic_config`), else `AGBOSS_DATABASE_URL`,
else `sqlite:///.agboss/agboss.sqlite`. A connection handed over in
`config.attributes["connection"]` (Alembic's "Sharing a Connection" recipe,
used by `agboss_sql.sql.migrate`) is used as it is, inside the caller's
migration lock; otherwise the environment connects and takes the lock itself, its
statements waiting up to `-x lock_ms=N` (default `migrate.LOCK_MS`) for another session's
locks: past that the command ends in `StoreTimeoutError`, naming the revision the database
is left at, as `agboss-sql upgrade` does.
"""

from __future__ import annotations

from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context

from agboss_sql.sql import migrate

config = context.config

if config.config_file_name is not None and config.file_config.has_section("loggers"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    given = context.get_x_argument(as_dictionary=True).get("url")
    return migrate.resolve_url(given or config.get_main_option("sqlalchemy.url"))


def _run_offline() -> None:
    url = migrate.sync_url(_url())
    context.configure(
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **migrate.context_options(url.get_backend_name()),
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: sa.Connection) -> None:
    context.configure(connection=connection, **migrate.context_options(connection.dialect.name))
    # Inside the lock's transaction this is a no-op: the lock commits, then releases.
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    shared = config.attributes.get("connection")
    if shared is not None:
        _run_on(shared)
        return
    lock_ms = _lock_ms()
    with (
        migrate.connect(_url()) as connection,
        migrate.migrating(connection, _target(), direction=_command(), lock_ms=lock_ms),
    ):
        _run_on(connection)


def _target() -> str:
    """The revision the command migrates to (`head` resolved to its id); `head` for a
    command that names none (`check`, `current`)."""
    try:
        given = context.get_revision_argument()
    except KeyError:
        given = None
    return str(given) if given else "head"


def _command() -> str:
    """The alembic command running (`upgrade`, `downgrade`, `stamp`, ...), for the errors."""
    cmd = getattr(config.cmd_opts, "cmd", None)
    return cmd[0].__name__ if cmd else "migration"


def _lock_ms() -> int:
    """`-x lock_ms=N`: how long a statement waits for a lock another session holds
    (`migrate.LOCK_MS` by default)."""
    given = context.get_x_argument(as_dictionary=True).get("lock_ms")
    if given is None:
        return migrate.LOCK_MS
    if not given.isdigit():
        raise ValueError(f"-x lock_ms must be a whole number of milliseconds: {given!r}")
    return int(given)  # its range is `migration_lock`'s to check


if context.is_offline_mode():
    _run_offline()
else:
    _run_online()
