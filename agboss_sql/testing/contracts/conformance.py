"""`store_conformance`: one pytest class that proves a store set against every contract it
claims, with the cases the project's own stores run, plus the store-set cases.

    TestPostgres = store_conformance(
        name="PostgreSQL",
        reset=reset,
        stores={"execution_lease": lambda seam: SqlExecutionLeaseRepository(conn, seam.store_clock, seam.application), ...},
        business_rows=BusinessRows(insert=insert_business_row, committed=committed),
    )

The set is checked before any case runs (`StoreConformanceError`). Each case then runs as
its own test method, `test_<contract>__<case>`, on a fresh `CaseContext`: the set's reset
(or each store's own) first, two instances on one backing store on the case's
`VirtualClock`, each built store closed after. The methods are marked
`pytest.mark.asyncio(loop_scope=...)` so stores that hold connections stay on one loop.

pytest (with pytest-asyncio) is imported only when a class is built or a case runs, so the
suites themselves import without it.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.contracts.types import LeaseCheck
from agboss_sql.testing import _errors as codes
from agboss_sql.testing import explorer
from agboss_sql.testing._case import (
    BusinessRows,
    Case,
    CaseContext,
    Seam,
    StoreFactory,
    as_factory,
)
from agboss_sql.testing._errors import StoreConformanceError
from agboss_sql.testing.contracts._registry import (
    FENCED_EFFECT,
    FENCING_STORES,
    LEASE,
    LEASE_LOG,
    MAY_BE_LEFT_OUT,
    OUTBOUND_CALL,
    SUITES,
    WHAT_IT_PROVES,
    closest_contract,
    suite_cases,
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


# --- building the class -------------------------------------------------------------------


def _snake(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()


def _class_name(name: str) -> str:
    parts = [p for p in re.split(r"[^0-9a-zA-Z]+", name) if p]
    body = "".join(p[0].upper() + p[1:] for p in parts) or "Stores"
    if body[0].isdigit():
        body = "_" + body
    return f"Test{body}"


def _opted_out(store: Any) -> bool:
    check = getattr(type(store), "lease_check", LeaseCheck.ATOMIC)
    return check is LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION


def _opted_out_error(store: Any, contract: str) -> StoreConformanceError:
    cls = type(store).__name__
    return StoreConformanceError.of(
        codes.OPTED_OUT_STORE,
        f"{cls} ({contract}) declares LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION: it reads "
        "the lease outside its write's transaction, so a holder whose lease was just taken "
        "over can still write, and its fencing cases cannot pass. Make its lease check "
        "atomic, or pass accept_without_double_charge_protection=True to skip them (and "
        "never back payments with it)",
    )


@dataclass(frozen=True)
class CaseInfo:
    """What a generated test method runs: its contract and case name, or a store-set case."""

    contract: str
    name: str
    fencing: bool = False


def add_test(
    cls: type,
    method_name: str,
    body: Callable[[], Awaitable[None]],
    *,
    doc: str,
    info: CaseInfo | None = None,
) -> None:
    """Add `method_name` to a generated class: an async test running `body()` on the
    set's event loop scope (for tools that extend a conformance class)."""
    import pytest

    if not method_name.startswith("test_"):
        raise ValueError(f"a test method's name starts with test_: {method_name!r}")
    if hasattr(cls, method_name):
        raise ValueError(f"{cls.__name__} already has {method_name}")
    store_set: StoreSet = cls.store_set  # type: ignore[attr-defined]

    async def test(self: Any) -> None:
        await body()

    test.__name__ = method_name
    test.__qualname__ = f"{cls.__name__}.{method_name}"
    test.__doc__ = doc
    test.__module__ = cls.__module__
    marked = pytest.mark.asyncio(loop_scope=store_set.loop_scope)(test)
    setattr(cls, method_name, marked)
    cls.cases[method_name] = info or CaseInfo("", method_name)  # type: ignore[attr-defined]


