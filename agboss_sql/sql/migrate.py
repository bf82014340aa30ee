"""Schema migrations: Alembic, run synchronously, one instance at a time.

The project's revisions live in their own version table
(`agboss_alembic_version`), so they sit beside an application's own Alembic
project without touching its `alembic_version`. Every upgrade or downgrade
runs on one connection inside the database's migration lock (PostgreSQL: a
session advisory lock; MySQL/MariaDB: `GET_LOCK`; SQLite: the write lock of
`BEGIN IMMEDIATE`), held until the migration has committed: several
instances upgrading at start-up take turns, and each one after the first
finds the schema at head and does nothing.

The Alembic scripts are found inside the installed package (`_alembic`, put
there by the wheel) or, in a checkout, in the repository's `alembic/`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import alembic.command
import alembic.util
import sqlalchemy as sa
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from sqlalchemy.engine import URL

from agboss_sql._dialects import dialect_for
from agboss_sql._dialects._mysql_failover import nodes_of
from agboss_sql._dialects.mysql_collation import Collation, collation_of
from agboss_sql.contracts.errors import (
    SchemaNotReadyError,
    SchemaUnversionedError,
    StoreRefusedError,
    StoreTimeoutError,
)
from agboss_sql.sql.connection import SqlConnection, normalize_url
from agboss_sql.sql.schema import metadata
from agboss_sql.sql.timeouts import Timeouts

VERSION_TABLE = "agboss_alembic_version"
"""The table that holds this project's revision (never Alembic's default `alembic_version`)."""

DATABASE_URL_ENV = "AGBOSS_DATABASE_URL"
"""The environment variable read when no URL is given."""

DEFAULT_DATABASE_URL = "sqlite:///.agboss/agboss.sqlite"
"""The database used when neither a URL nor `AGBOSS_DATABASE_URL` is given."""

LOCK_MS = 10_000
"""How long, by default, a migration's statement waits for a lock another session holds (a
table's, a row's) before the migration stops with `StoreTimeoutError(what="lock")`. Not its
wait for the migration lock, which another migration holds (`MIGRATION_LOCK_TIMEOUT_S` of
each dialect, 600 s): the wait this bounds is behind an application's open transaction,
and on PostgreSQL and MySQL every later statement on that table queues behind the waiting
DDL, so an unbounded wait stalls the application too."""

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Migration:
    """What an upgrade or a downgrade did: the revision before and after it
    (`None`: no revision of this project, the empty "base")."""

    before: str | None
    after: str | None

    @property
    def changed(self) -> bool:
        """Whether the schema moved."""
        return self.before != self.after


def resolve_url(url: str | URL | None = None) -> str:
    """The database URL to migrate: `url` when given, else `AGBOSS_DATABASE_URL`, else
    `DEFAULT_DATABASE_URL`."""
    if url is not None and str(url) != "":
        return url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    return os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL


def sync_url(url: str | URL) -> URL:
    """The URL with the synchronous driver migrations run on (psycopg, PyMySQL or the
    stdlib sqlite3), whatever driver a plain or async `url` names; a MySQL URL's `failover`
    alternates are dropped (an engine of this URL alone connects to its first node; `connect`
    fails over)."""
    parsed = normalize_url(url)
    ops = dialect_for(parsed.get_backend_name())
    if ops.NAME == "mysql":
        from agboss_sql._dialects.mysql import without_failover

        # PyMySQL takes no alternates: `connect` reads them from the URL given it.
        parsed = without_failover(parsed)
    return parsed.set(drivername=f"{ops.NAME}+{ops.SYNC_DRIVER}")


def script_location() -> Path:
    """The Alembic script directory: the installed package's `_alembic` when present
    (a wheel install), else the checkout's `alembic/` (an editable install)."""
    for candidate in (_PACKAGE_DIR / "_alembic", _PACKAGE_DIR.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError(
        f"no Alembic scripts beside {_PACKAGE_DIR}: expected {_PACKAGE_DIR / '_alembic'} "
        "(installed wheel) or ../alembic (checkout); reinstall agboss-sql"
    )


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic `Config` for this project's scripts on `url` (resolved as
    `resolve_url` does), for `alembic.command` functions."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    # configparser interpolates '%': a password may contain it.
    config.set_main_option("sqlalchemy.url", resolve_url(url).replace("%", "%%"))
    return config


def head() -> str:
    """The newest revision of the project's schema."""
    found = ScriptDirectory(str(script_location())).get_current_head()
    if found is None:
        raise RuntimeError(f"no revision under {script_location()}")
    return found


