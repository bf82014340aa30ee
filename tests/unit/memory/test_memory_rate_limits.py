"""The in-memory rate limits keep every promise of `RateLimitRepository` (docs/contracts.md)."""

from __future__ import annotations

import asyncio

import pytest
from memory_cluster import START, Cluster

from agboss_sql.contracts import ApplicationContext, StoreClock, VirtualClock, WindowResult
from agboss_sql.memory import InMemoryBackend, InMemoryRateLimitRepository

TTL = 60_000

# slots


async def test_slots_are_taken_up_to_the_maximum(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    assert await limits.acquire_slot("model", "a", 2, TTL)
    assert await limits.acquire_slot("model", "b", 2, TTL)
    assert await limits.acquire_slot("model", "c", 2, TTL) is False
    assert await limits.acquire_slot("other-model", "c", 2, TTL)


async def test_a_holders_live_slot_counts_once_and_is_refreshed(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    assert await limits.acquire_slot("model", "a", 1, TTL)
    await cluster.clock.advance(TTL - 1)
    assert await limits.acquire_slot("model", "a", 1, TTL)
    await cluster.clock.advance(TTL - 1)
    # Refreshed at the second take: still held, so b is refused.
    assert await limits.acquire_slot("model", "b", 1, TTL) is False


@pytest.mark.parametrize(("offset", "free"), [(-1, False), (0, True), (1, True)])
async def test_an_expired_slot_does_not_count(cluster: Cluster, offset: int, free: bool) -> None:
    limits = cluster.limits(1)
    assert await limits.acquire_slot("model", "a", 1, TTL)
    await cluster.clock.advance(TTL + offset)
    assert await cluster.limits(2).acquire_slot("model", "b", 1, TTL) is free


async def test_renew_extends_a_live_slot_only(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    assert await limits.renew_slot("model", "a", TTL) is False
    assert await limits.acquire_slot("model", "a", 1, TTL)
    await cluster.clock.advance(TTL - 1)
    assert await limits.renew_slot("model", "a", TTL) is True
    await cluster.clock.advance(TTL - 1)
    assert await limits.acquire_slot("model", "b", 1, TTL) is False
    await cluster.clock.advance(1)
    assert await limits.renew_slot("model", "a", TTL) is False
    assert await limits.acquire_slot("model", "b", 1, TTL) is True


async def test_renew_never_shortens_a_slot(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    assert await limits.acquire_slot("model", "a", 1, TTL)
    assert await limits.renew_slot("model", "a", 10)
    await cluster.clock.advance(TTL - 1)
    assert await limits.acquire_slot("model", "b", 1, TTL) is False


async def test_release_gives_the_slot_back(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    assert await limits.acquire_slot("model", "a", 1, TTL)
    await limits.release_slot("model", "a")
    await limits.release_slot("model", "a")
    await limits.release_slot("unknown", "a")
    assert await limits.acquire_slot("model", "b", 1, TTL)


async def test_twenty_concurrent_takers_never_exceed_the_maximum(cluster: Cluster) -> None:
    taken = await asyncio.gather(
        *(cluster.limits(i).acquire_slot("model", f"h-{i}", 5, TTL) for i in range(20))
    )
    assert taken.count(True) == 5
    assert len(cluster.backend.slots["model"]) == 5


async def test_zero_slots_admit_nobody(cluster: Cluster) -> None:
    assert await cluster.limits(1).acquire_slot("model", "a", 0, TTL) is False


# windows


async def test_a_window_counts_within_its_limit_and_refuses_without_adding(
    cluster: Cluster,
) -> None:
    limits = cluster.limits(1)
    window = 60_000
    start = START - START % window
    assert await limits.add_to_window("calls", window, 3, 5) == WindowResult(
        True, 3, start + window
    )
    assert await limits.add_to_window("calls", window, 3, 5) == WindowResult(
        False, 3, start + window
    )
    assert await limits.add_to_window("calls", window, 2, 5) == WindowResult(
        True, 5, start + window
    )
    assert await limits.add_to_window("calls", window, 0, 5) == WindowResult(
        True, 5, start + window
    )


async def test_an_amount_above_the_limit_is_refused(cluster: Cluster) -> None:
    result = await cluster.limits(1).add_to_window("tokens", 1_000, 11, 10)
    assert (result.allowed, result.used) == (False, 0)


async def test_windows_are_fixed_and_aligned_to_their_size(cluster: Cluster) -> None:
    clock = VirtualClock(120_000 + 59_999)
    limits = InMemoryRateLimitRepository(
        InMemoryBackend(), StoreClock(clock), ApplicationContext("i")
    )
    assert await limits.add_to_window("calls", 60_000, 5, 5) == WindowResult(True, 5, 180_000)
    assert await limits.add_to_window("calls", 60_000, 1, 5) == WindowResult(False, 5, 180_000)
    await clock.advance(1)
    assert await limits.add_to_window("calls", 60_000, 1, 5) == WindowResult(True, 1, 240_000)


async def test_keys_count_apart(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    assert (await limits.add_to_window("calls", 60_000, 5, 5)).allowed
    assert (await limits.add_to_window("tokens", 60_000, 5, 5)).allowed
    assert not (await limits.add_to_window("calls", 60_000, 1, 5)).allowed


async def test_a_key_asked_with_another_window_size_restarts_when_the_start_differs() -> None:
    clock = VirtualClock(61_000)
    limits = InMemoryRateLimitRepository(
        InMemoryBackend(), StoreClock(clock), ApplicationContext("i")
    )
    assert await limits.add_to_window("calls", 60_000, 5, 5) == WindowResult(True, 5, 120_000)
    # The one-second window starts at 61_000, not at 60_000: a new count.
    assert await limits.add_to_window("calls", 1_000, 1, 5) == WindowResult(True, 1, 62_000)


async def test_concurrent_adds_never_exceed_the_limit(cluster: Cluster) -> None:
    results = await asyncio.gather(
        *(cluster.limits(i).add_to_window("calls", 60_000, 1, 7) for i in range(20))
    )
    assert [r.allowed for r in results].count(True) == 7
    assert max(r.used for r in results) == 7


@pytest.mark.parametrize(
    ("window_ms", "amount", "limit"), [(0, 1, 1), (1_000, -1, 1), (1_000, 1, -1)]
)
async def test_window_arguments_are_checked(
    cluster: Cluster, window_ms: int, amount: int, limit: int
) -> None:
    with pytest.raises(ValueError):
        await cluster.limits(1).add_to_window("calls", window_ms, amount, limit)


# pauses


async def test_a_pause_holds_until_its_end_and_is_none_once_past(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    assert await limits.paused_until("model") is None
    await limits.pause_until("model", START + 1_000)
    assert await cluster.limits(2).paused_until("model") == START + 1_000
    await cluster.clock.advance(999)
    assert await limits.paused_until("model") == START + 1_000
    await cluster.clock.advance(1)
    assert await limits.paused_until("model") is None


async def test_a_pause_is_never_shortened(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    await limits.pause_until("model", START + 5_000)
    await limits.pause_until("model", START + 1_000)
    assert await limits.paused_until("model") == START + 5_000
    await limits.pause_until("model", START + 9_000)
    assert await limits.paused_until("model") == START + 9_000


async def test_a_pause_in_the_past_is_no_pause(cluster: Cluster) -> None:
    limits = cluster.limits(1)
    await limits.pause_until("model", START - 1)
    assert await limits.paused_until("model") is None


def test_rate_limits_run_on_the_stores_time() -> None:
    for application_clock in (VirtualClock(START), object()):
        with pytest.raises(TypeError, match="store's time"):
            InMemoryRateLimitRepository(
                InMemoryBackend(), application_clock, ApplicationContext("i")
            )  # type: ignore[arg-type]
    on_store_time = InMemoryRateLimitRepository(
        InMemoryBackend(), StoreClock(), ApplicationContext("i")
    )
    assert on_store_time.store_clock.is_database_time
