"""How a store set becomes one pytest class: a test method per case, the bodies that run
a case, a suite that cannot load or an opted-out store's note, and the explorer's cases."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.types import LeaseCheck
from agboss_sql.testing import _errors as codes
from agboss_sql.testing import explorer
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing._errors import StoreConformanceError
from agboss_sql.testing.contracts._registry import FENCING_STORES, LEASE, SUITES, suite_cases
from agboss_sql.testing.contracts._store_set import (
    EXPLORER_MODULE,
    NO_PROTECTION_CASE,
    OPTED_OUT_NOTE,
    StoreSet,
)

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