def context_options(backend: str) -> dict[str, Any]:
    """The options the migration environment gives `context.configure` (and a
    comparison of the schema gives `MigrationContext.configure`) on a backend."""
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "render_as_batch": dialect_for(backend).CAPABILITIES.batch_migrations,
        "include_name": _include_name,
        "include_object": _include_object,
        "compare_type": True,
        "compare_server_default": True,
    }


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    # Other tables of the database (an application's own) are not even reflected.
    return type_ != "table" or name in metadata.tables


def _include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    return _include_name(name, type_, None)


def current(url: str | URL | None = None) -> str | None:
    """The project's revision on the database at `url` (`None`: none applied yet). A
    read: a SQLite file that does not exist is not created (its revision is `None`)."""
    if missing_sqlite_file(url) is not None:
        return None
    with connect(url) as connection:
        return _current_on(connection)


def missing_sqlite_file(url: str | URL | None = None) -> Path | None:
    """The path of the SQLite file `url` names when that file does not exist (`None` for
    an existing file, an in-memory database or a server): a read must not create it."""
    target = sync_url(resolve_url(url))
    if not dialect_for(target.get_backend_name()).CAPABILITIES.inline:
        return None
    if target.database in (None, "", ":memory:"):
        return None
    path = Path(target.database)
    return None if path.exists() else path


def sqlite_file_problem(url: str | URL | None = None, *, writes: bool = True) -> str | None:
    """Why the SQLite file `url` names cannot be used, in one line saying what to do
    (`None`: it can, or `url` is not a SQLite file). Its directory must be a directory
    (or one that can be made) and writable: SQLite writes the file, and its `-wal` and
    `-shm` files beside it, even to read a database in WAL mode. With `writes`, a file
    that exists must be writable too. Reads only the file system (as `access(2)`: a
    read-only mount refuses even root)."""
    target = sync_url(resolve_url(url))
    if not dialect_for(target.get_backend_name()).CAPABILITIES.inline:
        return None
    if target.database in (None, "", ":memory:"):
        return None
    path = Path(target.database).absolute()
    fix = "use a path in a writable directory, e.g. --url sqlite:///.agboss/agboss.sqlite"
    existing = path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory, so {path} cannot be made: {fix}"
    if path.is_dir():
        return f"{path} is a directory, not a SQLite file: name a file in it, or {fix}"
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "read" if path.exists() and not writes else "write"
        return (
            f"cannot {what} {path}: its directory {existing} is read-only (SQLite writes "
            f"the file and its -wal and -shm files beside it, even to read): {fix}, or "
            "copy the file to one"
        )
    if writes and path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f"cannot write {path}: the file is read-only: make it writable, or {fix}"
    return None


def head_of(revision: str) -> str:
    """`revision` with `head` resolved to the newest revision's id."""
    return head() if revision == "head" else revision


def stamp(
    url: str | URL | None = None, revision: str = "head", *, force: bool = False
) -> Migration:
    """Record `revision` as the database's revision without running any migration
    (Alembic's `stamp`), under the migration lock: to adopt a database whose agboss tables
    were made some other way (no version table, or a lost one).

    Refused with `SchemaUnversionedError`, nothing written, when no agboss table exists
    (run `upgrade` instead), or when `revision` is the head and the tables differ from
    the head's schema (each difference is listed); `force` stamps regardless."""
    with connect(url) as connection:
        if connection.in_transaction():  # pragma: no cover - a fresh connection
            raise ValueError("the connection is in a transaction")
        with migration_lock(connection):
            before = _current_on(connection)
            target = head_of(revision)
            if not force:
                present = agboss_tables_on(connection)
                if not present:
                    raise SchemaUnversionedError(
                        "no agboss table exists on this database: there is nothing to adopt; "
                        "run `agboss-sql upgrade --url URL` to create the schema"
                    )
                if target == head():
                    differences = schema_differences_on(connection)
                    if differences:
                        listed = "; ".join(differences[:5])
                        more = f" (and {len(differences) - 5} more)" if len(differences) > 5 else ""
                        raise SchemaUnversionedError(
                            f"the agboss tables differ from revision {target}: {listed}{more}; "
                            "bring them in line, stamp the revision they match "
                            "(`--revision REV`), or stamp anyway with `--force`"
                        )
            config = alembic_config(connection.engine.url)
            config.attributes["connection"] = connection
            alembic.command.stamp(config, target, purge=True)
            return Migration(before, _current_on(connection))


