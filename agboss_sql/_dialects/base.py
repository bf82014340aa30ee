"""The dialect interface: what every database module implements, checked by mypy.

A dialect module (`sqlite`, `postgresql`, `mysql`) is the implementation: mypy checks
each module against `Dialect` where `dialect_for` returns it. The stores never ask which
database they run on; they ask a `Capabilities` value, resolved once per connection
(MariaDB's `RETURNING` on inserts is known only once a server has answered).

Two kinds of driver sit under the dialects: `ServerDriver` (an async driver whose
connections live in a pool: psycopg 3, aiomysql) and `InlineDriver` (SQLite's stdlib
driver, run inline on the event loop's thread). `Capabilities.inline` says which one a
dialect has.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.sql.expression import ColumnElement

from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import StoreTimeoutError


@dataclass(frozen=True, slots=True)
class Suffixed:
    """A statement with text appended after compilation (a clause SQLAlchemy will not
    compile for this dialect, e.g. MariaDB's `INSERT … RETURNING`)."""

    statement: Any
    suffix: str


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a database can do, as the statements need to know it.

    - `inline`: the driver runs inline on the event loop's thread (SQLite), not on pooled
      async connections.
    - `update_returning`: `UPDATE … RETURNING`.
    - `insert_returning`: `INSERT … RETURNING`, upserts included (MariaDB has it, MySQL 8
      does not).
    - `upsert_where`: the upsert takes a `WHERE` (`ON CONFLICT DO UPDATE … WHERE`); without
      it a conditional upsert decides per column (`IF(cond, new, old)`).
    - `row_locks`: `SELECT … FOR UPDATE` locks rows (SQLite locks the whole database with
      `BEGIN IMMEDIATE` instead).
    - `skip_locked`: `FOR UPDATE SKIP LOCKED`.
    - `dml_in_with`: data-modifying statements may run inside `WITH`.
    - `json_key_exact`: `json_key_equals` is exact for nested JSON values too.
    - `insert_if_absent_raises`: `insert_if_absent` raises a unique violation on a duplicate
      (the caller reads it as "already there") instead of skipping it silently.
    - `insert_or_lock_returning`: `insert_or_lock` is one statement that answers the row
      it inserted or, on a duplicate, the existing row, locked and unchanged
      (`INSERT … ON CONFLICT DO UPDATE … RETURNING`); without it, `insert_or_lock` is a
      plain insert whose duplicate raises a unique violation, and the caller reads the
      existing row.
    - `batch_migrations`: Alembic must rewrite tables to alter them (`render_as_batch`).
    - `certified_writes`: a multi-primary cluster that certifies each transaction's write
      set at COMMIT (MariaDB Galera): row locks are local to a node and a statement that
      changes no row is invisible to the other nodes, so a decision between instances on
      different nodes must write a row every concurrent decider writes (the loser fails
      certification, a transient conflict, and runs again).
    - `scripts`: a transaction's statements may be sent as one text (`Script`: `BEGIN`,
      the statements and `COMMIT`, separated by `;`), one round trip; the server stops at
      the first statement that fails, leaving the transaction open, so the runner drops
      the connection (the server then rolls it back).
    - `shared_with`: a `WITH` that several parts of one statement read is computed once and
      read in place (PostgreSQL); elsewhere it may be materialised (MariaDB writes it to a
      temporary table), so each part reads a scalar subquery instead.
    - `notifications`: a transaction can notify listening sessions when it commits
      (`pg_notify`, `LISTEN`; the driver's `wait_notification`).
    """

    inline: bool
    update_returning: bool
    insert_returning: bool
    upsert_where: bool
    row_locks: bool
    skip_locked: bool
    dml_in_with: bool
    json_key_exact: bool
    insert_if_absent_raises: bool
    batch_migrations: bool
    insert_or_lock_returning: bool = False
    certified_writes: bool = False
    scripts: bool = False
    shared_with: bool = False
    notifications: bool = False


class Dialect(Protocol):
    """The statements and error classification that differ per database."""

    NAME: str
    """The backend name stores declare (`sqlite`, `postgresql`, `mysql`)."""
    CAPABILITIES: Capabilities
    """What every server of this dialect can do; `capabilities_of` may find more."""
    BEGIN: str
    """The statement that opens a write transaction (SQLite: `BEGIN IMMEDIATE`)."""
    ASYNC_DRIVER: str
    """The async driver's SQLAlchemy name (the stores' engine and URL)."""
    SYNC_DRIVER: str
    """The synchronous driver's SQLAlchemy name, for migrations."""
    DRIVER_SENDS_BEGIN: bool
    """In a SQLAlchemy transaction, the async driver sends `BEGIN` on its own before the
    first statement (a round trip no statement event reports)."""

    def compile_dialect(self) -> sa.Dialect: ...

    def now_ms(self) -> ColumnElement[int]: ...

    def now_source(self, database_time: bool) -> tuple[Any, ColumnElement[int]]: ...

    def insert(self, table: sa.Table) -> Any: ...

    def insert_if_absent(self, table: sa.Table, keys: Sequence[str]) -> Any: ...

    def upsert(
        self,
        table: sa.Table,
        keys: Sequence[str],
        values: Mapping[str, Any],
        update: Callable[[Any], Mapping[str, Any]],
    ) -> Any: ...

    def upsert_where(
        self,
        insert: Any,
        keys: Sequence[str],
        where: Callable[[Any], ColumnElement[bool]],
        update: Callable[[Any], Sequence[tuple[str, Any]]],
        decided_by: str,
    ) -> Any: ...

    def insert_or_lock(self, insert: Any, keys: Sequence[str], columns: Sequence[Any]) -> Any:
        """`insert` (this dialect's insert) claiming the unique key `keys`: with
        `Capabilities.insert_or_lock_returning`, one statement that inserts the row or locks
        the existing one unchanged, and returns `columns` of the row either way; else the
        plain insert, whose duplicate is a unique violation (`is_unique_violation`)."""
        ...

    def returning(self, statement: Any, *columns: Any) -> Any:
        """`statement … RETURNING columns`, for a dialect whose capabilities say it has it
        (MariaDB's insert is one SQLAlchemy will not compile: sent as a `Suffixed`)."""
        ...

    def greatest(self, *values: Any) -> ColumnElement[Any]: ...

    def least(self, *values: Any) -> ColumnElement[Any]: ...

    def for_update(self, select: sa.Select[Any]) -> sa.Select[Any]: ...

    def for_share(self, select: sa.Select[Any]) -> sa.Select[Any]: ...

    def skip_locked(self, select: sa.Select[Any]) -> sa.Select[Any]: ...

    def exact_text(self, expression: ColumnElement[Any]) -> ColumnElement[Any]: ...

    def skip_duplicates(self, statement: Any, keys: Sequence[str]) -> Any: ...

    def replace_duplicates(
        self, statement: Any, keys: Sequence[str], columns: Sequence[str]
    ) -> Any: ...

    def json_key_equals(self, document: Any, index: int) -> ColumnElement[bool]: ...

    def json_key_params(self, index: int, key: str, value: Any) -> dict[str, Any]: ...

    def analyze_sql(self, table: str) -> str: ...

    def truncate_sql(self, tables: Sequence[str]) -> list[str]:
        """The statements that delete every row of `tables` (given parents first) and, where
        the database can, give their storage back (`TRUNCATE`)."""
        ...

    def is_retryable(self, exc: BaseException) -> bool:
        """A transient conflict (deadlock, serialization failure): the transaction, or the
        one statement it hit, applied nothing and may run again."""
        ...

    def is_lock_timeout(self, exc: BaseException) -> bool:
        """A lock wait passed its bound (`Timeouts.lock_ms`): nothing applied."""
        ...

    def is_statement_timeout(self, exc: BaseException) -> bool:
        """The server ended a statement at its bound (`Timeouts.statement_ms`)."""
        ...

    def is_busy(self, exc: BaseException) -> bool: ...

    def is_unique_violation(self, exc: BaseException) -> bool: ...

    def is_disconnect(self, exc: BaseException) -> bool: ...

    def is_storage_full(self, exc: BaseException) -> bool:
        """The database could not write: its disk or file is full."""
        ...

    def is_read_only(self, exc: BaseException) -> bool:
        """The server refused a write because it takes none now (a standby, a read-only
        session or server): nothing applied; its primary may take it."""
        ...

    def driver_error(self, exc: BaseException) -> BaseException | None:
        """The driver's own error behind `exc` (`exc` itself, or the one a SQLAlchemy error
        wraps), or `None` when `exc` is not the driver's: what a `StoreRefusedError` names
        as its cause."""
        ...

    def engine_options(self, url: URL, timeouts: Timeouts) -> dict[str, Any]:
        """Keyword arguments for `create_async_engine` on this dialect under `timeouts`."""
        ...

    def lock_database(
        self, connection: sa.Connection, lock_ms: int
    ) -> contextlib.AbstractContextManager[None]:
        """The migration lock around one transaction on a synchronous connection, whose
        statements wait up to `lock_ms` for each lock another session holds."""
        ...


