"""`SqlRateLimitRepository`: slots, windows and pauses shared by every instance.

On the store's time, as leases are: with `StoreClock()` (what an `Application` gives it)
the database's clock decides, so an instance whose own clock jumps (an hour ahead, say)
can neither evict another's live slot nor move a window; `StoreClock(clock)` sends
`clock.now()` as `:now` instead (tests move time that way); an application `Clock` is
a `TypeError`, as for every store on the store's time. A slot is live while `expires_at > now`,
as a lease is. With database time a slot take reads the time once under the key's lock
(one `SELECT` more) and decides with it; a renewal and a pause's read read it inside
their one statement; a window's start is counted from a time read just before its upsert.

Each limited key has one row in `agboss_rate_limit_keys`: the lock under which its
slots are counted and taken, its current window and its pause.

- `acquire_slot` is one transaction that takes the key row's lock in its first
  statement (an upsert: `INSERT … ON CONFLICT DO UPDATE` / `ON DUPLICATE KEY UPDATE`
  locks the row whether it inserts or not; SQLite's `BEGIN IMMEDIATE` already holds
  the database's write lock, so the statement is left out there; on a Galera cluster,
  where the lock holds on one node only, it raises the row's `slot_takes` so that
  concurrent takes on different nodes conflict at certification), then reads the
  key's slots with a locking read, then writes this holder's slot when it is admitted
  (and deletes expired slots of the key when it saw any).
- `add_to_window` is one upsert that decides, adds and answers under the row's lock:
  it resets the window when the stored start differs from this call's start, adds the
  amount only while `used + amount <= limit`, and records whether it did.
- `pause_until` is one upsert with `greatest`; `paused_until` one read.

Statements per operation (BEGIN/COMMIT not counted):

| operation | PostgreSQL | MariaDB | MySQL 8 | SQLite |
|---|---|---|---|---|
| `acquire_slot` | 3 in a transaction (2 when refused; +1 to delete expired slots) | the same | the same | 2 (1 when refused; +1) |
| `renew_slot`, `release_slot`, `pause_until`, `paused_until` | 1 | 1 | 1 | 1 |
| `add_to_window` | 1 | 1 | 2 in a transaction (the upsert, then a read of the locked row) | 1 |

On database time `acquire_slot` and `add_to_window` send one statement more (the time's
read); the others read it inside their statement.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import (
    checked_count,
    checked_positive_ms,
    checked_time,
)
from agboss_sql.contracts.stores import RateLimitRepository
from agboss_sql.contracts.types import WindowResult
from agboss_sql.sql._base import StoreClockStore
from agboss_sql.sql._fence import store_time_params
from agboss_sql.sql.connection import Exec, SqlBuilder, Step
from agboss_sql.sql.schema import rate_limit_keys, rate_limit_slots

K = rate_limit_keys
S = rate_limit_slots

_WINDOW_ANSWER = ("window_allowed", "window_used", "window_start")


class RateLimitStatements:
    """The rate limit statements for one dialect and one kind of store time."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        self.row_locks: bool = b.capabilities.row_locks
        self.database_time = b.database_time
        # `store_now` reads the store's time inside its statement; `now` is a time read
        # before (by `read_now`, under the key's lock for a slot take) and sent as `:now`.
        _, store_now = b.now()
        self.read_now = sa.select(store_now.label("now"))
        now = sa.bindparam("now", type_=sa.BigInteger)
        key: sa.BindParameter[str] = sa.bindparam("key")
        holder: sa.BindParameter[str] = sa.bindparam("holder")
        ttl = sa.bindparam("ttl_ms", type_=sa.BigInteger)
        of_key = S.c.key == key
        of_holder = sa.and_(of_key, S.c.holder == holder)

        # Inserts the key's row if absent and, either way, holds its lock to the end of
        # the transaction: the gate every slot take of the key passes one at a time.
        self.lock_key = ops.upsert(K, ["key"], {"key": key}, lambda new: {"key": new.key})
        # On a cluster that certifies write sets the lock is local to a node: the gate
        # changes the row there (`slot_takes`), so concurrent takes of the key on different
        # nodes conflict at certification and the later runs again.
        self.lock_key_counting = ops.upsert(
            K, ["key"], {"key": key}, lambda _new: {"slot_takes": K.c.slot_takes + 1}
        )
        self.slots_of_key = ops.for_update(
            sa.select(S.c.holder, S.c.expires_at).where(of_key).order_by(S.c.holder)
        )
        self.delete_expired = sa.delete(S).where(of_key, S.c.expires_at <= now)
        # Only reached for an admitted holder: a live slot of its own is never shortened.
        self.take_slot = ops.upsert(
            S,
            ["key", "holder"],
            {"key": key, "holder": holder, "expires_at": now + ttl},
            lambda new: {"expires_at": ops.greatest(S.c.expires_at, new.expires_at)},
        )
        self.renew_slot = (
            sa.update(S)
            .where(of_holder, S.c.expires_at > store_now)
            .values(expires_at=ops.greatest(S.c.expires_at, store_now + ttl))
        )
        self.release_slot = sa.delete(S).where(of_holder)

        amount = sa.bindparam("amount", type_=sa.BigInteger)
        limit = sa.bindparam("limit", type_=sa.BigInteger)
        start = sa.bindparam("window_start", type_=sa.BigInteger)
        fits_alone = amount <= limit
        # A NULL start (a row made for slots or a pause) is another window: CASE's ELSE.
        same_window = K.c.window_start == start
        fits = K.c.window_used + amount <= limit

        def add(new: Any) -> dict[str, Any]:
            # MySQL assigns left to right, each seeing the columns assigned before it:
            # both decisions read the old window before window_start moves.
            return {
                "window_allowed": sa.case((same_window, fits), else_=new.window_allowed),
                "window_used": sa.case(
                    (same_window, sa.case((fits, K.c.window_used + amount), else_=K.c.window_used)),
                    else_=new.window_used,
                ),
                "window_start": new.window_start,
            }

        add_to_window = ops.upsert(
            K,
            ["key"],
            {
                "key": key,
                "window_start": start,
                "window_used": sa.case((fits_alone, amount), else_=sa.literal(0, sa.BigInteger)),
                "window_allowed": fits_alone,
            },
            add,
        )
        self.add_to_window = add_to_window
        # For a database that returns from an upsert (`Capabilities.insert_returning`).
        self.add_to_window_returning: Any = ops.returning(
            add_to_window, *(K.c[name] for name in _WINDOW_ANSWER)
        )
        self.read_window = sa.select(*(K.c[name] for name in _WINDOW_ANSWER)).where(K.c.key == key)

        until = sa.bindparam("until", type_=sa.BigInteger)
        self.pause_until = ops.upsert(
            K,
            ["key"],
            {"key": key, "paused_until": until},
            lambda new: {
                "paused_until": ops.greatest(
                    sa.func.coalesce(K.c.paused_until, new.paused_until), new.paused_until
                )
            },
        )
        self.paused_until = sa.select(K.c.paused_until).where(
            K.c.key == key, K.c.paused_until > store_now
        )