def agboss_tables(url: str | URL | None = None) -> set[str]:
    """The tables of the project's schema that exist on the database at `url` (a read:
    a SQLite file that does not exist is not created, and has none)."""
    if missing_sqlite_file(url) is not None:
        return set()
    with connect(url) as connection:
        return agboss_tables_on(connection)


def agboss_tables_on(connection: sa.Connection) -> set[str]:
    """The tables of the project's schema that exist on `connection`'s database."""
    return set(sa.inspect(connection).get_table_names()) & set(metadata.tables)


def collation(url: str | URL | None = None) -> Collation | None:
    """On MySQL and MariaDB, the collation of the database at `url` and of its agboss
    tables (see `agboss_sql._dialects.mysql_collation`: every text column must be
    `utf8mb4_bin`); `None` on the other databases, whose text always compares exactly. A
    read: a SQLite file is not even opened."""
    target = sync_url(resolve_url(url))
    if dialect_for(target.get_backend_name()).NAME != "mysql":
        return None
    with connect(url) as connection:
        return collation_of(connection, [*metadata.tables, VERSION_TABLE])


def schema_differences_on(connection: sa.Connection) -> list[str]:
    """How the agboss tables on `connection`'s database differ from the project's schema
    at head (Alembic's autogenerate comparison), one text per difference; empty when they
    match."""
    from alembic.autogenerate import compare_metadata

    context = MigrationContext.configure(connection, opts=context_options(connection.dialect.name))
    return [_difference(diff) for diff in compare_metadata(context, metadata)]


def _difference(diff: Any) -> str:
    # A difference is a tuple (op, object, ...) or a list of column modifications.
    if isinstance(diff, list):
        return "; ".join(_difference(d) for d in diff)
    op, *rest = diff
    named = [getattr(part, "name", None) for part in rest]
    where = next((n for n in named if n), "")
    if op in ("modify_type", "modify_nullable", "modify_default", "modify_comment"):
        return f"{op} {rest[1]}.{rest[2]}"
    return f"{op} {where}".strip()


async def schema_revision(connection: SqlConnection) -> str | None:
    """The project's revision on `connection`'s database, read through the connection
    itself (one statement; `None`: no version table or no row). A database that cannot be
    reached raises the connection's typed error."""
    try:
        rows = (await connection.execute(sa.select(_VERSION.c.version_num))).rows
    except StoreRefusedError as exc:
        # Every database names the missing table in its error.
        if VERSION_TABLE in str(exc.orig):
            return None
        raise
    return str(rows[0][0]) if rows else None


async def require_head(connection: SqlConnection) -> None:
    """Raise `SchemaNotReadyError` unless `connection`'s database is at the head revision
    (the message names the database and the command to run)."""
    revision, newest = await schema_revision(connection), head()
    if revision == newest:
        return
    url = connection.url.set(drivername=connection.dialect_name)
    shown = url.render_as_string(hide_password=True)
    if revision is None:
        state = "has no agboss schema revision (no agboss_alembic_version row)"
        other = " (or `agboss-sql stamp` to adopt tables made another way)"
    else:
        # A database merely behind is upgraded: stamping it would skip the revisions between.
        state, other = f"is at revision {revision}, behind {newest}", ""
    raise SchemaNotReadyError(
        revision,
        newest,
        f"database {shown} {state}: run `agboss-sql upgrade --url {shown}`{other}",
    )


_VERSION = sa.table(VERSION_TABLE, sa.column("version_num"))


def upgrade(
    url: str | URL | None = None, revision: str = "head", *, lock_ms: int = LOCK_MS
) -> Migration:
    """Upgrade the database at `url` to `revision`, under the migration lock; safe to
    run from several instances at once (the later ones find it done). Each lock another
    session holds is waited for up to `lock_ms`; past it `StoreTimeoutError(what="lock")`,
    naming the revision the database is left at (see `upgrade_on`)."""
    with connect(url) as connection:
        return upgrade_on(connection, revision, lock_ms=lock_ms)


def downgrade(url: str | URL | None, revision: str, *, lock_ms: int = LOCK_MS) -> Migration:
    """Downgrade the database at `url` to `revision` (`"base"`: drop the whole schema),
    under the migration lock, waiting up to `lock_ms` for each lock as `upgrade` does."""
    with connect(url) as connection:
        return _migrate_on(connection, revision, upgrading=False, lock_ms=lock_ms)


