"""What the fencing suites share: the lease length, unique names, keys, business rows, and
running two operations at once in both orders."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from agboss_sql.contracts.clocks import SystemClock
from agboss_sql.contracts.errors import (
    InvalidFingerprintError,
    InvalidIdentifierError,
    InvalidStepError,
)
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.stores import (
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    FencedEffectRepository,
    OutboundCallRepository,
)
from agboss_sql.contracts.types import ExecutionContext, ExecutionLease, FencedEffectKey, StepRef
from agboss_sql.testing._case import CaseContext

LEASE_MS = 30_000
"""The lease every fencing case takes."""

TENANT = "tenant-1"
OTHER_TENANT = "tenant-2"

ROUNDS = 10
"""How many rounds each race runs, each round in both orders."""

SKEWS = (
    LEASE_MS // 2,
    -LEASE_MS // 2,
    LEASE_MS,
    -LEASE_MS,
    10 * LEASE_MS,
    -10 * LEASE_MS,
)
"""How far the other instance's own clock is off in the "store's time is the authority"
cases: +-lease/2, +-lease, +-10 x lease."""

DATABASE_LEASE_MS = 500
"""The lease of the database-time cases, which wait for it on real time."""

BOUNDARIES = ((-1, "1 ms before"), (0, "exactly at"), (1, "1 ms after"))
"""Offsets from a lease's expiry that every boundary case pins, with their names."""

LEASE = "execution_lease"
LEASE_LOG = "execution_lease_event"
FENCED_EFFECT = "fenced_effect"
OUTBOUND_CALL = "outbound_call"


def fail(rule: str, message: str) -> NoReturn:
    """Fail the case on `rule`: the message starts with the rule in brackets."""
    raise AssertionError(f"[{rule}] {message}")


def expect(condition: object, rule: str, message: str) -> None:
    """Fail the case on `rule` unless `condition` holds (an `assert` that survives -O)."""
    if not condition:
        fail(rule, message)


def instance_name(instance: int) -> str:
    return CaseContext.instance_id(instance)


def skew_text(skew_ms: int) -> str:
    return f"{skew_ms:+d} ms"


async def on_database_time(ctx: CaseContext) -> None:
    """Switch the case to the database's own time (`StoreClock()`), before any store is
    built; the instances' own clocks (the case's clock, skewed) start from real time, so a
    store that reads them instead of the database's is off by exactly their skew."""
    ctx.database_time = True
    ctx.clock.set(max(ctx.clock.now(), SystemClock().now()))


async def past_database_lease() -> None:
    """Wait, on real time, until a lease of `DATABASE_LEASE_MS` taken or renewed just
    before is over."""
    await asyncio.sleep((DATABASE_LEASE_MS + 250) / 1000)


