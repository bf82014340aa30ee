"""What `explore` takes and gives back: its defaults, its report, its failures, and its seed."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agboss_sql.testing._case import Seam, StoreFactory
from agboss_sql.testing._errors import INVALID_OPTION, StoreConformanceError
from agboss_sql.testing.explorer._world import SKEWS

DEFAULT_DEPTH = 8
DEFAULT_WALKS = 200
DEFAULT_WALK_DEPTH = 30
DEFAULT_SEED = 533
DEFAULT_TIME_LIMIT_S = 8 * 60.0
SEED_ENV = "AGBOSS_EXPLORER_SEED"

OPTED_OUT_NOTE = "store opted out of the lease check: no double-charge protection"

StoreFactoryLike = Callable[[Seam], Any] | StoreFactory
Reset = Callable[[], Awaitable[None]]


class InterleavingFailure(AssertionError):
    """A schedule broke an invariant (or a race gave another outcome than the contract's).

    The message is the printed minimal schedule: each step with what the store answered.
    """

    def __init__(
        self,
        text: str,
        *,
        invariant: str,
        world: str,
        mode: str,
        schedule: Sequence[str] = (),
        found_steps: int = 0,
    ) -> None:
        super().__init__(text)
        self.invariant = invariant
        self.world = world
        self.mode = mode
        self.schedule = tuple(schedule)
        """The minimal schedule's steps, each with the store's answer."""
        self.found_steps = found_steps
        """How many steps the schedule had when it was found, before shrinking."""


class InterleavingTimeLimitError(InterleavingFailure):
    """A search reached its time limit: it fails, saying how far it got and what it left.
    It never passes on a part of its schedules."""


@dataclass(frozen=True, slots=True)
class ExplorerReport:
    """What one `explore` call ran, and how fast."""

    name: str
    world: str
    title: str
    depth: int
    walks: int
    walk_depth: int
    seed: int
    race_orders: int = 0
    schedules: int = 0
    """Schedules the exhaustive search ran (each replayed from reset)."""
    states: int = 0
    """Distinct states it reached (each explored once, at the fewest steps)."""
    steps: int = 0
    """Steps the exhaustive search made (store operations and waits), replays included."""
    search_s: float = 0.0
    walk_steps: int = 0
    """Steps the walks made."""
    walks_s: float = 0.0
    races_s: float = 0.0
    outcomes: tuple[tuple[str, int], ...] = ()
    """How often each kind of answer was seen in checked steps (search, races and walks):
    what the exploration reached, e.g. `("acquire: taken over", 812)`."""
    skews_searched: int = 0
    """Under how many clock skews the exhaustive search ran: every one, or only the first
    when no store read its instance's own clock there (the others would be the same search,
    answer for answer)."""
    skipped: str | None = None

    @property
    def schedules_per_s(self) -> float:
        return self.schedules / self.search_s if self.search_s else 0.0

    @property
    def states_per_s(self) -> float:
        return self.states / self.search_s if self.search_s else 0.0

    def seen(self, outcome: str) -> int:
        """How often `outcome` (e.g. `"effect: replayed"`) was seen."""
        return dict(self.outcomes).get(outcome, 0)

    @property
    def elapsed_s(self) -> float:
        return self.search_s + self.walks_s + self.races_s

    def summary(self) -> str:
        """One line: the counts and the throughput."""
        head = f"[interleavings] {self.name}, {self.title}"
        if self.skipped:
            return f"{head}: skipped ({self.skipped})"
        parts: list[str] = []
        if self.depth:
            skews = (
                f"{self.skews_searched} clock skews"
                if self.skews_searched != 1
                else f"1 clock skew (no store read its instance's clock: the other "
                f"{len(SKEWS) - 1} are the same search)"
            )
            parts.append(
                f"exhaustive search of 2 instances to depth {self.depth} under {skews}: "
                f"{self.schedules} schedules, {self.states} states, {self.steps} steps in "
                f"{self.search_s:.2f} s ({self.schedules_per_s:.0f} schedules/s, "
                f"{self.states_per_s:.0f} states/s); {self.race_orders} race orders in "
                f"{self.races_s:.2f} s"
            )
        if self.walks:
            rate = self.walks / self.walks_s if self.walks_s else 0.0
            parts.append(
                f"{self.walks} walks of 3 instances x {self.walk_depth} steps, seed {self.seed}: "
                f"{self.walk_steps} steps in "
                f"{self.walks_s:.2f} s ({rate:.0f} walks/s)"
            )
        return f"{head}: " + "; ".join(parts)


def resolve_seed(seed: int | None) -> int:
    """`seed`, else `AGBOSS_EXPLORER_SEED`, else 533."""
    if seed is not None:
        return int(seed)
    env = os.environ.get(SEED_ENV)
    if env:
        try:
            return int(env)
        except ValueError:
            raise StoreConformanceError.of(
                INVALID_OPTION, f"{SEED_ENV}={env!r} is not an integer seed"
            ) from None
    return DEFAULT_SEED