class SqlRateLimitRepository(StoreClockStore[RateLimitStatements], RateLimitRepository):
    """Rate limits on SQL, on the store's time (the database's clock with `StoreClock()`): a
    key's slots are counted and taken under its row's lock and never exceed `max_slots`,
    whatever any instance's own clock says; a fixed window (aligned to multiples of
    `window_ms`, one per key) adds only what fits; a pause never shortens."""

    statements = RateLimitStatements

    def _params(self, **params: Any) -> dict[str, Any]:
        return store_time_params(self.store_clock, **params)

    async def acquire_slot(self, key: str, holder: str, max_slots: int, ttl_ms: int) -> bool:
        """Under the key's lock: take a slot for `holder` until `now + ttl_ms` while fewer
        than `max_slots` other holders have a live slot; a holder's own live slot is
        refreshed (never shortened) and always admitted. Never more than `max_slots`."""
        checked_identifier("key", key)
        checked_identifier("holder", holder)
        checked_count("max_slots", max_slots)
        checked_positive_ms("ttl_ms", ttl_ms)
        params = self._params(key=key, holder=holder, ttl_ms=ttl_ms)
        return await self.connection.run(lambda: self._acquire_slot(params, max_slots))

    def _acquire_slot(self, params: dict[str, Any], max_slots: int) -> Step[bool]:
        if self._sql.row_locks:
            counting = self.connection.capabilities.certified_writes
            yield Exec(self._sql.lock_key_counting if counting else self._sql.lock_key, params)
        if self._sql.database_time:
            # Read under the key's lock (SQLite: inside BEGIN IMMEDIATE): every take of the
            # key decides in the order it got the lock, each with the time it got it.
            params = {**params, "now": _time_of((yield Exec(self._sql.read_now, params)))}
        slots = (yield Exec(self._sql.slots_of_key, params)).rows
        now, holder = params["now"], params["holder"]
        mine = any(h == holder and expires_at > now for h, expires_at in slots)
        others = sum(1 for h, expires_at in slots if h != holder and expires_at > now)
        if any(expires_at <= now for _, expires_at in slots):
            yield Exec(self._sql.delete_expired, params)
        if not mine and others >= max_slots:
            return False
        yield Exec(self._sql.take_slot, params)
        return True

    async def renew_slot(self, key: str, holder: str, ttl_ms: int) -> bool:
        """Extend the holder's live slot to `max(expires_at, now + ttl_ms)` in one
        statement. False when it has none (never held, released, or expired)."""
        checked_identifier("key", key)
        checked_identifier("holder", holder)
        checked_positive_ms("ttl_ms", ttl_ms)
        params = self._params(key=key, holder=holder, ttl_ms=ttl_ms)
        return (await self.connection.execute(self._sql.renew_slot, params)).rowcount == 1

    async def release_slot(self, key: str, holder: str) -> None:
        """Give the holder's slot back (one statement; harmless when it holds none)."""
        checked_identifier("key", key)
        checked_identifier("holder", holder)
        await self.connection.execute(self._sql.release_slot, {"key": key, "holder": holder})

    async def add_to_window(
        self, key: str, window_ms: int, amount: int, limit: int
    ) -> WindowResult:
        """In one upsert under the key row's lock: in the fixed window starting at
        `now - now % window_ms` (a new window starts empty), add `amount` when
        `used + amount <= limit`; a refused amount is not added. The answer names whether
        it was added, the window's use after the call and when the window resets."""
        checked_identifier("key", key)
        checked_positive_ms("window_ms", window_ms)
        checked_count("amount", amount)
        checked_count("limit", limit)
        if self._sql.database_time:
            now = _time_of(await self.connection.execute(self._sql.read_now))
        else:
            now = self.store_clock.now()
        params = {
            "key": key,
            "window_start": now - now % window_ms,
            "amount": amount,
            "limit": limit,
        }
        # One statement where the upsert returns its row; else the upsert and a read, in one
        # transaction. (Until a MySQL-family server first answered, it may be either.)
        row = await self.connection.run(
            lambda: self._add_to_window(params),
            transaction=not self.connection.capabilities.insert_returning,
        )
        if row is None:
            raise RuntimeError(f"the window of {key!r} was not written")
        allowed, used, start = row
        return WindowResult(allowed=bool(allowed), used=int(used), resets_at=int(start) + window_ms)

    def _add_to_window(self, params: dict[str, Any]) -> Step[Any]:
        # Inside the step the server's capabilities are known (MariaDB returns from upserts).
        if self.connection.capabilities.insert_returning:
            return (yield Exec(self._sql.add_to_window_returning, params)).first()
        yield Exec(self._sql.add_to_window, params)
        # The upsert locked the row for this transaction: the read sees what it wrote.
        return (yield Exec(self._sql.read_window, params)).first()

    async def pause_until(self, key: str, until: int) -> None:
        """Pause `key` until `until` in one statement; a longer pause already set stands."""
        checked_identifier("key", key)
        checked_time("until", until)
        await self.connection.execute(self._sql.pause_until, {"key": key, "until": until})

    async def paused_until(self, key: str) -> int | None:
        """The end of the key's pause, or `None` once `now >= until` (or never paused)."""
        checked_identifier("key", key)
        result = await self.connection.execute(self._sql.paused_until, self._params(key=key))
        until = result.scalar()
        return None if until is None else int(until)


def _time_of(result: Any) -> int:
    """The store's time a `read_now` answered."""
    return int(result.scalar())


__all__ = ["RateLimitStatements", "SqlRateLimitRepository"]
