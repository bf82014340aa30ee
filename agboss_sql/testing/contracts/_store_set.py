"""The store set `store_conformance` runs on, and the checks a set passes before any case
runs (`StoreConformanceError` naming every problem at once)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.testing import _errors as codes
from agboss_sql.testing import explorer
from agboss_sql.testing._case import BusinessRows, CaseContext, Seam, StoreFactory, as_factory
from agboss_sql.testing._errors import StoreConformanceError
from agboss_sql.testing.contracts._registry import (
    FENCED_EFFECT,
    FENCING_STORES,
    LEASE,
    MAY_BE_LEFT_OUT,
    SUITES,
    WHAT_IT_PROVES,
    closest_contract,
)

OPTED_OUT_NOTE = "store opted out of the lease check: no double-charge protection"
"""The note every skipped fencing case of an opted-out store carries."""

NO_PROTECTION_CASE = "gives NO double-charge protection"
"""The passing case an accepted opt-out adds to every report."""

LOOP_SCOPES = ("function", "class", "module", "package", "session")
INTERLEAVING_OPTIONS = ("depth", "walks", "walk_depth", "seed", "time_limit")
EXPLORER_MODULE = explorer.__name__

Factory = Callable[[Seam], Any] | StoreFactory
Reset = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class StoreSet:
    """A validated store set: what every generated case (and the explorer) runs on."""

    name: str
    factories: Mapping[str, StoreFactory]
    reset: Reset | None = None
    business_rows: BusinessRows | None = None
    without: tuple[str, ...] = ()
    accept_without_double_charge_protection: bool = False
    interleavings: Mapping[str, Any] | bool = False
    loop_scope: str = "session"
    case_timeout_s: float = 300.0
    _resets: tuple[Reset, ...] = field(default=(), repr=False)

    def claims(self, contract: str) -> bool:
        """Whether the set gives a store for `contract`."""
        return contract in self.factories

    def context(self) -> CaseContext:
        """A fresh case context on the set's factories (a new `VirtualClock`)."""
        return CaseContext(factories=self.factories, business_rows=self.business_rows)

    async def reset_stores(self) -> None:
        """Empty the backing stores: each store's own reset, and the set's reset for the
        stores without one (each distinct reset once)."""
        for reset in self._resets:
            await reset()

    async def run(self, body: Callable[[CaseContext], Awaitable[None]]) -> None:
        """Run `body` as one case: reset, a fresh context, the case's time limit, and every
        built store closed after, whatever happened."""
        ctx = self.context()
        try:
            await self.reset_stores()
            async with asyncio.timeout(self.case_timeout_s):
                await body(ctx)
        finally:
            await ctx.close()


def _resets_of(factories: Mapping[str, StoreFactory], reset: Reset | None) -> tuple[Reset, ...]:
    found: list[Reset] = []
    for factory in factories.values():
        chosen = factory.reset if factory.reset is not None else reset
        if chosen is not None and all(chosen is not r for r in found):
            found.append(chosen)
    return tuple(found)


# --- validation ---------------------------------------------------------------------------


