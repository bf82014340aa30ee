"""The in-memory reference set through the interleaving explorer: every world, its races
in both orders, every schedule of two instances to depth 8 and 200 seeded walks of three.

Also the explorer's own promises: what each world reaches, the time limit that fails
with its counts, the seed, the opt-out, the races that catch what no invariant can, a
reset that does not reset, and `register` on a pytest class.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest
from naive_stores import MemorySet, memory_set, naive

from agboss_sql.contracts.types import ExecutionLease, LeaseCheck
from agboss_sql.memory import (
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryOutboundCallRepository,
)
from agboss_sql.testing._errors import StoreConformanceError
from agboss_sql.testing.explorer import (
    OPTED_OUT_NOTE,
    WORLDS,
    InterleavingFailure,
    InterleavingTimeLimitError,
    explore,
    options_of,
    register,
)

MUTATION_ENV = "AGBOSS_MUTATION_RUN"
"""Set to 1 by `tox -e mutation` (tools/mutation): a shallower search (depth 6) for each mutant, and no
time bound (mutants run side by side on a loaded machine, which measures no speed)."""
MUTATION_RUN = os.environ.get(MUTATION_ENV) == "1"

DEPTH = 6 if MUTATION_RUN else 8
WALKS = 200
SEED = 533

REACHED: dict[str, tuple[str, ...]] = {
    "lease": (
        "acquire: granted",
        "acquire: taken over",
        "acquire: refused",
        "renew: renewed",
        "renew: over",
        "yield: yielded",
        "reclaim: granted",
        "reclaim: refused",
        "release: done",
        "release: refused",
        "finish: done",
        "finish: refused",
        "lease_state_of: live",
        "lease_state_of: superseded",
        "lease_state_of: released",
        "lease_state_of: finished",
        "time: wait-1ms",
        "stale renew: over",
        "stale yield: refused",
        "stale reclaim: refused",
        "stale release: refused",
        "stale release: done",
        "stale finish: refused",
        "stale finish: done",
    ),
    "fenced_effect": (
        "effect: written",
        "effect: replayed",
        "effect: refused (superseded)",
        "effect: refused (expired)",
        "acquire: taken over",
        "yield: yielded",
        "reclaim: granted",
        "stale effect: refused (superseded)",
        "stale effect: refused (yielded)",
        "stale effect: refused (released)",
        "stale effect: refused (finished)",
        "stale effect: refused (expired)",
        "stale effect: replayed",
    ),
    "outbound_call_handover": (
        "read: absent",
        "record: created",
        "record: found",
        "record: refused (superseded)",
        "claim: claimed after pending",
        "claim: claimed after failed",
        "claim: refused (superseded)",
        "send: charged",
        "send: refused",
        "end: completed",
        "end: failed",
        "end: completed for another owner",
        "reconcile: superseded, landed",
        "reconcile: superseded, not-landed",
        "yield: yielded",
        "reclaim: granted",
        "stale record: refused (superseded)",
        "stale record: refused (yielded)",
        "stale claim: refused (superseded)",
        "stale claim: refused (released)",
        "stale end: refused (superseded)",
        "stale end: refused (yielded)",
    ),
    "outbound_call_takeover": (
        "acquire: taken over",
        "read: pending",
        "reconcile: superseded, not-landed",
        "reconcile: superseded, landed",
        "claim: claimed after pending",
        "claim: lost",
        "send: charged",
        "end: completed",
        "end: completed for another owner",
        "finish: done",
        "stale end: refused (superseded)",
        "stale end: refused (expired)",
        "stale claim: refused (superseded)",
    ),
    "child_queue": (
        "claim-child: claimed",
        "claim-child: none",
        "claim-children: 2",
        "claim-children: 1",
        "claim-children: 0",
        "running: 1",
        "running: 2",
        "restart: restarted",
        "restart: refused",
        "finish-child: finished, some left",
        "finish-child: finished, none left",
        "finish-child: replayed",
        "finish-child: refused",
    ),
    "outbound_call_business_key": (
        "record: created",
        "record: found",
        "claim: claimed after pending",
        "claim: lost",
        "send: charged",
        "end: completed",
        "end: completed for another owner",
        "reconcile: live",
        "reconcile: superseded, not-landed",
        "reconcile: released, not-landed",
    ),
    "lease_closing": (
        "lease_state_of: absent",
        "lease_state_of: live",
        "lease_state_of: superseded",
        "lease_state_of: released",
        "lease_state_of: finished",
        "release: done",
        "release: refused",
        "finish: done",
        "finish: refused",
        "stale release: refused",
        "stale finish: refused",
        "stale renew: over",
        "acquire: taken over",
    ),
    "child_tree": (
        "claim-child: claimed",
        "claim-children: 2",
        "running: 2",
        "restart: restarted",
        "restart: refused",
        "finish-child: finished, some left",
        "finish-child: finished, none left",
        "finish-child: refused",
        "wait: waiting",
        "wait: go on",
        "wait: none",
        "unwoken: 1",
        "claim-wake: True",
        "claim-wake: False",
        "mark-woken: True",
    ),
    "pause": (
        "resolve: resolved",
        "resolve: not pending",
        "take: True",
        "take: False",
        "cancel: True",
        "cancel: False",
        "get: read",
    ),
    "cost_ledger": (
        "reserve: granted",
        "reserve: refused",
        "record-cost: recorded",
        "record-cost: replayed",
        "reserve-together: 1 granted",
        "reserve-together: 2 granted",
        "total: read",
    ),
}
"""What each world's search and walks must reach on the reference set: a search that never
got there would pass without having proven anything."""

SHALLOWER: dict[str, int] = {"child_tree": 3, "lease_closing": 1}
"""How many levels less than `DEPTH` a world searches: the child-tree world's instances
restart, finish and wait with every attempt they saw and wake what they saw owed, about
ten times the states of the child-queue world per level (depth 6: 4,612 states in about 20
s; depth 8: 55,175 in 265 s)."""

FEWEST_STATES: dict[str, int] = {"pause": 60, **({"child_tree": 60} if MUTATION_RUN else {})}
"""A world whose every state the search reaches below 100: the pause world has 64 (each
tenant's pause pending, resolved by either instance, taken by either, or cancelled). At a
mutation run's depth the child-tree world searches 3 levels and reaches 71 states."""


DEEPER_ONLY: dict[str, tuple[str, ...]] = {
    "outbound_call_takeover": ("end: completed for another owner",),
}
"""Outcomes of `REACHED` that only a search deeper than a mutation run's (depth 6) reaches:
the takeover world replays a five-step set-up before its first free step."""


async def _explore(chosen: MemorySet, world: str, **options: Any) -> Any:
    settings: dict[str, Any] = {
        "depth": DEPTH,
        "walks": WALKS,
        "seed": SEED,
        "reset": chosen.reset,
        "business_rows": chosen.business_rows,
        "name": "in-memory",
    }
    settings.update(options)
    return await explore(chosen.factories, world=world, **settings)


@pytest.mark.parametrize("world", list(WORLDS))
async def test_the_reference_set_passes_every_world(world: str) -> None:
    started = time.perf_counter()
    depth = DEPTH - SHALLOWER.get(world, 0)
    report = await _explore(memory_set(), world, depth=depth)
    elapsed = time.perf_counter() - started
    print(report.summary())
    assert report.skipped is None
    assert report.depth == depth and report.walks == WALKS and report.seed == SEED
    assert report.schedules > report.states > FEWEST_STATES.get(world, 100)
    assert report.race_orders > 0 and report.race_orders % 2 == 0
    assert report.walk_steps == WALKS * 30
    # The reference stores decide by the store's time only: one skew's search stands for all.
    assert report.skews_searched == 1
    assert report.schedules_per_s > 0 and report.states_per_s > 0
    beyond = DEEPER_ONLY.get(world, ()) if MUTATION_RUN else ()
    missing = [o for o in REACHED[world] if o not in beyond and not report.seen(o)]
    assert not missing, f"the {world} exploration never reached: {missing}"
    # Its time is printed, not asserted: a loaded two-core machine runs a world's search
    # several times slower than an idle one (the search's bound is its time_limit).
    print(f"{world}: {elapsed:.1f} s")


async def test_a_search_that_reaches_its_time_limit_fails_with_its_counts() -> None:
    chosen = memory_set()
    resets: list[float] = []

    async def reset() -> None:
        resets.append(time.monotonic())
        await chosen.reset()

    started = time.monotonic()
    with pytest.raises(InterleavingTimeLimitError) as caught:
        await _explore(chosen, "outbound_call_business_key", reset=reset, time_limit=0.05)
    text = str(caught.value)
    assert text.startswith(
        "interleaving explorer (in-memory, outbound-call business-key world, 2 instances, "
        "exhaustive search): stopped after "
    )
    assert " schedules, " in text and " states (depth " in text
    assert "because it reached its time limit (0.05 s)" in text
    assert " states left unexplored" in text
    assert isinstance(caught.value, InterleavingFailure)
    assert caught.value.invariant == "time-limit"
    # It stopped resetting the store when the limit came.
    assert resets and max(resets) < started + 0.05 + 0.5


async def test_walks_that_reach_their_time_limit_fail_with_their_counts() -> None:
    with pytest.raises(InterleavingTimeLimitError) as caught:
        await _explore(memory_set(), "lease", depth=0, walks=10**6, time_limit=0.05)
    text = str(caught.value)
    assert f"random walks, seed {SEED}): stopped after " in text
    assert " walks left unexplored" in text


async def test_the_seed_comes_from_the_environment_and_names_the_walks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGBOSS_EXPLORER_SEED", "77")
    report = await _explore(memory_set(), "lease", depth=0, walks=3, seed=None)
    assert report.seed == 77
    assert options_of({})["seed"] == 77
    assert options_of({"seed": 5})["seed"] == 5
    monkeypatch.delenv("AGBOSS_EXPLORER_SEED")
    assert options_of({})["seed"] == 533
    monkeypatch.setenv("AGBOSS_EXPLORER_SEED", "not a number")
    with pytest.raises(StoreConformanceError):
        options_of({})


class NeverTakenOver(InMemoryExecutionLeaseRepository):
    """A lease store that never gives an expired lease to anyone else: safe, but not the
    contract (a dead holder's tree is never recovered)."""

    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        row = self.memory.leases.get((tenant_id, execution_id))
        if row is not None and not (row.released or row.yielded):
            return None
        return await super().acquire(tenant_id, execution_id, lease_ms)


async def test_the_races_catch_what_no_invariant_can() -> None:
    chosen = memory_set(leases=naive(NeverTakenOver))
    with pytest.raises(InterleavingFailure) as caught:
        await _explore(chosen, "lease", depth=3, walks=0)
    text = str(caught.value)
    assert caught.value.invariant == "race-outcome"
    assert 'race "finish vs a take past the lease", take first' in text
    assert (
        "instance-2 acquire tree-1 → refused, where the contract answers epoch 2, 30000 ms left, "
        "taken over from instance-1 at 1"
    ) in text
    assert "schedule (3 steps):" in text


async def test_a_reset_that_does_not_reset_is_a_store_error() -> None:
    chosen = memory_set()

    async def reset() -> None:
        return None

    with pytest.raises(InterleavingFailure) as caught:
        await _explore(chosen, "lease", reset=reset, walks=0)
    assert caught.value.invariant == "store-error"
    assert "the same schedule, replayed from reset, got other answers" in str(caught.value)


async def test_without_any_reset_every_schedule_gets_a_tenant_of_its_own() -> None:
    chosen = memory_set()
    factories = {key: dataclasses.replace(f, reset=None) for key, f in chosen.factories.items()}
    report = await explore(
        factories,
        world="fenced_effect",
        depth=4,
        walks=20,
        business_rows=chosen.business_rows,
        name="no reset",
    )
    assert report.states > 10
    tenants = {tenant for tenant, _ in chosen.backend.leases}
    assert len(tenants) > 100


class OptedOutEffects(InMemoryFencedEffectRepository):
    lease_check: ClassVar[LeaseCheck] = LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION


class OptedOutCalls(InMemoryOutboundCallRepository):
    lease_check: ClassVar[LeaseCheck] = LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION


async def test_an_opted_out_store_is_refused_unless_the_opt_out_is_accepted() -> None:
    chosen = memory_set(effects=naive(OptedOutEffects))
    with pytest.raises(StoreConformanceError) as caught:
        await _explore(chosen, "fenced_effect")
    assert caught.value.code == "store-conformance.opted-out-store"
    assert "OptedOutEffects declares LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION" in str(
        caught.value
    )
    report = await _explore(chosen, "fenced_effect", accept_without_double_charge_protection=True)
    assert report.skipped == OPTED_OUT_NOTE
    assert report.schedules == 0
    # The lease world runs as for any store.
    lease = await _explore(chosen, "lease", depth=3, walks=5)
    assert lease.skipped is None and lease.schedules > 0
    assert lease.seen("lease_state_of: live")
    # An outbound-call store that opted out is asked no lease_state_of there: its close of
    # an expired lease is part of what it gave up.
    calls_out = memory_set(calls=naive(OptedOutCalls))
    lease = await _explore(calls_out, "lease", depth=3, walks=5)
    assert lease.schedules > 0 and not lease.seen("lease_state_of: live")
    with pytest.raises(StoreConformanceError):
        await _explore(calls_out, "outbound_call_handover")


async def test_a_world_needs_its_stores() -> None:
    chosen = memory_set()
    only_leases = {"execution_lease": chosen.factories["execution_lease"]}
    with pytest.raises(StoreConformanceError) as caught:
        await explore(only_leases, world="fenced_effect", reset=chosen.reset)
    assert caught.value.code == "store-conformance.invalid-option"
    assert "needs the fenced_effect store" in str(caught.value)
    with pytest.raises(StoreConformanceError):
        await explore(only_leases, world="no such world")
    # Without the outbound-call store the lease world runs without lease_state_of.
    report = await explore(only_leases, world="lease", depth=4, walks=5, reset=chosen.reset)
    assert report.schedules > 0 and not report.seen("lease_state_of: live")


# --- register -----------------------------------------------------------------------------

_REGISTERED = memory_set()


class TestRegisteredInterleavings:
    """A pytest class the explorer adds its cases to, as `store_conformance` does."""


ADDED = register(
    TestRegisteredInterleavings,
    name="in-memory (registered)",
    factories=_REGISTERED.factories,
    reset=_REGISTERED.reset,
    business_rows=_REGISTERED.business_rows,
    interleavings={"depth": 3, "walks": 10, "seed": 9},
)


def test_register_adds_two_cases_per_world() -> None:
    expected = []
    for world in WORLDS:
        expected += [
            f"test_interleavings__{world}__exhaustive",
            f"test_interleavings__{world}__walks_seed_9",
        ]
    assert expected == ADDED
    for name in ADDED:
        method = getattr(TestRegisteredInterleavings, name)
        marks = [mark for mark in method.pytestmark if mark.name == "asyncio"]
        assert marks and marks[0].kwargs == {"loop_scope": "session"}
        assert method.__doc__.startswith("interleavings (in-memory (registered)): the ")
        assert method.__qualname__ == f"TestRegisteredInterleavings.{name}"


def test_register_adds_nothing_when_told_not_to_and_refuses_unknown_options() -> None:
    class Off:
        pass

    assert register(Off, name="off", factories=_REGISTERED.factories, interleavings=False) == []
    assert not [name for name in vars(Off) if name.startswith("test_")]
    with pytest.raises(StoreConformanceError) as caught:
        register(Off, name="typo", factories=_REGISTERED.factories, interleavings={"depht": 5})
    assert caught.value.code == "store-conformance.invalid-option"
    # A set without a lease store has nothing to explore.
    no_leases = {"fenced_effect": _REGISTERED.factories["fenced_effect"]}
    assert register(Off, name="no leases", factories=no_leases, interleavings={}) == []


async def test_a_registered_case_of_an_opted_out_store_is_skipped_when_accepted() -> None:
    chosen = memory_set(effects=naive(OptedOutEffects))

    class Accepted:
        pass

    class Refused:
        pass

    options = {"depth": 2, "walks": 2}
    for cls, accept in ((Accepted, True), (Refused, False)):
        register(
            cls,
            name="opted out",
            factories=chosen.factories,
            reset=chosen.reset,
            business_rows=chosen.business_rows,
            interleavings=options,
            accept_without_double_charge_protection=accept,
        )
    run: Callable[[Any], Awaitable[None]] = Accepted.test_interleavings__fenced_effect__exhaustive
    with pytest.raises(pytest.skip.Exception) as skipped:
        await run(Accepted())
    assert str(skipped.value) == OPTED_OUT_NOTE
    with pytest.raises(StoreConformanceError):
        await Refused.test_interleavings__fenced_effect__exhaustive(Refused())
    await Accepted.test_interleavings__lease__exhaustive(Accepted())


class ReadsItsCallersClock(InMemoryExecutionLeaseRepository):
    """A correct lease store that also reads its instance's own clock (and ignores it)."""

    def __init__(self, backend: Any, store_clock: Any, application: Any, own: Any) -> None:
        super().__init__(backend, store_clock, application)
        self.own = own

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        self.own.now()
        return await super().renew(lease, lease_ms)


async def test_a_store_that_reads_its_instances_clock_is_searched_under_every_skew() -> None:
    chosen = memory_set(
        leases=lambda memory, seam: ReadsItsCallersClock(
            memory, seam.store_clock, seam.application, seam.clock
        )
    )
    report = await _explore(chosen, "lease", depth=4, walks=0)
    assert report.skews_searched == 6
    untouched = await _explore(memory_set(), "lease", depth=4, walks=0)
    assert untouched.skews_searched == 1
    assert report.states == 6 * untouched.states
