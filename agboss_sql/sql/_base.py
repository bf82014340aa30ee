"""What every SQL store shares: its connection, its backend text, JSON, identity hashes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agboss_sql.contracts.rules import payload_text
from agboss_sql.contracts.types import ApplicationContext
from agboss_sql.sql.connection import SqlConnection


def dumps(value: Any) -> str:
    """JSON text of a payload; a value no backend stores is `InvalidPayloadError`
    (`contracts.rules.payload_text`), before any statement."""
    return payload_text("the payload", value)


def loads(text: Any) -> Any:
    """A payload back from its JSON text (`None` stays `None`)."""
    if text is None:
        return None
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode()
    return json.loads(text)


def identity_hash(identity: str) -> str:
    """The key column of a long identity: its SHA-256, hex."""
    return hashlib.sha256(identity.encode()).hexdigest()


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
