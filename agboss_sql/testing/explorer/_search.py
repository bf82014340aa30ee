"""The searches: every schedule of two instances to a depth, seeded walks of three, the
races in both orders; `explore`, which runs them. The stores, the schedules and the printed
failures are in `_explorer`, the report and the defaults in `_report` (re-exported here)."""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

from agboss_sql.testing._case import BusinessRows
from agboss_sql.testing._errors import INVALID_OPTION, OPTED_OUT_STORE, StoreConformanceError
from agboss_sql.testing.explorer._explorer import ExplorerBase, _clocks_line, _setup_lines, _Stopped
from agboss_sql.testing.explorer._races import Race, matches, races_of
from agboss_sql.testing.explorer._report import (
    DEFAULT_DEPTH,
    DEFAULT_SEED,
    DEFAULT_TIME_LIMIT_S,
    DEFAULT_WALK_DEPTH,
    DEFAULT_WALKS,
    OPTED_OUT_NOTE,
    SEED_ENV,
    ExplorerReport,
    InterleavingFailure,
    InterleavingTimeLimitError,
    Reset,
    StoreFactoryLike,
    resolve_seed,
)
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
    WORLDS,
    Action,
    Broken,
)

logger = logging.getLogger("agboss_sql.testing.explorer")

_WEIGHTS = {EFFECT: 3, READ: 2, RECORD: 3, RECONCILE: 3, CLAIM: 3, SEND: 3, SEND_REFUSED: 1, END: 3}
"""How much likelier a walk takes a step of the work (the effect, the call's protocol) than
a lease move or a wait: a walk of uniform steps rarely gets a call through to its end."""


_STALE_WEIGHT = 0.25
"""A move out of turn is less likely than any good-faith step: an instance has many of them
(every context it held, every move), and a walk of mostly zombie moves rarely gets the work
through to its end."""


def _weight(op: str) -> float:
    return _STALE_WEIGHT if op.startswith(STALE) else _WEIGHTS.get(op, 1)


class _Found(Exception):
    """A search step broke an invariant."""

    def __init__(self, skew: int, schedule: tuple[Action, ...], broken: Broken) -> None:
        super().__init__(broken.message)
        self.skew = skew
        self.schedule = schedule
        self.broken = broken


class Explorer(ExplorerBase):
    """One world over one store set: its searches (the races, every schedule of two
    instances, the seeded walks), over the stores and schedules of `ExplorerBase`."""

    # --- the races ------------------------------------------------------------------

    async def races(self) -> int:
        """Both orders of every race of the world, under every skew (under the first only in
        a world whose stores are on the run's time). How many orders ran."""
        races = races_of(self.world.ident, lease_state_of=self.lease_state_of)
        orders = 0
        # The child queue, the pauses and the ledger are given the run's time as their
        # clock: under another skew a race is the same race, answer for answer.
        on_run_time = self.world.queue or bool(self.world.store)
        for skew_index in [0] if on_run_time else range(len(SKEWS)):
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
