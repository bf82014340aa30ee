"""The handle a SQL fenced effect hands its work: an `AsyncConnection` on the effect's
transaction that ends when the work returns.

The store's own transaction (a pooled server connection the next transaction reuses, or
SQLite's inline work connection) outlives the effect. Work that kept what it was handed
(a task it started, a closure) and wrote through it later would write outside any
effect: on SQLite the row committed on its own, on a server the kept connection began a
transaction by itself, which the next effect on it then met. The handle is a separate
object over the same SQLAlchemy `Connection`, so ending it costs no statement: from then
on every call through it (`execute`, `scalar`, `scalars`, `stream`, `run_sync`, `begin`,
`commit`, reading `sync_connection`, …) raises `EffectTransactionEndedError` before
anything reaches the connection. While the work runs it answers as the store's
transaction does, except that ending that transaction from the work (`commit`,
`rollback`, `close`) is refused on every database, as SQLite's inline connection already
refused it: the work's rows commit with the fence and the result or not at all.
"""

from __future__ import annotations

import sqlite3
from typing import NoReturn

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agboss_sql.contracts.errors import AgbossError
from agboss_sql.sql._inline_work import STORE_OWNS_IT, InlineWorkConnection


class EffectTransactionEndedError(AgbossError, sa.exc.ResourceClosedError):
    """The fenced effect that handed out this transaction is over: nothing was sent.

    Raised by a call through the `AsyncConnection` a SQL fenced effect's work was given,
    made after the work returned (a task the work started, a closure it left behind). It
    is SQLAlchemy's `ResourceClosedError` too (what a closed connection raises), so code
    that catches that still does. Write inside the work, before it returns.
    """

    # AgbossError's class-level code; SQLAlchemy's errors declare theirs per instance.
    code = "fenced-effect.transaction-ended"  # type: ignore[misc]

    # SQLAlchemy's errors append a link named after `code`, which names ours here.
    __str__ = Exception.__str__


_ENDED = (
    "the fenced effect that handed out this transaction is over (its work returned): "
    "nothing was sent; write inside the work, before it returns"
)


class _EndsWithEffect(AsyncConnection):
    """What both handles share: the `Connection` is reached only through `sync_connection`,
    which raises once `end` was called. SQLAlchemy's `AsyncConnection` reaches its
    `Connection` through `_proxied`, which reads `sync_connection`, before it sends anything
    (and `start`, which would connect anew, refuses a connection already set)."""

    __slots__ = ()

    _sync: sa.Connection | None

    @property
    def sync_connection(self) -> sa.Connection:
        sync = self._sync
        if sync is None:
            raise EffectTransactionEndedError(_ENDED)
        return sync

    @sync_connection.setter
    def sync_connection(self, value: sa.Connection | None) -> None:
        self._sync = value

    def end(self) -> None:
        """Refuse every later call (the effect's work returned)."""
        self._sync = None

    @property
    def ended(self) -> bool:
        """Whether the effect this handle belongs to is over."""
        return self._sync is None

    @property
    def closed(self) -> bool:
        """True once the effect is over (the handle's end); else the connection's state."""
        sync = self._sync
        return True if sync is None else sync.closed

    # Compared by identity: SQLAlchemy's comparison reads the connection, which an ended
    # handle refuses.
    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = AsyncConnection.__hash__

    async def commit(self) -> NoReturn:
        self._refuse()

    async def rollback(self) -> NoReturn:
        self._refuse()

    async def close(self) -> NoReturn:
        self._refuse()

    async def aclose(self) -> NoReturn:
        self._refuse()

    def _refuse(self) -> NoReturn:
        if self._sync is None:
            raise EffectTransactionEndedError(_ENDED)
        raise sa.exc.InvalidRequestError(STORE_OWNS_IT)


class EffectConnection(_EndsWithEffect):
    """The work's handle on a server: SQLAlchemy's `AsyncConnection` calls, on the
    `Connection` of the store's transaction, until `end`."""

    __slots__ = ("_sync",)

    def __init__(self, tx: AsyncConnection) -> None:
        # Not AsyncConnection.__init__: SQLAlchemy's map from a Connection to its
        # AsyncConnection keeps naming the store's, which outlives this handle.
        self.engine = tx.engine
        self.sync_engine = tx.sync_engine
        self._sync = tx.sync_connection


class InlineEffectConnection(_EndsWithEffect, InlineWorkConnection):
    """The work's handle on SQLite: an `InlineWorkConnection` (its calls run at once on the
    loop's thread, and the store's statement runners take it as one) over the same work
    connection, until `end`; its `raw` connection too is refused after."""

    __slots__ = ("_raw", "_sync")

    def __init__(self, tx: InlineWorkConnection) -> None:
        self.engine = tx.engine
        self.sync_engine = tx.sync_engine
        self._sync = tx.sync_connection
        self._raw = tx.raw

    _raw: sqlite3.Connection | None

    @property
    def raw(self) -> sqlite3.Connection:
        raw = self._raw
        if raw is None:
            raise EffectTransactionEndedError(_ENDED)
        return raw

    @raw.setter
    def raw(self, value: sqlite3.Connection | None) -> None:
        self._raw = value

    def end(self) -> None:
        self._sync = None
        self._raw = None


def effect_connection(tx: AsyncConnection) -> EffectConnection | InlineEffectConnection:
    """A handle on the store's transaction `tx` for the effect's work, to `end` when the
    work returns."""
    if isinstance(tx, InlineWorkConnection):
        return InlineEffectConnection(tx)
    return EffectConnection(tx)


__all__ = [
    "EffectConnection",
    "EffectTransactionEndedError",
    "InlineEffectConnection",
    "effect_connection",
]
