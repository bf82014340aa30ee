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
suites themselves import without it. The set's checks are in `_store_set`, the class's
methods and their bodies in `_test_class`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

from agboss_sql.testing._case import BusinessRows
from agboss_sql.testing.contracts._registry import (
    FENCED_EFFECT,
    LEASE,
    LEASE_LOG,
    MAY_BE_LEFT_OUT,
    OUTBOUND_CALL,
)
from agboss_sql.testing.contracts._store_set import (
    NO_PROTECTION_CASE,
    OPTED_OUT_NOTE,
    Factory,
    Reset,
    StoreSet,
    _store_set,
)
from agboss_sql.testing.contracts._test_class import CaseInfo, _build, add_test


def _caller_module(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return str(frame.f_globals.get("__name__", __name__))


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
