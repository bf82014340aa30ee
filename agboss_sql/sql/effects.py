"""`SqlFencedEffectRepository`: one effect per key, in one transaction with the work.

The transaction is a SQLAlchemy `AsyncConnection` (`SqlConnection.transaction()`),
because the work receives it and writes its business rows in it. On SQLite it
is an `InlineWorkConnection`: an `AsyncConnection` whose calls run at once on
the event loop's thread, on a synchronous SQLAlchemy `Connection` over the
inline runner's work connection, inside `BEGIN IMMEDIATE`. The store's own
statements run on the same connection (`SqlConnection.execute_on`), in this order:

1. the fence (`_fence.FenceStatements.fence`): lease check and mark raise in one
   conditional `UPDATE` of the lease row, which locks it until the commit;
2. the claim of the key's result row, by its unique key, before the work runs,
   so two writers of one key (two scopes sharing a business key) wait for each
   other instead of both running the work (the dialect's `insert_or_lock`). With
   `Capabilities.insert_or_lock_returning` (PostgreSQL, SQLite): an upsert whose
   no-op update locks an existing row and returns it (`RETURNING`), so a replay
   costs no second read; a claimed row is new when its result is `NULL` (a
   committed row always has its JSON result). Without (MySQL/MariaDB): a plain
   insert, whose duplicate-key error (which does not abort the transaction
   there) means the row exists; a shared locking read then gets it;
3. an existing row replays through `replayed_from_of`; else the work, then the
   result stored into the claimed row, then the commit.

The work gets its own handle on that transaction (`_effect_connection`): an
`AsyncConnection` over the same SQLAlchemy `Connection` that ends when the work returns
(or raises, or is cancelled). A task or closure that kept it and calls it later gets
`EffectTransactionEndedError` and nothing is sent: the store's connection, which the
next transaction reuses, never sees a write from outside an effect. Ending the
transaction from the work (`commit`, `rollback`, `close`) is refused while it runs.

Any refusal or exception rolls all of it back (the mark and the work's rows
included); transient conflicts (deadlocks, serialization failures, busy) run
the whole transaction again.

Statements per call (round trips; the work's own statements not counted):
PostgreSQL: first write BEGIN, fence, claim, store, COMMIT = 5; replay BEGIN,
fence, claim, COMMIT = 4. SQLite: the same with `BEGIN IMMEDIATE`.
MySQL/MariaDB (no BEGIN round trip: the driver runs with autocommit off):
first write fence, claim, store, COMMIT = 4; replay fence, claim, read,
COMMIT = 4. A refusal sends the diagnosing read instead of the claim and ends
in ROLLBACK (then, on MySQL/MariaDB, the ROLLBACK aiomysql sends when
SQLAlchemy's pool takes the failed transaction's connection back; a committed
one's connection is kept for the next transaction).

A transaction the work leaves idle (no statement sent) longer than
`max(statement_ms, lock_ms)` is ended, as the servers end it
(`idle_in_transaction_session_timeout`, MariaDB's `idle_transaction_timeout`): the call
fails with `StoreUnavailableError` and nothing is committed. SQLite has no server to end
it, so the store does (`_IdleBound`): the same bound, measured between the work's
statements and up to its return, the same error.

`get_result` reads a stored result outside any transaction: one `SELECT` in
autocommit, no fence and no lock, which sees committed rows only.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agboss_sql.contracts.errors import CorruptStoredRowError, StoreUnavailableError
from agboss_sql.contracts.keys import fenced_key_identity_of, replayed_from_of
from agboss_sql.contracts.rules import checked_fenced_key
from agboss_sql.contracts.stores import ExecutionLeaseRepository, FencedEffectRepository
from agboss_sql.contracts.types import (
    FencedEffectKey,
    FencedEffectResult,
    JsonValue,
)
from agboss_sql.sql._backoff import back_off
from agboss_sql.sql._base import FencedStore, dumps, identity_hash, loads
from agboss_sql.sql._effect_connection import effect_connection
from agboss_sql.sql._fence import fence_on, fence_params
from agboss_sql.sql._inline_work import InlineWorkConnection
from agboss_sql.sql.connection import MAX_ATTEMPTS, SqlBuilder, SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import fenced_effect_results

T = TypeVar("T")

R = fenced_effect_results
_STORED = (
    R.c.result,
    R.c.fingerprint,
    R.c.step_execution_id,
    R.c.step_idempotency_key,
    R.c.step_name,
)


class EffectStatements:
    """The fenced effect's own statements for one dialect and one kind of store time."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        source, now = b.now()
        row: dict[str, Any] = {
            column: sa.bindparam(column)
            for column in (
                "identity_hash",
                "identity",
                "tenant_id",
                "scope_key",
                "name",
                "business_key",
                "fingerprint",
                "step_execution_id",
                "step_idempotency_key",
                "step_name",
                "lease_execution_id",
                "token",
            )
        }
        row["result"] = sa.null()
        row["stored_at"] = now
        if source is not None:
            columns = list(row)
            insert = ops.insert(R).from_select(
                columns, sa.select(*(row[c] for c in columns)).select_from(source)
            )
        else:
            insert = ops.insert(R).values(row)
        # With RETURNING, a claim that meets an existing row (after its writer committed)
        # locks it and gives it back; a new row comes back with its NULL result. Without,
        # a duplicate is a unique violation and `read` gets the row.
        self.returns_claimed = b.capabilities.insert_or_lock_returning
        self.claim = ops.insert_or_lock(insert, ["identity_hash"], _STORED)
        this_key = R.c.identity_hash == sa.bindparam("identity_hash")
        # The row is committed and never changes once it has a result: a shared lock
        # (compatible with the one the failed insert holds) is enough to read it.
        self.read = ops.for_share(sa.select(*_STORED).where(this_key))
        # `get_result`'s read, outside any transaction: it locks nothing, and sees only
        # committed rows (a claimed row of a write in flight is not seen).
        self.get = sa.select(*_STORED).where(this_key)
        self.store = (
            sa.update(R)
            .where(R.c.identity_hash == sa.bindparam("identity_hash"))
            .values(result=sa.bindparam("result"))
        )


