"""The explorer of one world over one store set: the instances' stores it builds, each
schedule started from reset, and its failures shrunk to their minimal schedule and printed."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agboss_sql.contracts.clocks import SkewedClock, StoreClock, VirtualClock
from agboss_sql.contracts.types import ApplicationContext, LeaseCheck
from agboss_sql.testing._case import BusinessRows, Seam, StoreFactory, as_factory
from agboss_sql.testing._errors import INVALID_OPTION, StoreConformanceError
from agboss_sql.testing.explorer._model import InstanceStores
from agboss_sql.testing.explorer._report import (
    InterleavingFailure,
    InterleavingTimeLimitError,
    Reset,
    StoreFactoryLike,
)
from agboss_sql.testing.explorer._sim import Sim
from agboss_sql.testing.explorer._world import (
    SKEWS,
    START_MS,
    TIME,
    WAIT_EXPIRY,
    Action,
    Broken,
    World,
)


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


def _setup_lines(sim: Sim) -> list[str]:
    """The world's set-up, printed after a schedule that started from it."""
    if not (sim.world.setup or sim.world.deep):
        return []
    return [
        "every schedule of this world starts from its set-up:",
        *(f"   {text}" for text in sim.setup_log),
    ]


class _Stopped(Exception):
    """The search reached its time limit."""


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


class ExplorerBase:
    """One world over one store set: builds the instances' stores, resets between
    schedules, and shrinks and prints a failure (`Explorer` runs the searches)."""

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
            lease_free = world.queue or bool(world.store)
            leases = self._build("execution_lease", seam) if not lease_free else None
            effects = self._build("fenced_effect", seam) if world.effect else None
            wants_calls = (
                world.call or world.tokens or (self.lease_state_of and world.ident == "lease")
            )
            calls = self._build("outbound_call", seam) if wants_calls else None
            # The child queue, the pauses and the cost ledger are on the application's
            # clock: their stores get the run's time (a wake's claim is the only time in
            # these worlds), so one skew's search stands for all.
            on_run_time = dataclasses.replace(seam, clock=self.clock)
            queue = self._build("child_queue", on_run_time) if world.queue else None
            pauses = (
                self._build("paused_execution", on_run_time)
                if world.store == "paused_execution"
                else None
            )
            costs = (
                self._build("cost_ledger", on_run_time) if world.store == "cost_ledger" else None
            )
            stores.append(InstanceStores(name, skew, leases, effects, calls, queue, pauses, costs))
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