def upgrade_on(
    connection: sa.Connection, revision: str = "head", *, lock_ms: int = LOCK_MS
) -> Migration:
    """Upgrade through a caller's own synchronous connection (Alembic's "Sharing a
    Connection" recipe; from async code, `await connection.run_sync(upgrade_on)`): the
    migration runs in its own transaction on it, committed before return, under the
    migration lock. The connection must have no transaction begun: the lock is taken
    before the migration's transaction and released after its commit. (On SQLite the
    migration sends `BEGIN IMMEDIATE` itself: the driver's default transaction handling
    is expected, not an engine that sends its own `BEGIN`.)

    A statement of the migration that waits longer than `lock_ms` (milliseconds; whole
    seconds on MySQL, at least one) for a lock another session holds, such as an
    application's transaction still open on a table the revision alters, stops it with
    `StoreTimeoutError(what="lock")`: the statement applied nothing; on PostgreSQL and
    SQLite nothing of the upgrade was (one transaction); on MySQL/MariaDB, where DDL commits
    as it runs, the revisions before it stay, and so do the statements of its own revision
    that ran before it. The error names the revision the database is at; running the upgrade
    again continues from there and completes that revision."""
    return _migrate_on(connection, revision, upgrading=True, lock_ms=lock_ms)


def _migrate_on(
    connection: sa.Connection, revision: str, *, upgrading: bool, lock_ms: int = LOCK_MS
) -> Migration:
    if connection.in_transaction():
        raise ValueError(
            "the connection is in a transaction: migrations take the database's migration "
            "lock before their own transaction; commit or roll back first"
        )
    direction = "upgrade" if upgrading else "downgrade"
    with migrating(connection, revision, direction=direction, lock_ms=lock_ms) as before:
        return _migrate_locked(connection, revision, before, upgrading=upgrading)


@contextmanager
def migrating(
    connection: sa.Connection, revision: str, *, direction: str, lock_ms: int = LOCK_MS
) -> Iterator[str | None]:
    """`migration_lock` for a migration to `revision` (`direction`: "upgrade",
    "downgrade"), giving the revision the database is at under the lock. A statement of the
    body that waits `lock_ms` for a lock another session holds ends the migration in
    `StoreTimeoutError(what="lock")`, naming the revision the database is left at, read
    anew once the lock is released (the library's migrations and alembic's environment
    both run under it)."""
    before: str | None = None
    in_body = False
    try:
        with migration_lock(connection, lock_ms=lock_ms):
            in_body = True
            before = _current_on(connection)
            yield before
    except Exception as exc:
        if in_body and dialect_for(connection.dialect.name).is_lock_timeout(exc):
            raise _lock_wait_passed(connection, revision, before, lock_ms, direction) from exc
        raise


def _migrate_locked(
    connection: sa.Connection, revision: str, before: str | None, *, upgrading: bool
) -> Migration:
    """The migration itself, under the migration lock, from revision `before`."""
    if upgrading and revision == "head" and before == head():
        # What every instance after the first finds at start-up: nothing to run.
        return Migration(before, before)
    if upgrading and before is None:
        present = agboss_tables_on(connection)
        if present:
            raise SchemaUnversionedError(
                f"the agboss tables exist ({len(present)} of {len(metadata.tables)}, e.g. "
                f"{min(present)}) but carry no revision, so an upgrade would create them "
                "again: if they match the current schema, run `agboss-sql stamp --url URL` "
                "(or `--revision REV` for an older one), then upgrade"
            )
    config = alembic_config(connection.engine.url)
    config.attributes["connection"] = connection
    if not upgrading:
        _refuse_downgrade(config, connection, before, revision)
    step = alembic.command.upgrade if upgrading else alembic.command.downgrade
    step(config, revision)
    return Migration(before, _current_on(connection))


def _lock_wait_passed(
    connection: sa.Connection, revision: str, before: str | None, lock_ms: int, direction: str
) -> StoreTimeoutError:
    """The error of a migration one of whose statements waited `lock_ms` for a lock, naming
    the revision the database is left at (read anew: where DDL commits as it runs, MySQL's,
    the revisions before the one that waited stay applied, and that one's statements before
    the one that waited)."""
    try:
        now: str | None = _current_on(connection)
        if connection.in_transaction():
            connection.rollback()
        at = f"the database is at revision {now or 'none (no agboss tables)'}"
        if MigrationContext.configure(connection).impl.transactional_ddl:
            at += ", as before: nothing of this migration stays (one transaction)"
        else:
            at += ", as before" if now == before else f", from {before or 'none'}"
            at += (
                "; DDL commits as it runs here, so the statements of the next revision that "
                "ran before the one that waited stay, and running it again completes that revision"
            )
    except Exception:
        at = "its revision could not be read back"
    return StoreTimeoutError(
        "lock",
        lock_ms,
        f"the {direction} to {revision} stopped: one of its statements waited {lock_ms} ms "
        "(lock_ms) for a lock another session holds on a table it changes, such as an open "
        f"transaction that read or wrote it, and applied nothing; {at}. Run it again when that "
        "transaction has ended, or give it a longer lock_ms (agboss-sql upgrade --lock-ms MS, "
        "alembic -x lock_ms=MS)",
    )


