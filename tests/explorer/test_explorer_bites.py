"""The explorer bites: each naive store fails with the invariant it breaks, and its minimal
schedule is a few steps, printed step by step with the store's answers.

Every naive store runs through both searches: the exhaustive search (depth 8) and the
seeded walks (200, seed 533). The exhaustive search finds the fewest steps that break the
invariant; a walk's failure is shrunk until no single step can be left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from naive_stores import (
    BatchClaimTakesRunning,
    CallsKeyedByStep,
    ClaimWithoutCompare,
    EffectsTrustCurrentToken,
    EndsTrustAFinishedLease,
    FinishOnlyReleases,
    LeaseStateOfFlagsFirst,
    LetGoByHolderOnly,
    LiveThroughExpiry,
    QueueFinishWithoutCompare,
    ReclaimKeepsEpoch,
    RenewFromOldEnd,
    RenewIgnoresYield,
    RenewWhateverTheTime,
    ReservationsCheckThenAdd,
    ReservationsIgnoreEntries,
    TakeRetriesForAnyone,
    WakesAWaitingParentEarly,
    memory_set,
    naive,
    on_callers_clock,
)

from agboss_sql.memory import InMemoryExecutionLeaseRepository, InMemoryFencedEffectRepository
from agboss_sql.testing.explorer import InterleavingFailure, explore
from agboss_sql.testing.explorer._search import Explorer
from agboss_sql.testing.explorer._sim import (
    ACQUIRE,
    FINISH,
    LEASE_STATE_OF,
    READ,
    RENEW,
    TIME,
    WAIT_HALF,
    WORLDS,
)

SEED = 533


@dataclass(frozen=True)
class Bite:
    label: str
    world: str
    invariant: str
    fewest_steps: int
    """The exhaustive search's minimal schedule: the fewest steps that break it."""
    stores: dict[str, Callable[..., Any]]
    walk_fewest: int = 0
    """The fewest steps of the walks' failure when it is fewer than the search's (a step
    every instance makes at once, three in a walk, two in the search)."""


