"""The shape of a conformance case, shared by every contract suite and by the explorer's
worlds (`BusinessRows`, `Seam`, `StoreFactory`): beside both packages, so the explorer
needs nothing of `testing.contracts`, which runs it.

A contract suite is a module with `cases() -> list[Case]`. Each case is an
async function of a `CaseContext`, which builds the store instances the case
asks for — two instances (or more) on one backing store, on the case's
`VirtualClock` — from the store set's factories.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.contracts.clocks import Clock, StoreClock, VirtualClock
from agboss_sql.contracts.types import ApplicationContext

START_MS = 1_700_000_000_000
"""Where every case's virtual time starts."""


@dataclass(frozen=True, slots=True)
class Seam:
    """What a store factory gets: the instance's own clock (possibly skewed), the run's store
    time, and the instance's application context."""

    clock: Clock
    store_clock: StoreClock
    application: ApplicationContext


@dataclass(frozen=True, slots=True)
class StoreFactory:
    """A store factory with its own reset (before each case) and close (after it)."""

    instance: Callable[[Seam], Any]
    reset: Callable[[], Awaitable[None]] | None = None
    close: Callable[[Any], Awaitable[None]] | None = None


@dataclass(frozen=True, slots=True)
class BusinessRows:
    """How a fenced effect's work writes a business row in its transaction, and how the suite
    reads back the committed ones."""

    insert: Callable[[Any, str], Awaitable[None]]
    committed: Callable[[], Awaitable[list[str]]]


@dataclass(frozen=True, slots=True)
class Case:
    """One conformance case of one contract."""

    contract: str
    name: str
    run: Callable[[CaseContext], Awaitable[None]]
    fencing: bool = False
    """A case only an atomic lease check passes (skipped for an opted-out store)."""


def as_factory(value: Callable[[Seam], Any] | StoreFactory) -> StoreFactory:
    return value if isinstance(value, StoreFactory) else StoreFactory(instance=value)


@dataclass
class CaseContext:
    """The stores of one case: instance `i` of a contract is built once per case (per skew)."""

    factories: Mapping[str, StoreFactory]
    business_rows: BusinessRows | None = None
    clock: VirtualClock = field(default_factory=lambda: VirtualClock(START_MS))
    _built: dict[tuple[str, int, int], Any] = field(default_factory=dict)
    database_time: bool = False
    """When set (before the first store is built), the stores get `StoreClock()`: the
    database's own time decides, on real time, and the case's clock only skews the
    instances' own clocks."""

    @property
    def store_clock(self) -> StoreClock:
        """The run's time: what every store decides by."""
        return StoreClock() if self.database_time else StoreClock(self.clock)

    @staticmethod
    def instance_id(instance: int) -> str:
        return f"instance-{instance + 1}"

    def seam(self, instance: int = 0, *, skew_ms: int = 0) -> Seam:
        clock: Clock = self.clock.skewed(skew_ms) if skew_ms else self.clock
        return Seam(clock, self.store_clock, ApplicationContext(self.instance_id(instance)))

    def has(self, contract: str) -> bool:
        return contract in self.factories

    def store(self, contract: str, instance: int = 0, *, skew_ms: int = 0) -> Any:
        """Instance `instance` of the contract's store; `skew_ms` offsets its own clock."""
        key = (contract, instance, skew_ms)
        found = self._built.get(key)
        if found is None:
            found = self.factories[contract].instance(self.seam(instance, skew_ms=skew_ms))
            self._built[key] = found
        return found

    async def close(self) -> None:
        for (contract, _, _), store in list(self._built.items()):
            close = self.factories[contract].close
            if close is not None:
                await close(store)
        self._built.clear()
