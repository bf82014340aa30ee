"""The interleaving explorer: a deterministic scheduler over a store set's fencing stores.

Simulated instances take, renew, yield, reclaim, release and finish a tree's
lease, ask `lease_state_of`, write the step's fenced effect and move an
outbound call through its protocol (read the intent, record it, reconcile,
claim the next attempt, send, end it), with time advancing as a scheduled step
of its own. Instances also act out of turn, as a zombie, a buggy runtime or a
replayed message would: each keeps every lease it was ever granted (older
epochs, the same instance at an older epoch after taking over from itself,
yielded and released leases) and may renew, yield, reclaim, release or finish
with any of them, write the fenced effect, or record, claim and end the call;
the model decides what must be refused. Each operation is sent only once the store answered the one
before, so the order the explorer chose is the order the store sees, for any
store. Ten worlds: the lease; the step's fenced effect; an outbound call
handed over on one tree; an outbound call under one business key from two
trees; takeovers mixed with reconciliation (every schedule starts with a claimed
attempt pending under an expired lease of tree-1 while tree-2 holds the same
business key: tree-1 is taken over while tree-2 reconciles, both claim, the
stopped claimer marks with its old context, a holder may finish its tree); a
parent's two children in the child queue (claim, list the running
ones, restart and finish with any attempt an instance saw: a finish or restart
at a stale attempt must be refused, and exactly one finish of the last child
answers none left); `lease_state_of` asked at every token between the holder's moves (an
epoch it answered over never moves again: `closed-epoch-never-moves`); a tree two levels
deep in the child queue (a child waiting for its own children while its sibling finishes,
rescues, restarts and the parents' wakes: `parent-woken-once`); a pause in each of two
tenants resolved, taken and cancelled by any instance (`pause-answered-once`); the cost
ledger's reservations and entries in two tenants (`spend-within-budget`). Each runs both orders of its two-outcome races, every schedule of two
instances to `depth` (each state explored once, at the fewest steps that reach
it) and seeded walks of three instances, with the other instances' clocks
skewed by +-lease/2, +-lease and +-10 x lease while the store decides by the
run's time (a search under one skew stands for all six when no store ever read
its instance's own clock: the others would be the same search). After every step it checks `one-live-holder`, `no-stale-write`,
`one-effect-per-key`, `one-send-per-business-key`,
`no-takeover-of-finished-work` and `store-error` (and each world's own: `closed-epoch-never-moves`,
`parent-woken-once`, `pause-answered-once`, `spend-within-budget`), and prints a failure as its
minimal schedule, each step with what the store answered.

    report = await explore(factories, world="lease", reset=reset)

`store_conformance` registers it on its test class with `register`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agboss_sql.testing._case import BusinessRows
from agboss_sql.testing._errors import INVALID_OPTION, StoreConformanceError
from agboss_sql.testing.explorer._races import RACE_OUTCOME, RACES
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
from agboss_sql.testing.explorer._search import explore
from agboss_sql.testing.explorer._world import INVARIANTS, LEASE_MS, SKEWS, WORLDS

OPTIONS = ("depth", "walks", "walk_depth", "seed", "time_limit")
"""The keys of `interleavings={...}`."""


def options_of(interleavings: Mapping[str, Any] | bool | None) -> dict[str, Any] | None:
    """The explorer's options with their defaults, or `None` when `interleavings` is False.
    An unknown key is `[store-conformance.invalid-option]`."""
    if interleavings is False:
        return None
    given: Mapping[str, Any] = {} if interleavings in (None, True) else interleavings  # type: ignore[assignment]
    if not isinstance(given, Mapping):
        raise StoreConformanceError.of(
            INVALID_OPTION,
            f"interleavings is a dict of {', '.join(OPTIONS)}, or False; got {interleavings!r}",
        )
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise StoreConformanceError.of(
            INVALID_OPTION,
            f"interleavings has no option {', '.join(map(repr, unknown))}: its options are "
            f"{', '.join(OPTIONS)}",
        )
    return {
        "depth": given.get("depth", DEFAULT_DEPTH),
        "walks": given.get("walks", DEFAULT_WALKS),
        "walk_depth": given.get("walk_depth", DEFAULT_WALK_DEPTH),
        "seed": resolve_seed(given.get("seed")),
        "time_limit": given.get("time_limit", DEFAULT_TIME_LIMIT_S),
    }


def register(
    cls: type[Any],
    *,
    name: str,
    factories: Mapping[str, StoreFactoryLike],
    reset: Reset | None = None,
    business_rows: BusinessRows | None = None,
    interleavings: Mapping[str, Any] | bool | None = None,
    accept_without_double_charge_protection: bool = False,
) -> list[str]:
    """Add the explorer's cases to the pytest class `cls`, for each world the set can run
    (a lease store; the fenced-effect world also needs the fenced-effect store, the
    outbound-call worlds the outbound-call store, the child-queue world the child-queue
    store and a reset, since a claim takes any tenant's queued child, and so does the
    child-tree world; the lease-closing world the outbound-call store, for its
    `lease_state_of`; the pause and cost-ledger worlds their store alone):
    `test_interleavings__<world>__exhaustive`
    (its races and its exhaustive search) and `test_interleavings__<world>__walks_seed_<seed>`
    (its walks), each async on the event loop scope of the class's store set (a
    `store_conformance` class), else the session's. `interleavings` is
    `{depth, walks, walk_depth, seed, time_limit}` (defaults 8, 200, 30, then
    `AGBOSS_EXPLORER_SEED` or 533, 480 s) or False (nothing is added); the child-tree world
    searches 3 levels less than `depth` (at least 1): its states grow about ten times as
    fast per level. A world whose fencing
    store opted out of the lease check fails with `[store-conformance.opted-out-store]`, or
    is skipped when the opt-out is accepted. The names added."""
    options = options_of(interleavings)
    if options is None:
        return []
    has_reset = reset is not None or any(
        getattr(factory, "reset", None) is not None for factory in factories.values()
    )
    import pytest

    added: list[str] = []
    seed = options["seed"]
    # A conformance class runs its cases on its set's event loop scope; others on the session's.
    loop_scope = getattr(getattr(cls, "store_set", None), "loop_scope", "session")
    for world in WORLDS.values():
        if any(key not in factories for key in world.needs):
            continue
        if world.queue and not has_reset:
            continue  # its schedules cannot share a queue
        cases = []
        if options["depth"]:
            cases.append((f"test_interleavings__{world.ident}__exhaustive", False))
        if options["walks"]:
            cases.append((f"test_interleavings__{world.ident}__walks_seed_{seed}", True))
        for method_name, walks_only in cases:
            test = _case(
                world.ident,
                walks_only,
                name=name,
                factories=factories,
                reset=reset,
                business_rows=business_rows,
                options=options,
                accept=accept_without_double_charge_protection,
            )
            test.__name__ = method_name
            test.__qualname__ = f"{cls.__qualname__}.{method_name}"
            test.__module__ = cls.__module__
            setattr(cls, method_name, pytest.mark.asyncio(loop_scope=loop_scope)(test))
            added.append(method_name)
    return added


def _case(
    world: str,
    walks_only: bool,
    *,
    name: str,
    factories: Mapping[str, StoreFactoryLike],
    reset: Reset | None,
    business_rows: BusinessRows | None,
    options: dict[str, Any],
    accept: bool,
) -> Any:
    title = WORLDS[world].title

    # A world whose states grow faster per level searches fewer levels (at least one).
    depth = max(1, options["depth"] - WORLDS[world].shallower) if options["depth"] else 0

    async def test(self: Any) -> None:
        import pytest

        report = await explore(
            factories,
            world=world,
            depth=0 if walks_only else depth,
            walks=options["walks"] if walks_only else 0,
            walk_depth=options["walk_depth"],
            seed=options["seed"],
            time_limit=options["time_limit"],
            reset=reset,
            business_rows=business_rows,
            name=name,
            accept_without_double_charge_protection=accept,
        )
        if report.skipped:
            pytest.skip(report.skipped)
        print(report.summary())

    kind = (
        f"{options['walks']} seeded walks of three instances (seed {options['seed']})"
        if walks_only
        else f"its races in both orders and every schedule of two instances to depth {depth}"
    )
    test.__doc__ = f"interleavings ({name}): the {title}, {kind}."
    return test


__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_SEED",
    "DEFAULT_TIME_LIMIT_S",
    "DEFAULT_WALKS",
    "DEFAULT_WALK_DEPTH",
    "INVARIANTS",
    "LEASE_MS",
    "OPTED_OUT_NOTE",
    "OPTIONS",
    "RACES",
    "RACE_OUTCOME",
    "SEED_ENV",
    "SKEWS",
    "WORLDS",
    "ExplorerReport",
    "InterleavingFailure",
    "InterleavingTimeLimitError",
    "explore",
    "options_of",
    "register",
]
