"""The searches: every schedule of two instances to a depth, seeded walks of three, the
races in both orders; shrinking a failure to its minimal schedule and printing it."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.clocks import SkewedClock, StoreClock, VirtualClock
from agboss_sql.contracts.types import ApplicationContext, LeaseCheck
from agboss_sql.testing._case import BusinessRows, Seam, StoreFactory, as_factory
from agboss_sql.testing._errors import (
    INVALID_OPTION,
    OPTED_OUT_STORE,
    StoreConformanceError,
)
from agboss_sql.testing.explorer._model import InstanceStores
from agboss_sql.testing.explorer._races import Race, matches, races_of
from agboss_sql.testing.explorer._sim import Sim
from agboss_sql.testing.explorer._world import (
    CLAIM,
    EFFECT,
    END,
    READ,
    RECONCILE,
    RECORD,
    SEND,
    SEND_REFUSED,
    SKEWS,
    STALE,
    START_MS,
    TIME,
    WAIT_EXPIRY,
    WORLDS,
    Action,
    Broken,
    World,
)

logger = logging.getLogger("agboss_sql.testing.explorer")

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


def _skew_of(skew_index: int, instance: int) -> int:
    if instance == 0:
        return 0
    skew = SKEWS[skew_index]
    return skew if instance % 2 == 1 else -skew


def _clocks_line(n: int, skew_index: int) -> str:
    parts = ["instance-1 on the run's time"]
    for i in range(1, n):
        parts.append(f"instance-{i + 1} {_skew_of(skew_index, i):+d} ms")
    return "clocks: " + ", ".join(parts) + "; the store decides by the run's time"


_WEIGHTS = {EFFECT: 3, READ: 2, RECORD: 3, RECONCILE: 3, CLAIM: 3, SEND: 3, SEND_REFUSED: 1, END: 3}
"""How much likelier a walk takes a step of the work (the effect, the call's protocol) than
a lease move or a wait: a walk of uniform steps rarely gets a call through to its end."""


_STALE_WEIGHT = 0.25
"""A move out of turn is less likely than any good-faith step: an instance has many of them
(every context it held, every move), and a walk of mostly zombie moves rarely gets the work
through to its end."""


def _weight(op: str) -> float:
    return _STALE_WEIGHT if op.startswith(STALE) else _WEIGHTS.get(op, 1)


def _setup_lines(sim: Sim) -> list[str]:
    """The world's set-up, printed after a schedule that started from it."""
    if not sim.world.setup:
        return []
    return [
        "every schedule of this world starts from its set-up:",
        *(f"   {text}" for text in sim.setup_log),
    ]


class _Stopped(Exception):
    """The search reached its time limit."""


class _Found(Exception):
    """A search step broke an invariant."""

    def __init__(self, skew: int, schedule: tuple[Action, ...], broken: Broken) -> None:
        super().__init__(broken.message)
        self.skew = skew
        self.schedule = schedule
        self.broken = broken


class _Reads:
    """How often the stores read an instance's own wall clock."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class _WatchedClock(SkewedClock):
    """An instance's own clock (the run's time off by its skew) that counts the reads of
    its wall time: a store that never reads it cannot answer differently under another
    skew."""

    def __init__(self, base: VirtualClock, offset_ms: int, reads: _Reads) -> None:
        super().__init__(base, offset_ms)
        self._reads = reads

    def now(self) -> int:
        self._reads.count += 1
        return super().now()


class Explorer:
    """One world over one store set: builds the instances' stores, resets between
    schedules, and runs the searches."""

    def __init__(
        self,
        factories: Mapping[str, StoreFactoryLike],
        world: World,
        *,
        name: str,
        reset: Reset | None,
        business_rows: BusinessRows | None,
        seed: int,
        time_limit: float,
    ) -> None:
        self.factories = {key: as_factory(value) for key, value in factories.items()}
        missing = [key for key in world.needs if key not in self.factories]
        if missing:
            raise StoreConformanceError.of(
                INVALID_OPTION,
                f"the {world.title} needs the {', '.join(missing)} store(s); the set gives "
                f"{', '.join(sorted(self.factories)) or 'none'}",
            )
        if world.queue and reset is None and self.factories["child_queue"].reset is None:
            raise StoreConformanceError.of(
                INVALID_OPTION,
                f"the {world.title} needs a reset: a claim takes any tenant's queued child, "
                "so its schedules cannot share a queue",
            )
        self.world = world
        self.name = name
        self.business_rows = business_rows if world.effect else None
        self.seed = seed
        self.time_limit = time_limit
        self.clock = VirtualClock(START_MS)
        resets: list[Reset] = [] if reset is None else [reset]
        for key in (*world.needs, "outbound_call"):
            factory = self.factories.get(key)
            if factory is not None and factory.reset is not None and factory.reset not in resets:
                resets.append(factory.reset)
        self.resets = resets
        self.uid = secrets.token_hex(4)
        self.schedule_number = 0
        self._built: list[tuple[StoreFactory, Any]] = []
        self._sims: dict[tuple[int, int], Sim] = {}
        self._deadline = 0.0
        self.reads = _Reads()
        self.lease_state_of = "outbound_call" in self.factories and not self._opted_out(
            "outbound_call"
        )

    # --- stores and schedules -------------------------------------------------------

    def _build(self, key: str, seam: Seam) -> Any:
        factory = self.factories[key]
        store = factory.instance(seam)
        self._built.append((factory, store))
        return store

    def sim(self, n: int, skew_index: int) -> Sim:
        """The sim of `n` instances whose clocks are skewed by `SKEWS[skew_index]`."""
        found = self._sims.get((n, skew_index))
        if found is not None:
            return found
        world = self.world
        store_clock = StoreClock(self.clock)
        stores = []
        for i in range(n):
            skew = _skew_of(skew_index, i)
            name = f"instance-{i + 1}"
            seam = Seam(
                clock=_WatchedClock(self.clock, skew, self.reads),
                store_clock=store_clock,
                application=ApplicationContext(name),
            )
            leases = self._build("execution_lease", seam) if not world.queue else None
            effects = self._build("fenced_effect", seam) if world.effect else None
            wants_calls = world.call or (self.lease_state_of and world.ident == "lease")
            calls = self._build("outbound_call", seam) if wants_calls else None
            queue = None
            if world.queue:
                # The child queue is on the application's clock, and nothing in its world
                # waits: its stores get the run's time, so one skew's search stands for all.
                queue = self._build("child_queue", dataclasses.replace(seam, clock=self.clock))
            stores.append(InstanceStores(name, skew, leases, effects, calls, queue))
        found = Sim(
            world,
            stores,
            self.clock,
            self.business_rows,
            lease_state_of=self.lease_state_of,
        )
        self._sims[(n, skew_index)] = found
        return found

    def _opted_out(self, key: str) -> bool:
        """Whether the set's `key` store declares `WITHOUT_DOUBLE_CHARGE_PROTECTION`: then
        the lease world asks no `lease_state_of` of it (that is among what it gave up)."""
        probe = Seam(self.clock, StoreClock(self.clock), ApplicationContext("instance-1"))
        cls = type(self._build(key, probe))
        return getattr(cls, "lease_check", LeaseCheck.ATOMIC) is (
            LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION
        )

    def opted_out(self) -> list[str]:
        """The world's fencing stores that declare `WITHOUT_DOUBLE_CHARGE_PROTECTION`."""
        sim = self.sim(2, 0)
        found: list[str] = []
        stores = sim.stores[0]
        for key in self.world.fencing:
            store = stores.effects if key == "fenced_effect" else stores.calls
            cls = type(store)
            if getattr(cls, "lease_check", LeaseCheck.ATOMIC) is (
                LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION
            ):
                found.append(cls.__name__)
        return found

    async def fresh(self, sim: Sim) -> None:
        """Start a schedule from an empty store set."""
        if time.monotonic() >= self._deadline:
            # Past the limit the store is not reset again: a slow search must not corrupt
            # the cases after it.
            raise _Stopped
        for reset in self.resets:
            await reset()
        self.schedule_number += 1
        # Without a reset, every schedule works in a tenant of its own.
        tenant = "tenant-1" if self.resets else f"explorer-{self.uid}-{self.schedule_number}"
        sim.start(tenant, f"interleavings/{self.uid}/{self.schedule_number}/")
        try:
            await sim.setup()
        except Broken as broken:
            n = len(sim.insts)
            raise InterleavingFailure(
                self._header(n, "set-up", broken.invariant, broken.message),
                invariant=broken.invariant,
                world=self.world.ident,
                mode="set-up",
            ) from None

    async def close(self) -> None:
        """Close every store it built, with its factory's close."""
        for factory, store in self._built:
            if factory.close is not None:
                await factory.close(store)
        self._built.clear()
        self._sims.clear()

    def outcomes(self) -> tuple[tuple[str, int], ...]:
        """Every kind of answer the sims saw in checked steps, with how often."""
        total: dict[str, int] = {}
        for sim in self._sims.values():
            for outcome, count in sim.outcomes.items():
                total[outcome] = total.get(outcome, 0) + count
        return tuple(sorted(total.items()))

    def start_clock(self) -> None:
        """Start the time limit: past it, no schedule starts (and no reset runs)."""
        self._deadline = time.monotonic() + self.time_limit

    # --- failures -------------------------------------------------------------------

    def _header(self, n: int, mode: str, invariant: str, message: str) -> str:
        return (
            f"interleaving explorer ({self.name}, {self.world.title}, {n} instances, {mode}): "
            f"[{invariant}] {message}"
        )

    async def _attempt(
        self, sim: Sim, schedule: Sequence[Action], invariant: str
    ) -> list[Action] | None:
        """Replay `schedule` with checks, skipping any step that is not possible where it
        comes: the steps it made until it broke `invariant` again, or `None` (it broke
        another invariant, or none)."""
        await self.fresh(sim)
        made: list[Action] = []
        for action in schedule:
            if action not in sim.enabled():
                continue
            made.append(action)
            try:
                await sim.run(action, True, None)
            except Broken as broken:
                return made if broken.invariant == invariant else None
        return None

    async def shrink(self, sim: Sim, schedule: Sequence[Action], invariant: str) -> list[Action]:
        """Remove every step whose removal still breaks `invariant`: runs of steps first,
        halving their length, then single steps until no single removal reproduces it."""
        current = list(schedule)
        chunk = max(1, len(current) // 2)
        while True:
            progress = False
            index = 0
            while index < len(current):
                candidate = current[:index] + current[index + chunk :]
                made = await self._attempt(sim, candidate, invariant)
                if made is not None and len(made) < len(current):
                    current = made
                    progress = True
                else:
                    index += 1
            index = 0
            while index + 1 < len(current):
                if current[index][0] == TIME and current[index + 1][0] == TIME:
                    merged = [*current[:index], (TIME, WAIT_EXPIRY, 0), *current[index + 2 :]]
                    made = await self._attempt(sim, merged, invariant)
                    if made is not None and len(made) < len(current):
                        current = made
                        progress = True
                        continue
                index += 1
            if chunk > 1:
                chunk //= 2
            elif not progress:
                return current

    async def failure(
        self,
        sim: Sim,
        skew_index: int,
        schedule: Sequence[Action],
        broken: Broken,
        mode: str,
        reproduce: str,
    ) -> InterleavingFailure:
        """The failure of `schedule`, shrunk to its minimal schedule and printed."""
        self._deadline = float("inf")  # shrinking always finishes
        minimal = await self.shrink(sim, schedule, broken.invariant)
        await self.fresh(sim)
        log: list[str] = []
        final = broken
        for action in minimal:
            try:
                await sim.run(action, True, log)
            except Broken as found:
                final = found
                break
        n = len(sim.insts)
        lines = [
            self._header(n, mode, final.invariant, final.message),
            f"minimal schedule ({len(log)} of the {len(schedule)} steps found):",
            *(f"{number:4d}. {text}" for number, text in enumerate(log, 1)),
            _clocks_line(n, skew_index),
            reproduce,
            *_setup_lines(sim),
        ]
        return InterleavingFailure(
            "\n".join(lines),
            invariant=final.invariant,
            world=self.world.ident,
            mode=mode,
            schedule=log,
            found_steps=len(schedule),
        )

    def time_limit_error(
        self, n: int, mode: str, ran: str, left: str
    ) -> InterleavingTimeLimitError:
        text = (
            f"interleaving explorer ({self.name}, {self.world.title}, {n} instances, {mode}): "
            f"stopped after {ran} because it reached its time limit ({self.time_limit:g} s); "
            f"{left} left unexplored. Raise time_limit or lower the depth or the walks to fit."
        )
        return InterleavingTimeLimitError(
            text, invariant="time-limit", world=self.world.ident, mode=mode
        )

    # --- the races ------------------------------------------------------------------

    async def races(self) -> int:
        """Both orders of every race of the world, under every skew. How many orders ran."""
        races = races_of(self.world.ident, lease_state_of=self.lease_state_of)
        orders = 0
        for skew_index in range(len(SKEWS)):
            sim = self.sim(2, skew_index)
            for race in races:
                for label, steps, expected in race.orders():
                    await self._race(sim, skew_index, race, label, steps, expected)
                    orders += 1
        return orders

    async def _race(
        self,
        sim: Sim,
        skew_index: int,
        race: Race,
        label: str,
        steps: tuple[Action, ...],
        expected: tuple[tuple[str | None, str], ...],
    ) -> None:
        await self.fresh(sim)
        log: list[str] = []
        plan = [*race.setup, *zip(steps, expected, strict=True)]
        mode = f'race "{race.name}", {label}'
        for action, (answer, invariant) in plan:
            try:
                await sim.run(action, True, log)
            except Broken as broken:
                raise self._race_failure(
                    sim, skew_index, mode, broken.invariant, broken.message, log
                ) from None
            if not matches(sim.last, answer):
                message = f"{log[-1]}, where the contract answers {answer}"
                raise self._race_failure(sim, skew_index, mode, invariant, message, log)

    def _race_failure(
        self, sim: Sim, skew_index: int, mode: str, invariant: str, message: str, log: list[str]
    ) -> InterleavingFailure:
        n = len(sim.insts)
        lines = [
            self._header(n, mode, invariant, message),
            f"schedule ({len(log)} steps):",
            *(f"{number:4d}. {text}" for number, text in enumerate(log, 1)),
            _clocks_line(n, skew_index),
            *_setup_lines(sim),
        ]
        return InterleavingFailure(
            "\n".join(lines), invariant=invariant, world=self.world.ident, mode=mode, schedule=log
        )

    # --- every schedule of two instances --------------------------------------------

    async def exhaustive(self, depth: int) -> tuple[int, int, int, int]:
        """Every schedule of two instances up to `depth` steps, each state explored once at
        the fewest steps that reach it, under the first clock skew; then under the other
        skews (all at once, depth by depth), unless no store read its instance's own clock
        in the first search: then their searches would be the same search, answer for
        answer. A failure is reported at the fewest steps over every skew searched.
        (schedules, states, steps, skews searched)."""
        totals = [0, 0, 0]
        others = list(range(1, len(SKEWS)))
        try:
            await self._search([0], depth, totals)
        except _Found as found:
            if self.reads.count:
                # A store reads its caller's clock: a shorter failure may need another skew.
                try:
                    await self._search(others, len(found.schedule) - 1, totals)
                except _Found as shorter:
                    found = shorter
                except InterleavingTimeLimitError:
                    pass  # the failure in hand is reported, if not the shortest one
            raise await self.failure(
                self.sim(2, found.skew),
                found.skew,
                found.schedule,
                found.broken,
                "exhaustive search",
                f"reproduce: the exhaustive search is deterministic (depth {depth})",
            ) from None
        if not self.reads.count:
            return totals[0], totals[1], totals[2], 1
        try:
            await self._search(others, depth, totals)
        except _Found as found:
            raise await self.failure(
                self.sim(2, found.skew),
                found.skew,
                found.schedule,
                found.broken,
                "exhaustive search",
                f"reproduce: the exhaustive search is deterministic (depth {depth})",
            ) from None
        return totals[0], totals[1], totals[2], len(SKEWS)

    async def _search(self, skews: list[int], depth: int, totals: list[int]) -> None:
        """The breadth-first search under `skews` at once: depth by depth, so each state is
        reached first at the fewest steps; each schedule replayed from reset. Raises
        `_Found` on the first broken invariant."""
        mode = "exhaustive search"
        searched = f"clock skews {', '.join(str(k + 1) for k in skews)} of {len(SKEWS)}"
        frontier: list[tuple[int, tuple[Action, ...], tuple[Action, ...], Any]] = []
        visited: set[Any] = set()
        for k in skews:
            sim = self.sim(2, k)
            try:
                await self.fresh(sim)
            except _Stopped:
                raise self.time_limit_error(
                    2,
                    mode,
                    f"{totals[0]} schedules, {totals[1]} states",
                    f"every state of {searched}",
                ) from None
            root = (k, sim.key())
            visited.add(root)
            totals[1] += 1
            frontier.append((k, (), tuple(sim.enabled()), root))
        for level in range(depth):
            next_frontier: list[tuple[int, tuple[Action, ...], tuple[Action, ...], Any]] = []
            last = level + 1 == depth
            for position, (k, schedule, actions, parent_key) in enumerate(frontier):
                sim = self.sim(2, k)
                for action in actions:
                    try:
                        await self.fresh(sim)
                    except _Stopped:
                        left = len(frontier) - position + len(next_frontier)
                        raise self.time_limit_error(
                            2,
                            mode,
                            f"{totals[0]} schedules, {totals[1]} states (depth {level + 1} of "
                            f"{depth}, {searched})",
                            f"{left} states",
                        ) from None
                    for step in schedule:
                        await sim.run(step, False, None)
                    if schedule and (k, sim.key()) != parent_key:
                        raise await self._nondeterministic(sim, k, schedule)
                    totals[0] += 1
                    totals[2] += len(schedule) + 1
                    try:
                        await sim.run(action, True, None)
                    except Broken as broken:
                        raise _Found(k, (*schedule, action), broken) from None
                    key = (k, sim.key())
                    if key in visited:
                        continue
                    visited.add(key)
                    totals[1] += 1
                    if not last:
                        next_frontier.append((k, (*schedule, action), tuple(sim.enabled()), key))
            frontier = next_frontier
            if not frontier:
                break

    async def _nondeterministic(
        self, sim: Sim, skew_index: int, schedule: tuple[Action, ...]
    ) -> InterleavingFailure:
        self._deadline = float("inf")  # the report is always finished
        await self.fresh(sim)
        log: list[str] = []
        for step in schedule:
            await sim.run(step, False, log)
        message = (
            "the same schedule, replayed from reset, got other answers: the store keeps state "
            "its reset does not clear, or answers by something other than the run's time"
        )
        lines = [
            self._header(len(sim.insts), "exhaustive search", "store-error", message),
            f"replayed schedule ({len(log)} steps):",
            *(f"{number:4d}. {text}" for number, text in enumerate(log, 1)),
            _clocks_line(len(sim.insts), skew_index),
        ]
        return InterleavingFailure(
            "\n".join(lines),
            invariant="store-error",
            world=self.world.ident,
            mode="exhaustive search",
            schedule=log,
        )

    # --- seeded walks of three instances --------------------------------------------

    async def walks(self, walks: int, walk_depth: int) -> int:
        """`walks` seeded random walks of three instances of `walk_depth` steps, the skews
        taken in turn; walk `w` is the same for the same seed whatever ran before it. How
        many steps they made."""
        steps = 0
        for walk in range(walks):
            skew_index = walk % len(SKEWS)
            sim = self.sim(3, skew_index)
            mode = f"random walk {walk + 1} of {walks}, seed {self.seed}"
            try:
                await self.fresh(sim)
            except _Stopped:
                raise self.time_limit_error(
                    3, f"random walks, seed {self.seed}", f"{walk} walks", f"{walks - walk} walks"
                ) from None
            rng = random.Random(f"{self.seed}/{self.world.ident}/{walk}")
            schedule: list[Action] = []
            for _ in range(walk_depth):
                actions = sim.enabled()
                if not actions:
                    break
                action = rng.choices(actions, [_weight(a[1]) for a in actions])[0]
                schedule.append(action)
                steps += 1
                try:
                    await sim.run(action, True, None)
                except Broken as broken:
                    raise await self.failure(
                        sim,
                        skew_index,
                        schedule,
                        broken,
                        mode,
                        f"reproduce: seed {self.seed} ({SEED_ENV}={self.seed}), walk {walk + 1}",
                    ) from None
        return steps


async def explore(
    factories: Mapping[str, StoreFactoryLike],
    *,
    world: str,
    depth: int = DEFAULT_DEPTH,
    walks: int = DEFAULT_WALKS,
    walk_depth: int = DEFAULT_WALK_DEPTH,
    seed: int | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT_S,
    reset: Reset | None = None,
    business_rows: BusinessRows | None = None,
    name: str = "store set",
    accept_without_double_charge_protection: bool = False,
) -> ExplorerReport:
    """Explore `world` over the store set `factories` (contract key -> `(seam) -> store` or
    `StoreFactory`): every schedule of two instances up to `depth` steps (each state
    explored once, at the fewest steps) and both orders of every race of the world
    (`depth=0` runs neither), then `walks` seeded walks of three instances of `walk_depth`
    steps. The races run under every clock skew and the walks take the skews in turn; the
    exhaustive search runs under every skew too, unless no store read its instance's own
    clock under the first (then every other skew's search is the same one, answer for
    answer, and the report says so). The seed is `seed`, else `AGBOSS_EXPLORER_SEED`, else
    533.

    Every schedule starts from `reset()` (and each factory's own reset); a set with no reset
    at all runs every schedule in a tenant of its own. The fenced effect's work writes its
    business row with `business_rows.insert(tx, row)` and the explorer counts
    `business_rows.committed()`.

    Raises `InterleavingFailure` (an `AssertionError`) with the minimal schedule printed on
    the first broken invariant, `InterleavingTimeLimitError` once `time_limit` seconds have
    passed (it never passes on part of its schedules), and `StoreConformanceError`
    (`[store-conformance.opted-out-store]`) for a world whose fencing store opted out of the
    lease check unless the opt-out is accepted; then the report says it was skipped. A
    finished search logs its counts and throughput.
    """
    found = WORLDS.get(world)
    if found is None:
        raise StoreConformanceError.of(
            INVALID_OPTION, f"unknown world {world!r}: one of {', '.join(WORLDS)}"
        )
    for label, value in (("depth", depth), ("walks", walks), ("walk_depth", walk_depth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StoreConformanceError.of(
                INVALID_OPTION, f"interleavings {label} must be an int >= 0, got {value!r}"
            )
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or time_limit <= 0:
        raise StoreConformanceError.of(
            INVALID_OPTION, f"interleavings time_limit must be > 0 seconds, got {time_limit!r}"
        )
    chosen = resolve_seed(seed)
    explorer = Explorer(
        factories,
        found,
        name=name,
        reset=reset,
        business_rows=business_rows,
        seed=chosen,
        time_limit=float(time_limit),
    )
    report = ExplorerReport(
        name=name,
        world=found.ident,
        title=found.title,
        depth=depth,
        walks=walks,
        walk_depth=walk_depth,
        seed=chosen,
    )
    try:
        opted_out = explorer.opted_out()
        if opted_out:
            if not accept_without_double_charge_protection:
                raise StoreConformanceError.of(
                    OPTED_OUT_STORE,
                    f"{', '.join(opted_out)} declares LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION: "
                    f"the {found.title} proves only what an atomic lease check gives; pass "
                    "accept_without_double_charge_protection=True to skip it, and never back "
                    "payments with this store",
                )
            return _replace(report, skipped=OPTED_OUT_NOTE)
        explorer.start_clock()
        races_s = search_s = walks_s = 0.0
        orders = schedules = states = steps = walk_steps = skews = 0
        if depth:
            started = time.perf_counter()
            schedules, states, steps, skews = await explorer.exhaustive(depth)
            search_s = time.perf_counter() - started
            started = time.perf_counter()
            try:
                orders = await explorer.races()
            except _Stopped:
                raise explorer.time_limit_error(
                    2, "races", "every schedule and part of the races", "the other races"
                ) from None
            races_s = time.perf_counter() - started
        if walks:
            started = time.perf_counter()
            walk_steps = await explorer.walks(walks, walk_depth)
            walks_s = time.perf_counter() - started
        report = _replace(
            report,
            race_orders=orders,
            schedules=schedules,
            states=states,
            steps=steps,
            search_s=search_s,
            walk_steps=walk_steps,
            walks_s=walks_s,
            races_s=races_s,
            skews_searched=skews,
            outcomes=explorer.outcomes(),
        )
        logger.info(report.summary())
        return report
    finally:
        await explorer.close()


def _replace(report: ExplorerReport, **changes: Any) -> ExplorerReport:
    return dataclasses.replace(report, **changes)


__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_SEED",
    "DEFAULT_TIME_LIMIT_S",
    "DEFAULT_WALKS",
    "DEFAULT_WALK_DEPTH",
    "OPTED_OUT_NOTE",
    "SEED_ENV",
    "Explorer",
    "ExplorerReport",
    "InterleavingFailure",
    "InterleavingTimeLimitError",
    "explore",
    "resolve_seed",
]
