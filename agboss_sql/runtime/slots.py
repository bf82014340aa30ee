"""`StepSlots`: at most `max_steps` steps of one process run at once; the rest wait in a
priority queue.

The order a waiting step is served in (lowest first):

1. `StepKind.CLOSE_BRANCH`: a step that closes a branch (the step right after a parent's
   children finished): serving it first ends work already in flight;
2. `StepKind.DEEPER`: a step of an execution already in flight, deeper first, its depth
   raised by one for every `aging_ms` it has waited (on the application clock), so a
   shallow step is never starved by a stream of deep ones;
3. `StepKind.ROOT`: the first step of a newly arriving root run.

Ties go to the step that asked first. A slot is held for one step only: a parent that
waits for its children holds none (it yields it), so every slot holder is a step that can
finish on its own, and a full process cannot deadlock on parents waiting for children that
need a slot to run.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from agboss_sql.contracts.clocks import Clock

DEFAULT_AGING_MS = 10_000


class StepKind(enum.IntEnum):
    """The three priority classes of the slot queue (lower is served first)."""

    CLOSE_BRANCH = 1
    DEEPER = 2
    ROOT = 3


@dataclass(eq=False)
class _Waiter:
    kind: StepKind
    depth: int
    asked_at: int
    seq: int
    future: asyncio.Future[None] = field(repr=False)


class StepSlots:
    """A process's step slots. `async with slots.step(kind, depth):` runs a step in a slot.

    - At most `max_steps` steps hold a slot at once.
    - A freed slot goes to the waiter first in the order of the module's docstring; the
      aging is read on `clock.monotonic()` when a slot is handed over.
    - A waiter cancelled while waiting leaves the queue; one cancelled right after it was
      handed a slot gives the slot back.
    - `full` is True while every slot is taken (readiness reports `step-slots` DEGRADED then),
      and `free` is how many are not (the recovery sweep claims no more trees than that).
    """

    def __init__(self, max_steps: int, clock: Clock, *, aging_ms: int = DEFAULT_AGING_MS) -> None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps <= 0:
            raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
        if isinstance(aging_ms, bool) or not isinstance(aging_ms, int) or aging_ms <= 0:
            raise ValueError(f"aging_ms must be a positive int, got {aging_ms!r}")
        self.max_steps = max_steps
        self.clock = clock
        self.aging_ms = aging_ms
        self._busy = 0
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def busy(self) -> int:
        """How many slots are held now."""
        return self._busy

    @property
    def free(self) -> int:
        """How many slots are not held now."""
        return self.max_steps - self._busy

    @property
    def full(self) -> bool:
        """True while every slot is held."""
        return self._busy >= self.max_steps

    @property
    def waiting(self) -> int:
        """How many steps wait for a slot."""
        return len(self._waiting)

    def rank(self, kind: StepKind, depth: int, asked_at: int, now: int) -> tuple[int, int]:
        """The sort key of a waiter at `now` (lower is served first): its class, then, for
        `DEEPER`, minus its aged depth (`depth + waited // aging_ms`)."""
        if kind is StepKind.DEEPER:
            aged = depth + max(0, now - asked_at) // self.aging_ms
            return (int(kind), -aged)
        return (int(kind), 0)

    async def acquire(self, kind: StepKind, depth: int = 0) -> None:
        """Wait for a slot (served in priority order) and hold it. Pair with `release()`."""
        if not isinstance(kind, StepKind):
            raise TypeError(f"kind must be a StepKind, got {kind!r}")
        if self._busy < self.max_steps and not self._waiting:
            self._busy += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(kind, depth, self.clock.monotonic(), next(self._seq), future)
        self._waiting.append(waiter)
        try:
            await future
        except BaseException:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif future.done() and not future.cancelled():
                # Handed a slot in the same instant it was cancelled: give it back.
                self.release()
            raise

    def release(self) -> None:
        """Give a slot back; the first waiter in priority order gets it."""
        if self._busy <= 0:
            raise RuntimeError("release() without a held slot")
        self._busy -= 1
        self._hand_over()

    def _hand_over(self) -> None:
        while self._waiting and self._busy < self.max_steps:
            now = self.clock.monotonic()
            best = min(
                self._waiting, key=lambda w: (*self.rank(w.kind, w.depth, w.asked_at, now), w.seq)
            )
            self._waiting.remove(best)
            if best.future.done():
                continue
            self._busy += 1
            best.future.set_result(None)

    @asynccontextmanager
    async def step(self, kind: StepKind, depth: int = 0) -> AsyncIterator[None]:
        """Hold a slot for the block (one step)."""
        await self.acquire(kind, depth)
        try:
            yield
        finally:
            self.release()

    def order(self) -> list[tuple[StepKind, int]]:
        """The waiters' `(kind, depth)` in the order they would be served now."""
        now = self.clock.monotonic()
        ranked = sorted(
            self._waiting, key=lambda w: (*self.rank(w.kind, w.depth, w.asked_at, now), w.seq)
        )
        return [(w.kind, w.depth) for w in ranked]


__all__ = ["DEFAULT_AGING_MS", "StepKind", "StepSlots"]