BITES = [
    Bite(
        "leases on the caller's clock",
        "lease",
        "one-live-holder",
        2,
        {"leases": on_callers_clock(InMemoryExecutionLeaseRepository)},
    ),
    Bite(
        "a lease live through its expiry instant",
        "lease",
        "no-stale-write",
        3,
        {"leases": naive(LiveThroughExpiry)},
    ),
    Bite(
        "a renewal whatever the time",
        "lease",
        "no-stale-write",
        3,
        {"leases": naive(RenewWhateverTheTime)},
    ),
    Bite(
        "a renewal from the old end",
        "lease",
        "no-stale-write",
        4,
        {"leases": naive(RenewFromOldEnd)},
    ),
    Bite(
        "a finish that only releases",
        "lease",
        "no-takeover-of-finished-work",
        3,
        {"leases": naive(FinishOnlyReleases)},
    ),
    Bite(
        "a reclaim that keeps the epoch",
        "lease",
        "one-live-holder",
        3,
        {"leases": naive(ReclaimKeepsEpoch)},
    ),
    Bite(
        "a renewal that ignores a yield",
        "lease",
        "no-stale-write",
        3,
        {"leases": naive(RenewIgnoresYield)},
    ),
    Bite(
        "a release/finish that matches the holder but not the epoch",
        "lease",
        "no-stale-write",
        4,
        {"leases": naive(LetGoByHolderOnly)},
    ),
    Bite(
        "a queue finish without the attempt compare",
        "child_queue",
        "no-stale-write",
        3,
        {"queue": naive(QueueFinishWithoutCompare)},
    ),
    Bite(
        "a batch claim that takes running children",
        "child_queue",
        "one-live-holder",
        1,  # the other tenant's child runs from the world's set-up on
        {"queue": naive(BatchClaimTakesRunning)},
    ),
    Bite(
        "calls keyed by the step only",
        "outbound_call_business_key",
        "one-send-per-business-key",
        8,
        {"calls": naive(CallsKeyedByStep)},
    ),
    Bite(
        "a claim that does not compare",
        "outbound_call_business_key",
        "one-send-per-business-key",
        8,
        {"calls": naive(ClaimWithoutCompare)},
    ),
    Bite(
        "ends of an attempt that trust a finished lease",
        "outbound_call_takeover",
        "no-stale-write",
        2,
        {"calls": naive(EndsTrustAFinishedLease)},
    ),
    Bite(
        "effects that trust the current token",
        "fenced_effect",
        "no-stale-write",
        4,
        {"effects": naive(EffectsTrustCurrentToken)},
    ),
    Bite(
        "effects on the caller's clock",
        "fenced_effect",
        "no-stale-write",
        3,
        {"effects": on_callers_clock(InMemoryFencedEffectRepository)},
    ),
    Bite(
        "a lease_state_of that reads the lease's flags before the token",
        "lease_closing",
        "closed-epoch-never-moves",
        5,
        {"calls": naive(LeaseStateOfFlagsFirst)},
    ),
    Bite(
        "a queue that wakes a waiting parent at any child's finish",
        "child_tree",
        "parent-woken-once",
        3,
        {"queue": naive(WakesAWaitingParentEarly)},
    ),
    Bite(
        "a pause's take that answers True to anyone's retry",
        "pause",
        "pause-answered-once",
        3,
        {"pauses": naive(TakeRetriesForAnyone)},
    ),
    Bite(
        "reservations that leave the recorded entries out",
        "cost_ledger",
        "spend-within-budget",
        2,
        {"costs": naive(ReservationsIgnoreEntries)},
    ),
    Bite(
        "reservations checked then added in a second step",
        "cost_ledger",
        "spend-within-budget",
        2,
        {"costs": naive(ReservationsCheckThenAdd)},
        walk_fewest=1,
    ),
]

MOST_STEPS_AFTER_SHRINKING = 12
"""A walk's shrunk schedule is at most this long (it may take another, longer road to the
same invariant than the exhaustive search's fewest steps)."""

HEADER = re.compile(
    r"^interleaving explorer \((?P<name>[^,]+), (?P<world>[a-z -]+ world), (?P<n>\d) instances, "
    r"(?P<mode>[^)]+)\): \[(?P<invariant>[a-z-]+)\] (?P<message>.+)$"
)
SCHEDULE = re.compile(r"^minimal schedule \((?P<minimal>\d+) of the (?P<found>\d+) steps found\):$")
STEP = re.compile(r"^ {1,3}(?P<number>\d+)\. (?P<step>.+) → (?P<answer>.+)$")


async def _failure(bite: Bite, *, exhaustive: bool) -> InterleavingFailure:
    chosen = memory_set(**bite.stores)
    with pytest.raises(InterleavingFailure) as caught:
        await explore(
            chosen.factories,
            world=bite.world,
            depth=8 if exhaustive else 0,
            walks=0 if exhaustive else 200,
            seed=SEED,
            reset=chosen.reset,
            business_rows=chosen.business_rows,
            name=bite.label,
        )
    return caught.value


def _check_printed(failure: InterleavingFailure, bite: Bite, *, instances: int) -> list[str]:
    """The printed failure has its documented shape; returns its steps."""
    lines = str(failure).splitlines()
    header = HEADER.match(lines[0])
    assert header is not None, lines[0]
    assert header["name"] == bite.label
    assert header["world"] == WORLDS[bite.world].title
    assert header["n"] == str(instances)
    assert header["invariant"] == bite.invariant == failure.invariant
    counts = SCHEDULE.match(lines[1])
    assert counts is not None, lines[1]
    minimal = int(counts["minimal"])
    assert minimal <= int(counts["found"]) == failure.found_steps
    steps = lines[2 : 2 + minimal]
    for number, line in enumerate(steps, 1):
        step = STEP.match(line)
        # A time step says how far time moved; every other step shows the store's answer.
        assert step is not None or line.strip().startswith(f"{number}. time +"), line
        if step is not None:
            assert int(step["number"]) == number
    assert list(failure.schedule) == [line.split(". ", 1)[1] for line in steps]
    assert lines[2 + minimal].startswith("clocks: instance-1 on the run's time")
    assert lines[3 + minimal].startswith("reproduce: ")
    return steps


