"""The pause before a step runs again after a transient conflict (deadlock, serialization
failure): the one formula every retry loop of the SQL stores uses."""

from __future__ import annotations

import asyncio
import random

BASE_S = 0.002
"""Doubled once per attempt made: 4 ms after the first attempt, 8 ms after the second…"""
CAP_S = 0.2
"""No pause is longer than this (before its jitter)."""

_CAP_EXPONENT = 7  # BASE_S * 2**7 > CAP_S: higher powers change nothing (and could overflow)


def backoff_s(attempt: int) -> float:
    """The pause, in seconds, after attempt number `attempt` (1 for the first) met a
    transient conflict: `BASE_S * 2**attempt`, at most `CAP_S`, times a random factor in
    [0.5, 1.5] so that steps that conflicted with each other do not meet again in step."""
    return min(CAP_S, BASE_S * 2.0 ** min(attempt, _CAP_EXPONENT)) * random.uniform(0.5, 1.5)


async def back_off(attempt: int) -> None:
    """Sleep `backoff_s(attempt)`."""
    await asyncio.sleep(backoff_s(attempt))


__all__ = ["BASE_S", "CAP_S", "back_off", "backoff_s"]