def _case_body(store_set: StoreSet, contract: str, case: Case) -> Callable[[], Awaitable[None]]:
    opt_out_matters = case.fencing and contract in FENCING_STORES

    async def body() -> None:
        import pytest

        if opt_out_matters:
            probe = store_set.context()
            try:
                store = probe.store(contract, 0)
                if _opted_out(store):
                    if store_set.accept_without_double_charge_protection:
                        pytest.skip(OPTED_OUT_NOTE)
                    raise _opted_out_error(store, contract)
            finally:
                await probe.close()
        await store_set.run(case.run)

    return body


def _unavailable_body(
    contract: str, module: str, error: BaseException
) -> Callable[[], Awaitable[None]]:
    async def body() -> None:
        raise StoreConformanceError.of(
            codes.SUITE_UNAVAILABLE,
            f"the {contract!r} suite ({module}) could not be loaded: {error!r}",
        ) from error

    return body


def _backend_body(store_set: StoreSet, contract: str) -> Callable[[], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        import pytest

        stores = [ctx.store(contract, 0), ctx.store(contract, 1)]
        if _opted_out(stores[0]):
            if store_set.accept_without_double_charge_protection:
                pytest.skip(f"{OPTED_OUT_NOTE}; its backend is not compared with the leases'")
            raise _opted_out_error(stores[0], contract)
        leases = [ctx.store(LEASE, 0), ctx.store(LEASE, 1)]
        lease_cls = type(leases[0]).__name__
        backend = getattr(leases[0], "backend", None)
        if not isinstance(backend, str) or not backend:
            raise AssertionError(
                f"[store-backend] the lease store {lease_cls} declares no backend "
                f'({backend!r}): declare `backend = "<kind>"` or `"<kind>:<database>"` so '
                f"the {contract} store can be compared with it"
            )
        for index, lease in enumerate(leases[1:], start=2):
            other = getattr(lease, "backend", None)
            if other != backend:
                raise AssertionError(
                    f"[store-backend] instance-{index}'s lease store is on {other!r}, "
                    f"instance-1's on {backend!r}: two instances must share one backing store"
                )
        for index, store in enumerate(stores, start=1):
            cls = type(store).__name__
            found = getattr(store, "backend", None)
            if not isinstance(found, str) or not found:
                raise AssertionError(
                    f"[store-backend] {cls} ({contract}, instance-{index}) declares no backend "
                    f"({found!r}): declare the backend its rows live on, {backend!r} to sit "
                    f"beside the lease store {lease_cls}"
                )
            if found != backend:
                raise AssertionError(
                    f"[store-backend] {cls} ({contract}, instance-{index}) is on {found!r} but "
                    f"its lease store {lease_cls} is on {backend!r}: its lease check cannot be "
                    f"atomic across two backends. Give a lease store on {found!r}, or a "
                    f"{contract} store on {backend!r}"
                )

    async def body() -> None:
        await store_set.run(run)

    return body


def _no_protection_body(
    store_set: StoreSet, contracts: Iterable[str]
) -> Callable[[], Awaitable[None]]:
    contracts = tuple(contracts)

    async def run(ctx: CaseContext) -> None:
        opted = [
            f"{type(ctx.store(c, 0)).__name__} ({c})"
            for c in contracts
            if _opted_out(ctx.store(c, 0))
        ]
        if not opted:
            raise StoreConformanceError.of(
                codes.OPT_OUT_NOT_DECLARED,
                "accept_without_double_charge_protection=True, but no fencing store of the set "
                "declares LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION: drop the flag, so the "
                "report never reads as opted out",
            )
        # Passing: the report carries the missing protection as a case of its own.
        return None

    async def body() -> None:
        ctx = store_set.context()
        try:
            await run(ctx)
        finally:
            await ctx.close()

    return body


def _caller_module(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return str(frame.f_globals.get("__name__", __name__))


def _build(
    store_set: StoreSet,
    run: Iterable[str],
    *,
    module: str,
    register_explorer: bool,
) -> type:
    run = [c for c in SUITES if c in set(run)]
    class_name = _class_name(store_set.name)
    doc = f"Conformance of the store set {store_set.name!r}: {', '.join(run) or 'no contract'}" + (
        f" (left out: {', '.join(store_set.without)})" if store_set.without else ""
    )
    cls: type = type(
        class_name,
        (),
        {
            "__doc__": doc,
            "__module__": module,
            "__test__": True,
            "store_set": store_set,
            "interleavings": store_set.interleavings,
            "cases": {},
        },
    )
    for contract in run:
        try:
            found = suite_cases(contract)
        except Exception as exc:
            add_test(
                cls,
                f"test_{contract}__suite",
                _unavailable_body(contract, SUITES[contract], exc),
                doc=f"{contract} ({store_set.name}): the suite could not be loaded",
                info=CaseInfo(contract, "suite"),
            )
            continue
        for case in found:
            base = f"test_{contract}__{_snake(case.name)}"
            method_name, count = base, 1
            while hasattr(cls, method_name):
                count += 1
                method_name = f"{base}_{count}"
            add_test(
                cls,
                method_name,
                _case_body(store_set, contract, case),
                doc=f"{contract} ({store_set.name}): {case.name}",
                info=CaseInfo(contract, case.name, case.fencing),
            )
    fencing = [c for c in FENCING_STORES if c in run and store_set.claims(c)]
    if store_set.claims(LEASE):
        for contract in fencing:
            add_test(
                cls,
                f"test_store_set__{contract}_store_shares_the_lease_store_backend",
                _backend_body(store_set, contract),
                doc=f"store set ({store_set.name}): the {contract} store is on the lease store's backend",
                info=CaseInfo("store_set", f"{contract} store shares the lease store's backend"),
            )
    if store_set.accept_without_double_charge_protection:
        add_test(
            cls,
            f"test_store_set__{_snake(NO_PROTECTION_CASE)}",
            _no_protection_body(store_set, fencing),
            doc=f"store set ({store_set.name}): {NO_PROTECTION_CASE}",
            info=CaseInfo("store_set", NO_PROTECTION_CASE),
        )
    if register_explorer and store_set.interleavings is not False and store_set.claims(LEASE):
        _register_explorer(cls, store_set)
    return cls


def _register_explorer(cls: type, store_set: StoreSet) -> None:
    """Hand the class to the interleaving explorer: it adds its `test_interleavings__*`
    cases for the set's factories and options. An explorer that cannot register (its
    options refused, say) becomes one failing case, never a silent gap."""
    try:
        explorer.register(
            cls,
            name=store_set.name,
            factories=store_set.factories,
            reset=store_set.reset,
            business_rows=store_set.business_rows,
            interleavings=store_set.interleavings,
            accept_without_double_charge_protection=(
                store_set.accept_without_double_charge_protection
            ),
        )
    except Exception as error:
        add_test(
            cls,
            "test_interleavings__explorer",
            _unavailable_body("interleavings", EXPLORER_MODULE, error),
            doc=f"interleavings ({store_set.name}): the explorer could not register its cases",
            info=CaseInfo("interleavings", "explorer"),
        )


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


def store_conformance(
    *,
    name: str,
    stores: Mapping[str, Factory],
    reset: Reset | None = None,
    business_rows: BusinessRows | None = None,
    without: Iterable[str] = (),
    accept_without_double_charge_protection: bool = False,
    interleavings: Mapping[str, Any] | bool | None = None,
    loop_scope: str = "session",
    case_timeout_s: float = 300.0,
) -> type:
    """A pytest class (`Test<Name>`) proving the store set against every contract it
    claims, with one test per case (`test_<contract>__<case>`) and the store-set cases.

    `stores` maps contract keys (`execution_lease`, `fenced_effect`, ...) to a factory
    `(seam) -> store` or a `StoreFactory`; `reset` empties the backing store before each
    case of a store without its own reset; `business_rows` says how a fenced effect's work
    writes and reads its business rows (required with `fenced_effect`); `without` leaves
    fencing contracts out deliberately; `accept_without_double_charge_protection` skips the
    fencing cases of a store that opts out of the lease check; `interleavings` (a dict of
    explorer options, or False) is kept as the class's `interleavings` for the explorer.

    A malformed set raises `StoreConformanceError` here, before any case runs.
    """
    store_set = _store_set(
        name=name,
        stores=stores,
        reset=reset,
        business_rows=business_rows,
        without=without,
        accept_without_double_charge_protection=accept_without_double_charge_protection,
        interleavings=interleavings,
        loop_scope=loop_scope,
        case_timeout_s=case_timeout_s,
    )
    return _build(store_set, store_set.factories, module=_caller_module(1), register_explorer=True)


def _one_contract(
    contract: str,
    *,
    name: str,
    stores: Mapping[str, Factory],
    reset: Reset | None,
    business_rows: BusinessRows | None = None,
    accept_without_double_charge_protection: bool = False,
    loop_scope: str,
    case_timeout_s: float,
) -> type:
    without = [c for c in MAY_BE_LEFT_OUT if c not in stores] if LEASE in stores else []
    store_set = _store_set(
        name=name,
        stores=stores,
        reset=reset,
        business_rows=business_rows,
        without=without,
        accept_without_double_charge_protection=accept_without_double_charge_protection,
        interleavings=False,
        loop_scope=loop_scope,
        case_timeout_s=case_timeout_s,
    )
    return _build(store_set, [contract], module=_caller_module(2), register_explorer=False)


def execution_lease_contract(
    factory: Factory,
    *,
    name: str,
    reset: Reset | None = None,
    loop_scope: str = "session",
    case_timeout_s: float = 300.0,
) -> type:
    """The lease store's cases alone, as a pytest class (`Test<Name>`)."""
    return _one_contract(
        LEASE,
        name=name,
        stores={LEASE: factory},
        reset=reset,
        loop_scope=loop_scope,
        case_timeout_s=case_timeout_s,
    )


def execution_lease_event_contract(
    factory: Factory,
    *,
    name: str,
    reset: Reset | None = None,
    loop_scope: str = "session",
    case_timeout_s: float = 300.0,
) -> type:
    """The lease log's cases alone, as a pytest class (`Test<Name>`)."""
    return _one_contract(
        LEASE_LOG,
        name=name,
        stores={LEASE_LOG: factory},
        reset=reset,
        loop_scope=loop_scope,
        case_timeout_s=case_timeout_s,
    )


def fenced_effect_contract(
    factory: Factory,
    *,
    execution_lease: Factory,
    business_rows: BusinessRows,
    name: str,
    reset: Reset | None = None,
    accept_without_double_charge_protection: bool = False,
    loop_scope: str = "session",
    case_timeout_s: float = 300.0,
) -> type:
    """The fenced effect's cases alone, on the lease store `execution_lease` of its
    backend, with the store-set case comparing their backends, as a pytest class. With
    `accept_without_double_charge_protection`, an opted-out store's fencing cases are
    skipped and "gives NO double-charge protection" passes (and fails for a store that
    does not opt out)."""
    return _one_contract(
        FENCED_EFFECT,
        name=name,
        stores={LEASE: execution_lease, FENCED_EFFECT: factory},
        reset=reset,
        business_rows=business_rows,
        accept_without_double_charge_protection=accept_without_double_charge_protection,
        loop_scope=loop_scope,
        case_timeout_s=case_timeout_s,
    )


def outbound_call_contract(
    factory: Factory,
    *,
    execution_lease: Factory,
    name: str,
    reset: Reset | None = None,
    accept_without_double_charge_protection: bool = False,
    loop_scope: str = "session",
    case_timeout_s: float = 300.0,
) -> type:
    """The outbound call's cases alone, on the lease store `execution_lease` of its
    backend, with the store-set case comparing their backends, as a pytest class."""
    return _one_contract(
        OUTBOUND_CALL,
        name=name,
        stores={LEASE: execution_lease, OUTBOUND_CALL: factory},
        reset=reset,
        accept_without_double_charge_protection=accept_without_double_charge_protection,
        loop_scope=loop_scope,
        case_timeout_s=case_timeout_s,
    )


def generated_cases(cls: type) -> dict[str, CaseInfo]:
    """The generated test methods of a conformance class and what each runs."""
    found: dict[str, CaseInfo] = dict(cls.cases)  # type: ignore[attr-defined]
    return found


__all__ = [
    "NO_PROTECTION_CASE",
    "OPTED_OUT_NOTE",
    "CaseInfo",
    "StoreSet",
    "add_test",
    "execution_lease_contract",
    "execution_lease_event_contract",
    "fenced_effect_contract",
    "generated_cases",
    "outbound_call_contract",
    "store_conformance",
]