@pytest.mark.parametrize("bite", BITES, ids=lambda bite: bite.label)
async def test_the_exhaustive_search_finds_the_fewest_steps(bite: Bite) -> None:
    failure = await _failure(bite, exhaustive=True)
    steps = _check_printed(failure, bite, instances=2)
    assert len(steps) == bite.fewest_steps, str(failure)
    assert failure.mode == "exhaustive search"


@pytest.mark.parametrize("bite", BITES, ids=lambda bite: bite.label)
async def test_the_walks_find_it_and_shrink_it(bite: Bite) -> None:
    failure = await _failure(bite, exhaustive=False)
    steps = _check_printed(failure, bite, instances=3)
    fewest = bite.walk_fewest or bite.fewest_steps
    assert fewest <= len(steps) <= MOST_STEPS_AFTER_SHRINKING, str(failure)
    assert failure.mode.startswith("random walk ") and failure.mode.endswith(f"seed {SEED}")
    assert f"reproduce: seed {SEED} (AGBOSS_EXPLORER_SEED={SEED}), walk " in str(failure)


async def test_the_spec_example_is_what_a_store_on_the_callers_clock_prints() -> None:
    failure = await _failure(BITES[0], exhaustive=True)
    lines = str(failure).splitlines()
    assert lines[0] == (
        "interleaving explorer (leases on the caller's clock, lease world, 2 instances, "
        "exhaustive search): [one-live-holder] instance-2 was granted epoch 2 of tree-1 while "
        "instance-1 still trusts epoch 1 for 29000 ms: two live holders"
    )
    assert lines[1:4] == [
        "minimal schedule (2 of the 2 steps found):",
        "   1. instance-1 acquire tree-1 → epoch 1, 30000 ms left",
        "   2. instance-2 acquire tree-1 → epoch 2, 30000 ms left, taken over from instance-1 at 1",
    ]
    # The second instance's clock runs a lease ahead: the store took the lease by it.
    assert lines[4] == (
        "clocks: instance-1 on the run's time, instance-2 +30000 ms; the store decides by the "
        "run's time"
    )


async def test_a_failure_reproduces_from_its_seed() -> None:
    bite = next(b for b in BITES if b.label == "calls keyed by the step only")
    first = await _failure(bite, exhaustive=False)
    again = await _failure(bite, exhaustive=False)
    assert str(first) == str(again)


async def test_shrinking_removes_every_step_whose_removal_still_breaks_the_invariant() -> None:
    chosen = memory_set(**BITES[0].stores)
    explorer = Explorer(
        chosen.factories,
        WORLDS["lease"],
        name="padded",
        reset=chosen.reset,
        business_rows=None,
        seed=SEED,
        time_limit=60,
    )
    explorer.start_clock()
    try:
        sim = explorer.sim(2, 2)  # instance-2's clock runs a lease ahead
        padded = [
            (0, ACQUIRE, 0),
            (TIME, WAIT_HALF, 0),
            (0, RENEW, 0),
            (0, LEASE_STATE_OF, 0),
            (1, ACQUIRE, 0),  # taken over by instance-2's own clock: two live holders
        ]
        await explorer.fresh(sim)
        with pytest.raises(Exception) as caught:
            for action in padded:
                await sim.run(action, True, None)
        invariant = getattr(caught.value, "invariant", None)
        assert invariant == "one-live-holder", caught.value
        minimal = await explorer.shrink(sim, padded, invariant)
        assert minimal == [(0, ACQUIRE, 0), (1, ACQUIRE, 0)]
        # And no single step of it can go.
        for index in range(len(minimal)):
            rest = minimal[:index] + minimal[index + 1 :]
            assert await explorer._attempt(sim, rest, invariant) is None
    finally:
        await explorer.close()