class World:
    """One case's view of the set: its stores per instance, unique names, the clock and the
    business rows its effects wrote (rows of other cases are never counted)."""

    def __init__(self, ctx: CaseContext) -> None:
        self.ctx = ctx
        self.uid = secrets.token_hex(5)
        self._names = 0

    # stores

    def leases(self, instance: int = 0, *, skew_ms: int = 0) -> ExecutionLeaseRepository:
        store: ExecutionLeaseRepository = self.ctx.store(LEASE, instance, skew_ms=skew_ms)
        return store

    def effects(self, instance: int = 0, *, skew_ms: int = 0) -> FencedEffectRepository[Any]:
        store: FencedEffectRepository[Any] = self.ctx.store(
            FENCED_EFFECT, instance, skew_ms=skew_ms
        )
        return store

    def calls(self, instance: int = 0, *, skew_ms: int = 0) -> OutboundCallRepository:
        store: OutboundCallRepository = self.ctx.store(OUTBOUND_CALL, instance, skew_ms=skew_ms)
        return store

    def log(self, instance: int = 0) -> ExecutionLeaseEventRepository:
        store: ExecutionLeaseEventRepository = self.ctx.store(LEASE_LOG, instance)
        return store

    # names

    def name(self, label: str = "tree") -> str:
        """A name no other case (and no other call of this case) uses."""
        self._names += 1
        return f"{label}-{self.uid}-{self._names}"

    # time

    @property
    def now(self) -> int:
        return self.ctx.clock.now()

    async def at(self, time_ms: int) -> None:
        """Move the run's time to `time_ms` (never back)."""
        if time_ms < self.now:
            raise RuntimeError(f"time {time_ms} is {self.now - time_ms} ms in the past")
        await self.ctx.clock.advance(time_ms - self.now)

    # leases

    async def take(
        self, tree: str, instance: int = 0, *, tenant: str = TENANT, skew_ms: int = 0
    ) -> ExecutionLease:
        """Acquire `tree`'s lease for `instance`; fail the case when it is refused."""
        lease = await self.leases(instance, skew_ms=skew_ms).acquire(tenant, tree, LEASE_MS)
        if lease is None:
            fail(
                "live-until-expiry",
                f"{instance_name(instance)} was refused the lease of {tree!r}, which is free "
                "(new, released, yielded, or expired: expires_at <= now)",
            )
        return lease

    # business rows

    def row(self, label: str) -> str:
        return f"{self.uid}:{label}"

    async def insert(self, tx: Any, label: str) -> None:
        """Write business row `label` in the effect's transaction `tx`."""
        rows = self.ctx.business_rows
        if rows is None:
            raise RuntimeError("this case writes business rows: the set gives none")
        await rows.insert(tx, self.row(label))

    async def rows(self) -> list[str]:
        """This case's committed business rows (their labels), in commit order."""
        rows = self.ctx.business_rows
        if rows is None:
            raise RuntimeError("this case reads business rows: the set gives none")
        prefix = f"{self.uid}:"
        return [row[len(prefix) :] for row in await rows.committed() if row.startswith(prefix)]

    def work(
        self,
        label: str,
        value: Any = None,
        *,
        error: BaseException | None = None,
        yields: int = 1,
    ) -> Work:
        """A fenced effect's work: writes business row `label`, yields, then returns `value`
        (or raises `error`)."""
        return Work(self, label, value, error, yields)


class Work:
    """A fenced effect's work that counts its runs."""

    def __init__(
        self, world: World, label: str, value: Any, error: BaseException | None, yields: int
    ) -> None:
        self.world = world
        self.label = label
        self.value = value
        self.error = error
        self.yields = yields
        self.calls = 0

    async def __call__(self, tx: Any) -> Any:
        self.calls += 1
        await self.world.insert(tx, self.label)
        for _ in range(self.yields):
            # Widen the gap between the store's check and its commit.
            await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        return self.value


def step_of(lease: ExecutionLease, step_key: str = "step-1") -> StepRef:
    return StepRef(lease.execution_id, step_key, "charge-step")


def context_of(lease: ExecutionLease, step_key: str = "step-1") -> ExecutionContext:
    return ExecutionContext(
        tenant_id=lease.tenant_id,
        root_execution_id=lease.execution_id,
        execution_id=lease.execution_id,
        lease=lease,
        step=step_of(lease, step_key),
    )


