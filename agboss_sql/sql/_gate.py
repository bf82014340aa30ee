"""`Gate`: one holder at a time, the next waiter handed it on release, every wait bounded.

The inline runner's connection is held by one call at a time, and every call takes it:
a free gate is taken without a timer or a suspension (`asyncio.timeout` costs a timer
handle per call, most of a lone statement's overhead on SQLite), and a busy one is
waited for in arrival order until a deadline on the loop's clock.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Gate:
    """A FIFO lock of one event loop, handed over on `leave` to the oldest waiter still
    waiting (so a newcomer never slips in between), each wait ending at its deadline."""

    __slots__ = ("held", "waiters")

    def __init__(self) -> None:
        self.held = False
        self.waiters: deque[asyncio.Future[bool]] = deque()

    def take(self) -> bool:
        """Hold the gate if it is free (True), without a coroutine; False when it is held
        (then `enter` waits for it)."""
        if self.held:
            return False
        self.held = True
        return True

    async def enter(self, deadline: float) -> bool:
        """Hold the gate: True once held; False when `deadline` (on the loop's clock) came
        first (then it is not held). A free gate is taken without suspending."""
        if not self.held:
            self.held = True
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiters.append(waiter)
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            # Handed over just as the caller was cancelled: pass it on.
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.leave()
            raise
        finally:
            timer.cancel()

    def leave(self) -> None:
        """Let go: the oldest waiter still waiting holds the gate now, else it is free."""
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self.held = False


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


__all__ = ["Gate"]
