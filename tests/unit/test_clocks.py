"""The clocks: the application's own time and the store's time (docs/limits.md)."""

from __future__ import annotations

import asyncio
import time

import pytest

from agboss_sql.contracts import (
    Clock,
    SkewedClock,
    StoreClock,
    SystemClock,
    VirtualClock,
    remaining_of,
)

# the system clock


def test_the_system_clock_reads_wall_and_monotonic_ms() -> None:
    clock = SystemClock()
    before = int(time.time() * 1000)
    now = clock.now()
    assert before - 5 <= now <= int(time.time() * 1000) + 5
    first = clock.monotonic()
    assert clock.monotonic() >= first


async def test_the_system_clock_sleeps_real_ms_and_never_negative() -> None:
    clock = SystemClock()
    start = clock.monotonic()
    await clock.sleep(20)
    assert clock.monotonic() - start >= 15
    await clock.sleep(-5)
    await clock.sleep(0)


def test_every_clock_is_a_clock_and_the_store_clock_is_not() -> None:
    virtual = VirtualClock()
    for clock in (SystemClock(), virtual, virtual.skewed(5)):
        assert isinstance(clock, Clock)
    assert not isinstance(StoreClock(virtual), Clock)


# the virtual clock


async def test_a_virtual_clock_moves_only_when_advanced() -> None:
    clock = VirtualClock(1_000)
    assert (clock.now(), clock.monotonic()) == (1_000, 1_000)
    await asyncio.sleep(0.01)
    assert clock.now() == 1_000
    await clock.advance(250)
    assert (clock.now(), clock.monotonic()) == (1_250, 1_250)
    await clock.advance(0)
    assert clock.now() == 1_250
    assert VirtualClock().now() == 0


async def test_a_virtual_clock_never_goes_back() -> None:
    clock = VirtualClock(10)
    with pytest.raises(ValueError):
        await clock.advance(-1)
    assert clock.now() == 10


async def test_advance_wakes_sleepers_in_deadline_order_each_at_its_deadline() -> None:
    clock = VirtualClock(0)
    woken: list[tuple[str, int]] = []

    async def sleeper(name: str, ms: int) -> None:
        await clock.sleep(ms)
        woken.append((name, clock.now()))

    tasks = [
        asyncio.create_task(sleeper(name, ms))
        for name, ms in [("c", 300), ("a", 100), ("late", 1_000), ("b", 200), ("a2", 100)]
    ]
    await asyncio.sleep(0)
    await clock.advance(500)
    assert woken == [("a", 100), ("a2", 100), ("b", 200), ("c", 300)]
    assert clock.now() == 500
    assert not tasks[2].done()
    await clock.advance(499)
    assert not tasks[2].done()
    await clock.advance(1)
    assert woken[-1] == ("late", 1_000)
    await asyncio.gather(*tasks)


async def test_a_sleeper_that_sleeps_again_within_the_advance_wakes_at_its_new_deadline() -> None:
    clock = VirtualClock(0)
    ticks: list[int] = []

    async def ticker() -> None:
        for _ in range(4):
            await clock.sleep(100)
            ticks.append(clock.now())

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await clock.advance(350)
    assert ticks == [100, 200, 300]
    await clock.advance(50)
    assert ticks == [100, 200, 300, 400]
    await task


async def test_a_zero_or_negative_sleep_returns_without_time_moving() -> None:
    clock = VirtualClock(5)
    await asyncio.wait_for(clock.sleep(0), timeout=1)
    await asyncio.wait_for(clock.sleep(-10), timeout=1)
    assert clock.now() == 5


async def test_a_cancelled_sleeper_does_not_stop_the_others() -> None:
    clock = VirtualClock(0)
    cancelled = asyncio.create_task(clock.sleep(100))
    other = asyncio.create_task(clock.sleep(200))
    await asyncio.sleep(0)
    cancelled.cancel()
    await clock.advance(300)
    assert other.done()
    assert cancelled.cancelled()


async def test_set_jumps_without_waking_sleepers() -> None:
    clock = VirtualClock(0)
    task = asyncio.create_task(clock.sleep(100))
    await asyncio.sleep(0)
    clock.set(1_000)
    await asyncio.sleep(0)
    assert clock.now() == 1_000
    assert not task.done()
    await clock.advance(0)
    assert task.done()


# skewed views


async def test_a_skewed_view_reads_the_same_time_off_by_its_offset() -> None:
    clock = VirtualClock(10_000)
    ahead = clock.skewed(15_000)
    behind = clock.skewed(-15_000)
    assert isinstance(ahead, SkewedClock)
    assert (ahead.now(), behind.now()) == (25_000, -5_000)
    await clock.advance(1_000)
    assert (ahead.now(), behind.now()) == (26_000, -4_000)
    # The monotonic clock measures durations: skew does not touch it.
    assert ahead.monotonic() == behind.monotonic() == clock.monotonic()
    assert SkewedClock(ahead, 5).now() == clock.now() + 15_005


async def test_a_skewed_view_sleeps_on_the_base_clock() -> None:
    clock = VirtualClock(0)
    view = clock.skewed(-1_000)
    task = asyncio.create_task(view.sleep(100))
    await asyncio.sleep(0)
    await clock.advance(99)
    assert not task.done()
    await clock.advance(1)
    assert task.done()


# remaining_of


@pytest.mark.parametrize(
    ("expires_at", "now", "remaining"),
    [
        (1_000, 0, 1_000),
        (1_000, 999, 1),
        (1_000, 1_000, 0),
        (1_000, 1_001, 0),
        (0, 10**12, 0),
        (1_000.9, 0, 1_000),
        (1_000, 0.5, 999),
        (1_000.5, 1_000, 0),
    ],
)
def test_remaining_of_is_whole_ms_left_rounded_down_never_negative(
    expires_at: float, now: float, remaining: int
) -> None:
    assert remaining_of(expires_at, now) == remaining
    assert isinstance(remaining_of(expires_at, now), int)


# the store's clock


def test_the_default_store_clock_is_database_time_and_is_not_read_in_python() -> None:
    clock = StoreClock()
    assert clock.is_database_time
    assert clock.clock is None
    with pytest.raises(RuntimeError, match="database time"):
        clock.now()
    assert repr(clock) == "StoreClock(database time)"


async def test_an_injected_store_clock_passes_its_clocks_time() -> None:
    base = VirtualClock(5_000)
    clock = StoreClock(base)
    assert not clock.is_database_time
    assert clock.now() == 5_000
    await base.advance(10)
    assert clock.now() == 5_010
    assert StoreClock(base.skewed(7)).now() == 5_017
    assert "StoreClock(" in repr(clock) and "database" not in repr(clock)
