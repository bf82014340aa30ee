"""`SqlRateLimitRepository` on the database under test (docs/contracts.md).

Several `SqlConnection`s stand for several instances, all on one `VirtualClock` (the
application's clock). The races run for real; a broken twin that counts slots and then
inserts without the key's lock runs under the same race and is caught.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence

import pytest
import sqlalchemy as sa
from support.capabilities import require, row_locks
from support.sql import statements

from agboss_sql.contracts import (
    ApplicationContext,
    InvalidIdentifierError,
    StoreClock,
    VirtualClock,
    WindowResult,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.rate_limits import SqlRateLimitRepository
from agboss_sql.sql.schema import rate_limit_slots

START = 1_000_000
TTL = 60_000
WINDOW = 60_000
S = rate_limit_slots

NewConnection = Callable[[], SqlConnection]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


def store(
    connection: SqlConnection, clock: VirtualClock, instance: str = "instance-1"
) -> SqlRateLimitRepository:
    return SqlRateLimitRepository(connection, StoreClock(clock), ApplicationContext(instance))


def instances(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock, count: int
) -> list[SqlRateLimitRepository]:
    return [store(sql, clock)] + [
        store(new_connection(), clock, f"instance-{i}") for i in range(2, count + 1)
    ]


async def slot_rows(sql: SqlConnection, key: str) -> dict[str, int]:
    result = await sql.execute(
        sa.select(S.c.holder, S.c.expires_at).where(S.c.key == sa.bindparam("key")),
        {"key": key},
    )
    return {holder: int(expires_at) for holder, expires_at in result.rows}


# --- slots -----------------------------------------------------------------------------


async def test_slots_are_taken_up_to_the_maximum_per_key(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    assert await a.acquire_slot("model", "h-1", 2, TTL)
    assert await b.acquire_slot("model", "h-2", 2, TTL)
    assert await a.acquire_slot("model", "h-3", 2, TTL) is False
    assert await b.acquire_slot("other-model", "h-3", 2, TTL)
    assert await slot_rows(sql, "model") == {"h-1": START + TTL, "h-2": START + TTL}


async def test_zero_slots_admit_nobody(sql: SqlConnection, clock: VirtualClock) -> None:
    assert await store(sql, clock).acquire_slot("model", "h-1", 0, TTL) is False
    assert await slot_rows(sql, "model") == {}


async def test_a_holders_live_slot_counts_once_and_is_refreshed_never_shortened(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    assert await a.acquire_slot("model", "h-1", 1, TTL)
    await clock.advance(TTL - 1)
    assert await b.acquire_slot("model", "h-1", 1, TTL)  # refreshed, not a second slot
    assert await slot_rows(sql, "model") == {"h-1": START + 2 * TTL - 1}
    assert await a.acquire_slot("model", "h-1", 1, 10)  # a shorter ttl does not shorten it
    assert await slot_rows(sql, "model") == {"h-1": START + 2 * TTL - 1}
    await clock.advance(TTL - 1)
    assert await a.acquire_slot("model", "h-2", 1, TTL) is False


@pytest.mark.parametrize(("offset", "free"), [(-1, False), (0, True), (1, True)])
async def test_a_slot_is_live_while_expires_at_is_after_now(
    sql: SqlConnection,
    new_connection: NewConnection,
    clock: VirtualClock,
    offset: int,
    free: bool,
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    assert await a.acquire_slot("model", "h-1", 1, TTL)
    await clock.advance(TTL + offset)
    assert await b.acquire_slot("model", "h-2", 1, TTL) is free


async def test_expired_slots_of_the_key_are_deleted_by_a_take(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    limits = store(sql, clock)
    for holder in ("h-1", "h-2", "h-3"):
        assert await limits.acquire_slot("model", holder, 5, TTL)
    assert await limits.acquire_slot("other", "h-1", 5, TTL)
    await clock.advance(TTL)
    assert await limits.acquire_slot("model", "h-4", 5, 2 * TTL)
    assert await slot_rows(sql, "model") == {"h-4": START + 3 * TTL}
    assert await slot_rows(sql, "other") == {"h-1": START + TTL}  # another key's: untouched


async def test_renew_extends_a_live_slot_only_and_never_shortens_it(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    assert await a.renew_slot("model", "h-1", TTL) is False
    assert await slot_rows(sql, "model") == {}
    assert await a.acquire_slot("model", "h-1", 1, TTL)
    await clock.advance(TTL - 1)
    assert await b.renew_slot("model", "h-1", TTL) is True
    assert await b.renew_slot("model", "h-1", 10) is True
    assert await slot_rows(sql, "model") == {"h-1": START + 2 * TTL - 1}
    await clock.advance(TTL - 1)
    assert await b.acquire_slot("model", "h-2", 1, TTL) is False
    await clock.advance(1)
    assert await a.renew_slot("model", "h-1", TTL) is False  # at its end: over
    assert await b.acquire_slot("model", "h-2", 1, TTL) is True
    await b.release_slot("model", "h-2")
    assert await a.renew_slot("model", "h-2", TTL) is False


async def test_release_gives_the_slot_back_and_is_harmless_twice(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    assert await a.acquire_slot("model", "h-1", 1, TTL)
    await b.release_slot("model", "h-1")
    await b.release_slot("model", "h-1")
    await a.release_slot("never-used", "h-1")
    assert await b.acquire_slot("model", "h-2", 1, TTL)
    await a.release_slot("model", "h-9")
    assert await a.acquire_slot("model", "h-3", 1, TTL) is False


# --- windows ---------------------------------------------------------------------------


async def test_a_window_adds_within_its_limit_and_never_adds_a_refused_amount(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    resets = START - START % WINDOW + WINDOW
    assert await a.add_to_window("calls", WINDOW, 3, 5) == WindowResult(True, 3, resets)
    assert await b.add_to_window("calls", WINDOW, 3, 5) == WindowResult(False, 3, resets)
    assert await a.add_to_window("calls", WINDOW, 2, 5) == WindowResult(True, 5, resets)
    assert await b.add_to_window("calls", WINDOW, 0, 5) == WindowResult(True, 5, resets)
    assert await a.add_to_window("calls", WINDOW, 1, 5) == WindowResult(False, 5, resets)
    assert await a.add_to_window("tokens", 1_000, 11, 10) == WindowResult(False, 0, START + 1_000)
    assert await a.add_to_window("tokens", 1_000, 10, 10) == WindowResult(True, 10, START + 1_000)


async def test_windows_are_fixed_aligned_and_reset_at_their_end(
    sql: SqlConnection, new_connection: NewConnection
) -> None:
    clock = VirtualClock(120_000 + 59_999)
    a, b = instances(sql, new_connection, clock, 2)
    assert await a.add_to_window("calls", 60_000, 5, 5) == WindowResult(True, 5, 180_000)
    assert await b.add_to_window("calls", 60_000, 1, 5) == WindowResult(False, 5, 180_000)
    await clock.advance(1)
    assert await b.add_to_window("calls", 60_000, 1, 5) == WindowResult(True, 1, 240_000)
    assert await a.add_to_window("calls", 60_000, 9, 5) == WindowResult(False, 1, 240_000)


async def test_a_key_counts_in_one_window_size(sql: SqlConnection) -> None:
    """One window per key: asked with another size, the count restarts whenever the window
    start differs (as the in-memory store does)."""
    clock = VirtualClock(61_500)
    limits = store(sql, clock)
    assert await limits.add_to_window("calls", 60_000, 4, 5) == WindowResult(True, 4, 120_000)
    assert await limits.add_to_window("calls", 1_000, 2, 5) == WindowResult(True, 2, 62_000)
    assert await limits.add_to_window("calls", 60_000, 1, 5) == WindowResult(True, 1, 120_000)


async def test_window_arguments_are_checked(sql: SqlConnection, clock: VirtualClock) -> None:
    limits = store(sql, clock)
    for window_ms, amount, limit in [(0, 1, 1), (1_000, -1, 1), (1_000, 1, -1), (1_000, True, 1)]:
        with pytest.raises(ValueError):
            await limits.add_to_window("calls", window_ms, amount, limit)


# --- pauses ----------------------------------------------------------------------------


async def test_a_pause_holds_until_its_end_and_is_none_once_past(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    assert await a.paused_until("model") is None
    await a.pause_until("model", START + 1_000)
    assert await b.paused_until("model") == START + 1_000
    await clock.advance(999)
    assert await a.paused_until("model") == START + 1_000
    await clock.advance(1)
    assert await a.paused_until("model") is None
    await b.pause_until("model", START - 1)
    assert await a.paused_until("model") is None
    await b.pause_until("model", START + 5_000)
    assert await a.paused_until("model") == START + 5_000


async def test_a_pause_is_never_shortened(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    await a.pause_until("model", START + 5_000)
    await b.pause_until("model", START + 1_000)
    assert await a.paused_until("model") == START + 5_000
    await b.pause_until("model", START + 9_000)
    assert await a.paused_until("model") == START + 9_000


async def test_concurrent_pauses_keep_the_longest(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    limits = instances(sql, new_connection, clock, 4)
    ends = [START + 1_000 * ((i * 7) % 10 + 1) for i in range(20)]
    await asyncio.gather(*(limits[i % 4].pause_until("provider", e) for i, e in enumerate(ends)))
    assert await limits[0].paused_until("provider") == max(ends)


async def test_a_keys_slots_window_and_pause_stay_apart(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    a, b = instances(sql, new_connection, clock, 2)
    await a.pause_until("provider", START + 3_000)
    assert (await b.add_to_window("provider", WINDOW, 2, 5)).used == 2
    assert await a.acquire_slot("provider", "h-1", 1, TTL)
    assert await b.acquire_slot("provider", "h-2", 1, TTL) is False
    assert (await a.add_to_window("provider", WINDOW, 3, 5)).used == 5
    assert await b.paused_until("provider") == START + 3_000
    await b.release_slot("provider", "h-1")
    assert await a.paused_until("provider") == START + 3_000
    assert await b.add_to_window("provider", WINDOW, 1, 5) == WindowResult(
        False, 5, START - START % WINDOW + WINDOW
    )


# --- statements per operation, arguments -----------------------------------------------


async def test_each_operation_sends_the_fewest_statements(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    limits = store(sql, clock)
    lock = 1 if row_locks(sql) else 0  # SQLite's BEGIN IMMEDIATE is the lock already
    with statements(sql, transaction_control=False) as sent:
        assert await limits.acquire_slot("model", "h-1", 1, TTL)
    assert len(sent) == lock + 2
    if lock:
        assert sent[0].upper().startswith("INSERT") and "FOR UPDATE" in sent[1].upper()
    with statements(sql, transaction_control=False) as sent:
        assert await limits.acquire_slot("model", "h-2", 1, TTL) is False
    assert len(sent) == lock + 1
    await clock.advance(TTL)
    with statements(sql, transaction_control=False) as sent:
        assert await limits.acquire_slot("model", "h-2", 1, TTL)
    assert len(sent) == lock + 3  # the expired slot of h-1 is deleted on the way
    one_statement_window = sql.capabilities.insert_returning
    with statements(sql, transaction_control=False) as sent:
        await limits.add_to_window("calls", WINDOW, 1, 5)
    assert len(sent) == (1 if one_statement_window else 2)
    for call in (
        limits.renew_slot("model", "h-2", TTL),
        limits.release_slot("model", "h-2"),
        limits.pause_until("model", START),
        limits.paused_until("model"),
    ):
        with statements(sql, transaction_control=False) as sent:
            await call
        assert len(sent) == 1


async def test_windows_without_returning_the_mysql_8_way(
    sql: SqlConnection,
    new_connection: NewConnection,
    clock: VirtualClock,
) -> None:
    """MySQL 8 has no `RETURNING`: the upsert, then a read of the row it locked, in one
    transaction. Run here on MariaDB with its connections pinned to MySQL 8's capabilities."""
    require(not sql.capabilities.upsert_where, "MySQL-family upsert (no WHERE on the upsert)")
    limits = instances(sql, new_connection, clock, 4)

    for limit in limits:
        limit.connection.pin_capabilities(
            dataclasses.replace(limit.connection.capabilities, insert_returning=False)
        )
    with statements(sql, transaction_control=False) as sent:
        first = await limits[0].add_to_window("calls", WINDOW, 3, 5)
    assert [s.split()[0].upper() for s in sent] == ["INSERT", "SELECT"]
    assert "RETURNING" not in sent[0].upper()
    resets = START - START % WINDOW + WINDOW
    assert first == WindowResult(True, 3, resets)
    assert await limits[1].add_to_window("calls", WINDOW, 3, 5) == WindowResult(False, 3, resets)
    results = await asyncio.gather(
        *(limits[i % 4].add_to_window("tokens", WINDOW, 1, 7) for i in range(20))
    )
    assert [r.allowed for r in results].count(True) == 7
    assert sorted(r.used for r in results if r.allowed) == list(range(1, 8))