def _refuse_downgrade(
    config: Config, connection: sa.Connection, before: str | None, revision: str
) -> None:
    """Raise `RuntimeError` before any step when a revision the downgrade would undo says
    it must not run (its `downgrade_refusal(connection)`): on MySQL and MariaDB each step's
    DDL commits on its own, so a refusal met halfway would leave the steps before it done."""
    if before is None:
        return
    script = ScriptDirectory.from_config(config)
    try:
        undone = list(script.iterate_revisions(before, revision))
    except (alembic.util.CommandError, RevisionError):
        return  # a target alembic resolves otherwise (relative, say): each step checks itself
    for found in undone:
        if found.revision == revision:
            continue
        refusal = getattr(found.module, "downgrade_refusal", None)
        reason = refusal(connection) if refusal is not None else None
        if reason is not None:
            raise RuntimeError(reason)


@contextmanager
def migration_lock(connection: sa.Connection, *, lock_ms: int = LOCK_MS) -> Iterator[None]:
    """Run the body in one transaction on `connection` (no transaction begun) while
    holding the database's migration lock (see the module docstring), from before its
    first statement until after its commit; its statements wait up to `lock_ms` for each
    lock another session holds (`ValueError` before any lock unless a whole number of
    milliseconds, at least 1)."""
    if isinstance(lock_ms, bool) or not isinstance(lock_ms, int) or lock_ms < 1:
        raise ValueError(f"lock_ms must be a whole number of milliseconds, at least 1: {lock_ms!r}")
    with dialect_for(connection.dialect.name).lock_database(connection, lock_ms):
        yield


@contextmanager
def connect(url: str | URL | None = None) -> Iterator[sa.Connection]:
    """A synchronous connection for migrations to `url` (resolved as `resolve_url`
    does; a SQLite file's directory is created), closed with its engine after.

    A URL naming several servers fails over as the stores' connections do: PostgreSQL's
    `?host=h1:p1&host=h2:p2&target_session_attrs=read-write` reaches the first server that
    accepts writes (libpq), each tried within `Timeouts.connect_ms`; a MySQL URL's `failover`
    alternates, the first node that answers and is Synced, each within its share of it."""
    resolved = resolve_url(url)
    target = sync_url(resolved)
    embedded = dialect_for(target.get_backend_name()).CAPABILITIES.inline
    if embedded and target.database not in (None, "", ":memory:"):
        Path(target.database).parent.mkdir(parents=True, exist_ok=True)
    engine = _failing_over(sa.create_engine(target, poolclass=sa.NullPool), normalize_url(resolved))
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def _failing_over(engine: sa.Engine, url: URL) -> sa.Engine:
    """`engine` (of `sync_url(url)`), each new connection bounded by the default
    `Timeouts.connect_ms` (a migration has no `Timeouts`), its server's greeting included (a
    frozen server accepts TCP and never greets): libpq's `connect_timeout` unless the URL
    sets one, PyMySQL's reads during the set-up; and failed over when `url` names several
    servers. A migration's statements then run unbounded (an index build takes as long as it
    needs); their lock waits are `lock_ms`'s."""
    connect_ms = Timeouts().connect_ms
    name = dialect_for(url.get_backend_name()).NAME
    if name == "postgresql" and "connect_timeout" not in url.query:
        from agboss_sql._dialects.postgresql import session_options

        timeout = session_options(Timeouts(connect_ms=connect_ms))["connect_timeout"]

        @sa.event.listens_for(engine, "do_connect")
        def _bounded(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
            cparams["connect_timeout"] = timeout  # libpq's, per host

    elif name == "mysql":
        from agboss_sql._dialects._mysql_sync import connect_params

        nodes = nodes_of(url)

        @sa.event.listens_for(engine, "do_connect")
        def _first_serving(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
            return connect_params(nodes, connect_ms, cparams)

    return engine


def _current_on(connection: sa.Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()