def test_every_naive_store_of_the_spec_has_its_bite() -> None:
    labels = {bite.label for bite in BITES}
    assert len(labels) == 20
    assert {bite.world for bite in BITES} == {
        "lease",
        "fenced_effect",
        "outbound_call_business_key",
        "outbound_call_takeover",
        "child_queue",
        "lease_closing",
        "child_tree",
        "pause",
        "cost_ledger",
    }
    assert READ  # the protocol's first step is part of the call worlds' schedules


async def test_the_takeover_worlds_naive_store_is_caught_by_that_world_alone() -> None:
    """Ends that trust a finished lease pass every other world: no other world finishes a
    lease while an outbound call is under way (the lease and fenced-effect worlds finish
    but never end an attempt; the other call worlds never finish). Each other world runs
    its races, an exhaustive search to depth 5 and the 200 seeded walks."""
    takeover = WORLDS["outbound_call_takeover"]
    assert FINISH in takeover.lease_ops and takeover.call
    for world in WORLDS.values():
        if world is not takeover:
            assert not (world.call and FINISH in world.lease_ops), world.ident
    chosen = memory_set(calls=naive(EndsTrustAFinishedLease))
    for ident in WORLDS:
        if ident == "outbound_call_takeover":
            continue
        report = await explore(
            chosen.factories,
            world=ident,
            depth=5,
            walks=200,
            seed=SEED,
            reset=chosen.reset,
            business_rows=chosen.business_rows,
            name="ends that trust a finished lease",
        )
        assert report.states > 10 and report.walk_steps == 200 * 30, report.summary()
    caught = await _failure(
        next(b for b in BITES if b.world == "outbound_call_takeover"), exhaustive=True
    )
    text = str(caught)
    assert "every schedule of this world starts from its set-up:" in text
    assert "instance-1 claim attempt 1 after pending attempt 0 of tree-1 at 1" in text


ONLY_THEIR_WORLD = {
    "lease_closing": ("calls", "execution_lease"),
    "child_tree": ("queue", "child_queue"),
    "pause": ("pauses", "paused_execution"),
    "cost_ledger": ("costs", "cost_ledger"),
}
"""The worlds of the other stores, with the store their bite breaks (as `memory_set` and
as a world's `needs` name it)."""


@pytest.mark.parametrize("ident", list(ONLY_THEIR_WORLD))
async def test_the_other_stores_bites_are_caught_by_their_world_alone(ident: str) -> None:
    """Each naive store of the worlds of the other stores passes every other world that
    drives its store: a `lease_state_of` that reads the flags first passes the lease world
    (it asks only the latest token) and the call worlds; a queue that wakes a waiting
    parent early passes the child-queue world (whose parent is the root, never waiting);
    no other world drives the pauses or the ledger. Each other world runs its races, an
    exhaustive search to depth 5 and the 200 seeded walks."""
    bite = next(b for b in BITES if b.world == ident)
    key, store = ONLY_THEIR_WORLD[ident]
    chosen = memory_set(**bite.stores)
    others = [
        world.ident
        for world in WORLDS.values()
        if world.ident != ident
        and (store in world.needs or (key == "calls" and "outbound_call" in world.needs))
    ]
    if key in ("pauses", "costs"):
        assert others == []
    else:
        assert others, ident
    for other in others:
        report = await explore(
            chosen.factories,
            world=other,
            depth=5,
            walks=200,
            seed=SEED,
            reset=chosen.reset,
            business_rows=chosen.business_rows,
            name=bite.label,
        )
        assert report.states > 10 and report.walk_steps == 200 * 30, report.summary()
    caught = await _failure(bite, exhaustive=True)
    assert caught.invariant == bite.invariant