async def test_arguments_are_checked_before_any_statement(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    limits = store(sql, clock)
    with statements(sql, transaction_control=False) as sent:
        with pytest.raises(InvalidIdentifierError):
            await limits.acquire_slot("", "h-1", 1, TTL)
        with pytest.raises(InvalidIdentifierError):
            await limits.acquire_slot("model", "h" * 256, 1, TTL)
        with pytest.raises(ValueError):
            await limits.acquire_slot("model", "h-1", -1, TTL)
        with pytest.raises(ValueError):
            await limits.acquire_slot("model", "h-1", 1, 0)
        with pytest.raises(ValueError):
            await limits.renew_slot("model", "h-1", 0)
        with pytest.raises(InvalidIdentifierError):
            await limits.release_slot("model", "")
        with pytest.raises(InvalidIdentifierError):
            await limits.pause_until("", START)
        with pytest.raises(ValueError):
            await limits.pause_until("model", "soon")  # type: ignore[arg-type]
        with pytest.raises(InvalidIdentifierError):
            await limits.paused_until("")
    assert sent == []


# --- real concurrency: several instances at once ---------------------------------------


class CountThenInsertLimits(SqlRateLimitRepository):
    """BROKEN on purpose: counts the key's live slots, then inserts this holder's slot, in
    two statements without the key's lock. Concurrent takers all see room."""

    async def acquire_slot(self, key: str, holder: str, max_slots: int, ttl_ms: int) -> bool:
        now = self.store_clock.now()
        live = await self.connection.execute(
            sa.select(sa.func.count())
            .select_from(S)
            .where(S.c.key == sa.bindparam("key"), S.c.expires_at > sa.bindparam("now")),
            {"key": key, "now": now},
        )
        if int(live.scalar() or 0) >= max_slots:
            return False
        await asyncio.sleep(0)  # the gap any await between the count and the insert opens
        await self.connection.execute(
            sa.insert(S).values(
                key=sa.bindparam("key"),
                holder=sa.bindparam("holder"),
                expires_at=sa.bindparam("at"),
            ),
            {"key": key, "holder": holder, "at": now + ttl_ms},
        )
        return True


async def slot_race(
    limits: Sequence[SqlRateLimitRepository], round_: int, max_slots: int
) -> tuple[int, int]:
    """Twenty holders take a slot of one key at once through every instance; how many were
    granted, and how many live slots the key holds afterwards."""
    holders = [f"r{round_}-h-{i}" for i in range(20)]
    taken = await asyncio.gather(
        *(
            limits[i % len(limits)].acquire_slot("model", h, max_slots, TTL)
            for i, h in enumerate(holders)
        )
    )
    held = await slot_rows(limits[0].connection, "model")
    winners = [h for h, ok in zip(holders, taken, strict=True) if ok]
    for i, holder in enumerate(winners):
        await limits[i % len(limits)].release_slot("model", holder)
    return len(winners), len(held)


async def test_twenty_concurrent_takers_never_hold_more_than_max_slots(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    limits = instances(sql, new_connection, clock, 5)
    for round_ in range(6):
        granted, held = await slot_race(limits, round_, max_slots=3)
        assert (granted, held) == (3, 3), f"round {round_ + 1}"


async def test_the_slot_race_catches_a_count_then_insert_without_the_lock(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    """The broken twin, under the same race: more than `max_slots` are held."""
    broken = [CountThenInsertLimits(sql, StoreClock(clock), ApplicationContext("instance-1"))] + [
        CountThenInsertLimits(
            new_connection(), StoreClock(clock), ApplicationContext(f"instance-{i}")
        )
        for i in range(2, 6)
    ]
    exceeded = 0
    for round_ in range(10):
        granted, held = await slot_race(broken, round_, max_slots=3)
        exceeded += max(granted, held) > 3
        if exceeded:
            break
    assert exceeded > 0, "the race never granted a fourth slot: it does not bite"


async def test_twenty_concurrent_adds_never_pass_a_windows_limit(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    limits = instances(sql, new_connection, clock, 5)
    for round_ in range(3):
        amounts = [1 + (i % 3) for i in range(20)]
        results = await asyncio.gather(
            *(limits[i % 5].add_to_window("calls", WINDOW, n, 17) for i, n in enumerate(amounts))
        )
        allowed = sum(n for n, r in zip(amounts, results, strict=True) if r.allowed)
        final = await limits[0].add_to_window("calls", WINDOW, 100, 17)
        assert final.allowed is False
        assert final.used == allowed, f"round {round_ + 1}: a refused amount was added"
        assert 17 - 2 <= allowed <= 17
        assert max(r.used for r in results) <= 17
        # The answers are in one order: each allowed add saw the window grow by its amount.
        assert sorted(r.used for r in results if r.allowed)[-1] == allowed
        await clock.advance(final.resets_at - clock.now())