def key_of(
    lease: ExecutionLease,
    name: str = "charge",
    *,
    step_key: str = "step-1",
    business_key: str | None = None,
    fingerprint: str | None = None,
) -> FencedEffectKey:
    """The key of effect `name` of step `step_key`, fenced by `lease`."""
    return fenced_effect_key_of(
        context_of(lease, step_key), name, business_key=business_key, fingerprint=fingerprint
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one side of a race got: its answer, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None

    def answer(self, what: str) -> Any:
        """The answer; an unexpected exception fails the case as a store error."""
        if self.error is not None:
            fail("store-error", f"{what} raised {self.error!r}")
        return self.value


@dataclass(frozen=True, slots=True)
class Round:
    """One run of a race: its number, which side starts first, and how many turns of the
    event loop the later side waits."""

    number: int
    swapped: bool
    stagger: int

    def __str__(self) -> str:
        first = "second" if self.swapped else "first"
        return (
            f"round {self.number + 1}, the {first} side started first, {self.stagger} turns apart"
        )


def rounds(count: int = ROUNDS) -> Iterator[Round]:
    """Round after round, in both orders."""
    for number in range(count):
        for swapped in (False, True):
            yield Round(number, swapped, number % 3)


async def each_round(body: Callable[[Round], Awaitable[None]], count: int = ROUNDS) -> None:
    """Run `body` round after round, in both orders."""
    for round_ in rounds(count):
        await body(round_)


async def race(round_: Round, *sides: Callable[[], Awaitable[Any]]) -> tuple[Outcome, ...]:
    """Run `sides` at once (`asyncio.gather`), in the round's order: the sides start in
    order (reversed when swapped), each later one `stagger` turns after the one before.
    Every side's answer or exception, in the order of `sides`."""
    order = list(range(len(sides)))
    if round_.swapped:
        order.reverse()
    delays = {index: position * round_.stagger for position, index in enumerate(order)}

    async def side(index: int) -> Outcome:
        for _ in range(delays[index]):
            await asyncio.sleep(0)
        try:
            return Outcome(await sides[index]())
        except Exception as exc:
            return Outcome(error=exc)

    tasks = [asyncio.ensure_future(side(index)) for index in order]
    done = await asyncio.gather(*tasks)
    by_index = dict(zip(order, done, strict=True))
    return tuple(by_index[index] for index in range(len(sides)))


__all__ = [
    "BOUNDARIES",
    "DATABASE_LEASE_MS",
    "FENCED_EFFECT",
    "LEASE",
    "LEASE_LOG",
    "LEASE_MS",
    "OTHER_TENANT",
    "OUTBOUND_CALL",
    "ROUNDS",
    "SKEWS",
    "TENANT",
    "Outcome",
    "Round",
    "Work",
    "World",
    "context_of",
    "each_round",
    "expect",
    "fail",
    "instance_name",
    "key_of",
    "on_database_time",
    "past_database_lease",
    "race",
    "rounds",
    "skew_text",
    "step_of",
]


def unreplayable_keys(key: FencedEffectKey) -> list[tuple[str, FencedEffectKey, type[Exception]]]:
    """Keys built by hand from `key` that a first write could store but no later read could
    give back as they were (an empty step part, a step that is not a `StepRef`, a fingerprint
    that is not a text, a text no database stores, a scope that is not its lease's): what
    each is and the typed error that must refuse it before anything is written."""
    step = key.step
    # Built with replace(**Any) on purpose: these are the values the types forbid.
    hand: Any = dataclasses.replace

    def with_step(**change: Any) -> FencedEffectKey:
        return dataclasses.replace(key, step=dataclasses.replace(step, **change))

    return [
        ("an empty step idempotency key", with_step(idempotency_key=""), InvalidStepError),
        ("an empty step name", with_step(name=""), InvalidStepError),
        ("an empty step execution id", with_step(execution_id=""), InvalidStepError),
        ("a step execution id ending with a space", with_step(execution_id="e "), InvalidStepError),
        ("a NUL in the step name", with_step(name="a\x00b"), InvalidStepError),
        ("a lone surrogate in the step key", with_step(idempotency_key="\ud800"), InvalidStepError),
        (
            "a step idempotency key that is not a text",
            with_step(idempotency_key=7),
            InvalidStepError,
        ),
        (
            "a step that is not a StepRef",
            hand(key, step=(step.execution_id, step.idempotency_key, step.name)),
            InvalidStepError,
        ),
        ("an int fingerprint", hand(key, fingerprint=5), InvalidFingerprintError),
        (
            "a bytes fingerprint",
            hand(key, fingerprint=b"fp"),
            InvalidFingerprintError,
        ),
        (
            "a NUL in the fingerprint",
            dataclasses.replace(key, fingerprint="fp\x00"),
            InvalidFingerprintError,
        ),
        (
            "a scope that is not the lease's",
            dataclasses.replace(key, scope_key=key.scope_key + "-other"),
            InvalidIdentifierError,
        ),
        (
            "a NUL in the tenant id",
            dataclasses.replace(key, tenant_id=key.tenant_id + "\x00"),
            InvalidIdentifierError,
        ),
    ]