class SqlFencedEffectRepository(
    FencedStore[EffectStatements], FencedEffectRepository[AsyncConnection]
):
    """Fenced effects on SQL: the lease check, the scope's mark, the stored result and the
    work's business rows in one transaction that locks the lease row first."""

    lease_repository: ClassVar[type[ExecutionLeaseRepository] | None] = SqlExecutionLeaseRepository

    statements = EffectStatements

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Callable[[AsyncConnection], Awaitable[T]]
    ) -> FencedEffectResult[T]:
        """In one transaction: refuse (`ExecutionFencedError`, with the reason) unless the
        key's lease is held at its token, not released/yielded/finished and live by the
        store's time, and the scope's mark is not above the token; raise the mark; replay
        the key's stored result (another fingerprint under a business key is
        `IdempotencyKeyConflictError`); else run `work(tx)` on the open transaction and
        store its JSON result. The answer's value is the stored JSON's value. Any refusal
        or exception rolls everything back, the work's rows included. `tx` is the work's
        only while it runs: a call through it after the work returned raises
        `EffectTransactionEndedError` and sends nothing; `commit`, `rollback` and
        `close` from the work raise SQLAlchemy's `InvalidRequestError`."""
        checked_fenced_key(key)
        identity = fenced_key_identity_of(key)
        facts = {
            "identity_hash": identity_hash(identity),
            "identity": identity,
            "tenant_id": key.tenant_id,
            "scope_key": key.scope_key,
            "name": key.name,
            "business_key": key.business_key,
            "fingerprint": key.fingerprint,
            "step_execution_id": key.step.execution_id,
            "step_idempotency_key": key.step.idempotency_key,
            "step_name": key.step.name,
            "lease_execution_id": key.lease_execution_id,
            "token": key.token,
        }

        async def attempt(tx: AsyncConnection) -> FencedEffectResult[T]:
            # The store's time is read once per attempt: every statement sees the same.
            params = fence_params(key, self.store_clock)
            connection = self.connection
            await fence_on(connection, tx, self._fence, key, params)
            stored = await self._claim(tx, {**facts, **params})
            if stored is not None:
                return _replay_of(key, stored)
            idle = _IdleBound.on(tx, connection)
            handle = effect_connection(tx)
            try:
                value = await work(handle)
                if idle is not None:
                    idle.check()
            finally:
                # Whatever the work keeps of its handle is refused from here on, every
                # exit path included (a raise, a cancellation): see `_effect_connection`.
                handle.end()
                if idle is not None:
                    idle.close()
            # A value that is not JSON fails here, inside the transaction: all rolls back.
            text = dumps(value)
            await connection.execute_on(
                tx, self._sql.store, {"identity_hash": facts["identity_hash"], "result": text}
            )
            stored_value: T = loads(text)
            return FencedEffectResult(stored_value, False, None)

        tries = 0
        while True:
            tries += 1
            try:
                async with self.connection.transaction() as tx:
                    return await attempt(tx)
            except Exception as exc:
                if not (isinstance(exc, _ClaimLostError) or self.connection.is_transient(exc)):
                    raise
                if tries >= MAX_ATTEMPTS:
                    raise self.connection.conflicts_persisted(exc, tries) from exc
            await back_off(tries)

    async def get_result(self, key: FencedEffectKey) -> FencedEffectResult[JsonValue] | None:
        """The key's stored result, answered as `save_result_if_absent` answers its replay
        (another fingerprint under a business key is `IdempotencyKeyConflictError`), or
        `None`: one `SELECT` in autocommit, no fence, no lock; a result is seen once its
        transaction committed."""
        checked_fenced_key(key)
        identity = fenced_key_identity_of(key)
        row = (
            await self.connection.execute(self._sql.get, {"identity_hash": identity_hash(identity)})
        ).first()
        if row is None:
            return None
        if row[0] is None:
            raise CorruptStoredRowError(f"the stored result of {identity!r:.200} is missing")
        return _replay_of(key, row)

    async def _claim(self, tx: AsyncConnection, params: dict[str, Any]) -> Any | None:
        """Claim the key's result row: `None` when this transaction claimed it (a new row,
        locked), else the existing row's `(result, fingerprint, step…)`."""
        sql = self._sql
        connection = self.connection
        if sql.returns_claimed:
            row = (await connection.execute_on(tx, sql.claim, params)).first()
            if row is None or row[0] is None:
                return None
            return row
        try:
            await connection.execute_on(tx, sql.claim, params)
            return None
        except Exception as exc:
            if not connection.ops.is_unique_violation(exc):
                raise
        row = (
            await connection.execute_on(tx, sql.read, {"identity_hash": params["identity_hash"]})
        ).first()
        if row is None:
            # The duplicate's writer rolled back after all: run the transaction again.
            raise _ClaimLostError
        if row[0] is None:
            raise CorruptStoredRowError(
                f"the stored result of {params['identity']!r:.200} is missing"
            )
        return row


