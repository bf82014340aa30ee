"""What every SQL store shares: its constructor, connection, backend text and statement set;
JSON; identity hashes."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Generic, TypeVar

from agboss_sql.contracts.clocks import Clock, StoreClock
from agboss_sql.contracts.rules import checked_dependencies, payload_text
from agboss_sql.contracts.types import ApplicationContext
from agboss_sql.sql._fence import FenceStatements
from agboss_sql.sql.connection import SqlConnection


def dumps(value: Any) -> str:
    """JSON text of a payload; a value no backend stores is `InvalidPayloadError`
    (`contracts.rules.payload_text`), before any statement."""
    if value is None:
        return "null"  # payload_text's answer, without building an encoder (every finish)
    return payload_text("the payload", value)


def loads(text: Any) -> Any:
    """A payload back from its JSON text (`None` stays `None`)."""
    if text is None or text == "null":
        return None
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode()
    return json.loads(text)


def identity_hash(identity: str) -> str:
    """The key column of a long identity: its SHA-256, hex. A lone surrogate (which no stored
    text holds: every store refuses it) is hashed as its code unit, never an error."""
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()


S = TypeVar("S")


class SqlStore:
    """Mixin of the `Sql*` stores: the backend is the connection's (`kind[:database]`)."""

    connection: SqlConnection
    application: ApplicationContext
    backend: str | None

    def _attach(self, connection: SqlConnection, application: ApplicationContext) -> None:
        self.connection = connection
        self.application = application
        self.backend = connection.backend

    async def ping(self) -> None:
        await self.connection.ping()


class ApplicationClockStore(SqlStore, Generic[S]):
    """A store whose times come from the application's clock: `SqlXxx(connection, clock,
    application)`, each checked before anything is built (`checked_dependencies`: a wrong
    one is a `TypeError` naming the store); nothing connects. `_sql` is the store's
    statement set (`statements`, built once per dialect, shared by every store on the
    connection)."""

    statements: type[S]
    _sql: S

    def __init__(
        self, connection: SqlConnection, clock: Clock, application: ApplicationContext
    ) -> None:
        connection, self.clock, application = checked_dependencies(
            self, connection, SqlConnection, clock, application, clock_kind="application"
        )
        self._attach(connection, application)
        self._sql = connection.prepared(self.statements)


class StoreClockStore(SqlStore, Generic[S]):
    """A store that decides by the store's time (lease expiry): `SqlXxx(connection, clock,
    application)` with `clock` a `StoreClock` (database time, or a clock in tests), each
    checked before anything is built (`checked_dependencies`); nothing connects. `_sql` is
    the store's statement set (`statements`, built once per dialect and kind of store time)."""

    statements: type[S]
    _sql: S

    def __init__(
        self, connection: SqlConnection, clock: StoreClock, application: ApplicationContext
    ) -> None:
        connection, self.store_clock, application = checked_dependencies(
            self, connection, SqlConnection, clock, application, clock_kind="store"
        )
        self._attach(connection, application)
        self._sql = connection.prepared(
            self.statements, database_time=self.store_clock.is_database_time
        )


class FencedStore(StoreClockStore[S]):
    """A store-time store whose writes are fenced by a lease: `_fence` is the fence the
    fenced-effect store makes first (`_fence.FenceStatements`), on the same store time."""

    def __init__(
        self, connection: SqlConnection, clock: StoreClock, application: ApplicationContext
    ) -> None:
        super().__init__(connection, clock, application)
        self._fence = connection.prepared(
            FenceStatements, database_time=self.store_clock.is_database_time
        )