def wrapped_driver_error(
    exc: BaseException, driver_errors: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """`Dialect.driver_error` for a driver whose errors are `driver_errors`."""
    orig = getattr(exc, "orig", None) if isinstance(exc, sa.exc.DBAPIError) else exc
    return orig if isinstance(orig, driver_errors) else None


class ServerDriver(Protocol):
    """A pooled async driver (psycopg 3, aiomysql)."""

    async def connect(self, url: URL, timeouts: Timeouts, *, autocommit: bool = True) -> Any:
        """A new connection (in autocommit for the pool; not for SQLAlchemy's engine) whose
        session bounds statements and lock waits by `timeouts`, and which a cancelled call
        drops rather than waiting on the network to cancel its statement."""
        ...

    def capabilities_of(self, raw: Any) -> Capabilities:
        """The capabilities of the server `raw` is connected to."""
        ...

    async def execute(
        self, raw: Any, sql: str, params: Mapping[str, Any] | None
    ) -> tuple[list[Any] | None, int]: ...

    async def run_text(self, raw: Any, sql: str) -> None: ...

    async def close(self, raw: Any) -> None: ...

    def abort(self, raw: Any) -> None:
        """Close `raw`'s socket at once, without a word to the server (a connection whose
        protocol state is unknown, e.g. after a statement's deadline)."""
        ...

    def is_usable(self, raw: Any) -> bool: ...

    async def wait_notification(self, raw: Any, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for a notification on a channel `raw` listens to: True
        when one came (`Capabilities.notifications`; without it, `NotImplementedError`)."""
        ...

    def close_without_loop(self, raw: Any) -> None:
        """Close `raw` once the event loop it was made on has ended: its socket directly,
        since the driver's own close would schedule work on the dead loop."""
        ...


class InlineDriver(Protocol):
    """SQLite's stdlib driver, run inline on the event loop's thread."""

    def connect_sync(self, path: str, lock_ms: int) -> sqlite3.Connection: ...

    def execute_sync(
        self, raw: sqlite3.Connection, sql: str, params: Mapping[str, Any] | None
    ) -> tuple[list[Any] | None, int]: ...

    def inline_aiosqlite_creator(self, path: str, lock_ms: int) -> Any: ...


class ServerDialect(Dialect, ServerDriver, Protocol):
    """A server database: its statements and its pooled driver."""


class InlineDialect(Dialect, InlineDriver, Protocol):
    """An embedded database: its statements and its inline driver."""


def migration_lock_timeout(timeout_s: int, lock: str) -> StoreTimeoutError:
    """The error of a migration that waited `timeout_s` for the database's migration lock
    (`lock` names it), held by another migration: nothing of it ran."""
    return StoreTimeoutError(
        "lock",
        timeout_s * 1000,
        f"the database's migration lock ({lock}) was not free within {timeout_s} s: another "
        "agboss-sql migration is still running; nothing of this one ran: retry when it has "
        "finished",
    )
