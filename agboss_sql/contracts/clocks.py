"""Clocks: the application's own time and the store's time that decides leases."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from typing import Protocol, runtime_checkable

Milliseconds = int
"""Integer milliseconds: a time since the Unix epoch, or a duration."""


@runtime_checkable
class Clock(Protocol):
    """An instance's own clock: wall time, monotonic time and sleep, in ms."""

    def now(self) -> int:
        """Wall time in ms since the Unix epoch."""
        ...

    def monotonic(self) -> int:
        """A clock that never goes back, in ms, for measuring trust windows."""
        ...

    async def sleep(self, ms: int) -> None:
        """Sleep for `ms` milliseconds of this clock's time."""
        ...


class SystemClock:
    """The real clock of this host."""

    def now(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> int:
        return time.monotonic_ns() // 1_000_000

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(max(0, ms) / 1000)


class VirtualClock:
    """A clock that moves only by `advance`, waking sleepers in time order.

    `now()` and `monotonic()` read the same virtual time. `skewed(offset)`
    gives another instance's view of the same time, off by `offset` ms.
    """

    def __init__(self, start: int = 0) -> None:
        self._now = start
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._sequence = itertools.count()

    def now(self) -> int:
        return self._now

    def monotonic(self) -> int:
        return self._now

    async def sleep(self, ms: int) -> None:
        if ms <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + ms, next(self._sequence), future))
        await future

    async def advance(self, ms: int) -> None:
        """Move time forward by `ms`, waking each sleeper at its own deadline, in order."""
        if ms < 0:
            raise ValueError("a virtual clock never goes back")
        target = self._now + ms
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not future.done():
                future.set_result(None)
                # Let the woken task run before time moves past its deadline.
                for _ in range(3):
                    await asyncio.sleep(0)
        self._now = target
        await asyncio.sleep(0)

    def set(self, now: int) -> None:
        """Jump to `now` without waking sleepers (for test set-up only)."""
        self._now = now

    def skewed(self, offset_ms: int) -> SkewedClock:
        """A view of this clock's time off by `offset_ms` (another instance's wall clock)."""
        return SkewedClock(self, offset_ms)


class SkewedClock:
    """Another instance's view of a base clock: wall time off by a fixed offset."""

    def __init__(self, base: Clock, offset_ms: int) -> None:
        self.base = base
        self.offset_ms = offset_ms

    def now(self) -> int:
        return self.base.now() + self.offset_ms

    def monotonic(self) -> int:
        return self.base.monotonic()

    async def sleep(self, ms: int) -> None:
        await self.base.sleep(ms)


class StoreClock:
    """The time that decides lease expiry.

    `StoreClock()` is database time: each statement that takes, renews, yields,
    reclaims, fences or closes a lease reads the database's clock once, inside
    that statement. `StoreClock(clock)` passes `clock.now()` as a parameter
    instead, so tests can move time. A store never reads its caller's clock.
    """

    __slots__ = ("clock",)

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock

    @property
    def is_database_time(self) -> bool:
        return self.clock is None

    def now(self) -> int:
        """The injected clock's time; database-time stores read it in SQL instead."""
        if self.clock is None:
            raise RuntimeError(
                "StoreClock() is database time: read it inside the statement, not in Python"
            )
        return self.clock.now()

    def __repr__(self) -> str:
        return "StoreClock(database time)" if self.clock is None else f"StoreClock({self.clock!r})"


def remaining_of(expires_at: float, now: float) -> int:
    """Whole milliseconds left before `expires_at`, rounded down, never negative."""
    return max(0, math.floor(expires_at - now))