def _replay_of(key: FencedEffectKey, stored: Any) -> FencedEffectResult[Any]:
    """The replay of `key` from its stored row `(result, fingerprint, step…)`."""
    result, fingerprint, step_execution_id, step_key, step_name = stored
    replayed_from = replayed_from_of(
        key,
        {
            "fingerprint": fingerprint,
            "step_execution_id": step_execution_id,
            "step_idempotency_key": step_key,
            "step_name": step_name,
        },
    )
    return FencedEffectResult(loads(result), True, replayed_from)


class _IdleBound:
    """The servers' bound on a transaction left idle, kept by the store on SQLite (whose
    work connection is an `InlineWorkConnection`): the work's statements are timed on the
    monotonic clock, and one sent (or a return) after more than `max(statement_ms,
    lock_ms)` without any fails with `StoreUnavailableError`, the transaction rolled back.

    The two statement listeners are installed once per connection (installing and removing
    them around every effect cost more than the rest of its Python); between effects the
    connection has no bound, and the listeners do nothing."""

    def __init__(self, tx: InlineWorkConnection, bound_ms: int) -> None:
        self.bound_ms = bound_ms
        self.sync = tx.sync_connection
        self.last = time.monotonic()
        if self.sync not in _IDLE_BOUNDS:
            sa.event.listen(self.sync, "before_cursor_execute", _before_statement)
            sa.event.listen(self.sync, "after_cursor_execute", _after_statement)
        _IDLE_BOUNDS[self.sync] = self

    @classmethod
    def on(cls, tx: AsyncConnection, connection: SqlConnection) -> _IdleBound | None:
        if not isinstance(tx, InlineWorkConnection):
            return None  # a server bounds it itself
        timeouts = connection.timeouts
        return cls(tx, max(timeouts.statement_ms, timeouts.lock_ms))

    def check(self) -> None:
        idle_ms = round((time.monotonic() - self.last) * 1000)
        if idle_ms > self.bound_ms:
            raise StoreUnavailableError(
                f"the effect's transaction was left idle for {idle_ms} ms, past the bound "
                f"of {self.bound_ms} ms (max(statement_ms, lock_ms)) after which a server "
                "ends it; nothing was committed"
            )

    def close(self) -> None:
        if _IDLE_BOUNDS.get(self.sync) is self:
            _IDLE_BOUNDS[self.sync] = None


_IDLE_BOUNDS: weakref.WeakKeyDictionary[Any, _IdleBound | None] = weakref.WeakKeyDictionary()
"""Each connection the listeners are installed on, with the bound of the effect running on
it now (`None` between effects)."""


def _before_statement(connection: Any, *_args: Any) -> None:
    bound = _IDLE_BOUNDS.get(connection)
    if bound is not None:
        bound.check()


def _after_statement(connection: Any, *_args: Any) -> None:
    bound = _IDLE_BOUNDS.get(connection)
    if bound is not None:
        bound.last = time.monotonic()


class _ClaimLostError(Exception):
    """The row a failed claim collided with was gone when read: a transient conflict."""
