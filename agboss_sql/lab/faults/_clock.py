"""The pods' clock: wall time sped up by `time_scale`, the same for every pod."""

from __future__ import annotations

import asyncio
import time


class ScaledClock:
    """A clock running `scale` times faster than the host's, from `origin_ms` (host wall
    time at which both read the same). Every pod built with the same origin and scale reads
    the same time, so it can serve as the store's time (`StoreClock(ScaledClock(...))`)."""

    def __init__(self, scale: float, origin_ms: int) -> None:
        if scale <= 0:
            raise ValueError(f"time_scale must be positive, got {scale!r}")
        self.scale = scale
        self.origin_ms = origin_ms

    def now(self) -> int:
        real = time.time_ns() // 1_000_000
        return self.origin_ms + int((real - self.origin_ms) * self.scale)

    def monotonic(self) -> int:
        return int(time.monotonic_ns() / 1_000_000 * self.scale)

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(max(0, ms) / self.scale / 1000)

    def real_ms(self, ms: int) -> float:
        """How many host milliseconds `ms` of this clock take."""
        return ms / self.scale