def _validate(
    stores: Mapping[str, Any],
    without: Iterable[str],
    business_rows: BusinessRows | None,
    interleavings: Any,
    loop_scope: str,
    reset: Any,
) -> None:
    problems: list[tuple[str, str]] = []
    without = list(without)
    if not stores:
        problems.append((codes.EMPTY, "the store set has no store: give at least one in stores="))
    for key in stores:
        if key not in SUITES:
            guess = closest_contract(key)
            hint = f" (did you mean {guess!r}?)" if guess else ""
            problems.append(
                (
                    codes.UNKNOWN_STORE,
                    f"stores={{{key!r}: ...}} names no contract{hint}: its store would never be "
                    f"tested. The contract keys are {', '.join(SUITES)}",
                )
            )
        elif not (isinstance(stores[key], StoreFactory) or callable(stores[key])):
            problems.append(
                (
                    codes.INVALID_FACTORY,
                    f"stores[{key!r}] is a {type(stores[key]).__name__}: give a factory "
                    "(seam) -> store or StoreFactory(instance, reset=None, close=None)",
                )
            )
    for key in without:
        if key not in MAY_BE_LEFT_OUT:
            guess = closest_contract(key) if key not in SUITES else None
            hint = f" (did you mean {guess!r}?)" if guess and guess in MAY_BE_LEFT_OUT else ""
            problems.append(
                (
                    codes.INVALID_WITHOUT,
                    f"without=[{key!r}]{hint}: only {', '.join(MAY_BE_LEFT_OUT)} may be left "
                    "out; any other contract is simply not listed in stores=",
                )
            )
        elif key in stores:
            problems.append(
                (
                    codes.WITHOUT_IMPLEMENTED,
                    f"{key!r} is both given in stores= and left out in without=: drop it from "
                    "one of them",
                )
            )
    has_lease = LEASE in stores
    for key in FENCING_STORES:
        if key in stores and not has_lease:
            problems.append(
                (
                    codes.LEASE_STORE_REQUIRED,
                    f"the {key!r} store is fenced by execution leases, but the set gives no "
                    "'execution_lease' store: add the lease store on its backend (its races "
                    "and its backend are proven against it)",
                )
            )
    if has_lease:
        for key in MAY_BE_LEFT_OUT:
            if key not in stores and key not in without:
                problems.append(
                    (
                        codes.MISSING_FENCING_CONTRACT,
                        f"the set has a lease store but no {key!r} store: {WHAT_IT_PROVES[key]}. "
                        f"Give one in stores=, or list {key!r} in without= to leave it out "
                        "deliberately",
                    )
                )
    if FENCED_EFFECT in stores and business_rows is None:
        problems.append(
            (
                codes.BUSINESS_ROWS_REQUIRED,
                "the set claims 'fenced_effect' but gives no business_rows=: give "
                "BusinessRows(insert=..., committed=...) saying how a work writes a business "
                "row in the effect's transaction and how the committed rows are read back",
            )
        )
    if reset is not None and not callable(reset):
        problems.append(
            (codes.INVALID_OPTION, f"reset= is a {type(reset).__name__}, not an async callable")
        )
    if loop_scope not in LOOP_SCOPES:
        problems.append(
            (
                codes.INVALID_OPTION,
                f"loop_scope={loop_scope!r}: use one of {', '.join(LOOP_SCOPES)}",
            )
        )
    if interleavings is not None and not isinstance(interleavings, bool):
        if not isinstance(interleavings, Mapping):
            problems.append(
                (
                    codes.INVALID_OPTION,
                    f"interleavings= is a {type(interleavings).__name__}: give a dict such as "
                    '{"depth": 5, "walks": 100}, or False to leave the explorer out',
                )
            )
        else:
            unknown = [k for k in interleavings if k not in INTERLEAVING_OPTIONS]
            if unknown:
                problems.append(
                    (
                        codes.INVALID_OPTION,
                        f"interleavings= has unknown option(s) {', '.join(map(repr, unknown))}: "
                        f"the options are {', '.join(INTERLEAVING_OPTIONS)}",
                    )
                )
    if problems:
        raise StoreConformanceError(problems)


def _store_set(
    *,
    name: str,
    stores: Mapping[str, Factory],
    reset: Reset | None,
    business_rows: BusinessRows | None,
    without: Iterable[str],
    accept_without_double_charge_protection: bool,
    interleavings: Mapping[str, Any] | bool | None,
    loop_scope: str,
    case_timeout_s: float,
) -> StoreSet:
    without = tuple(without)
    _validate(stores, without, business_rows, interleavings, loop_scope, reset)
    factories = {key: as_factory(stores[key]) for key in SUITES if key in stores}
    if interleavings is None or interleavings is True:
        chosen: Mapping[str, Any] | bool = {}
    else:
        chosen = dict(interleavings) if isinstance(interleavings, Mapping) else False
    return StoreSet(
        name=name,
        factories=factories,
        reset=reset,
        business_rows=business_rows,
        without=without,
        accept_without_double_charge_protection=accept_without_double_charge_protection,
        interleavings=chosen,
        loop_scope=loop_scope,
        case_timeout_s=case_timeout_s,
        _resets=_resets_of(factories, reset),
    )
