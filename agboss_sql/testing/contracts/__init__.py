"""The contract conformance suite: prove a store set with the cases the project's own
stores run.

    from agboss_sql.testing.contracts import BusinessRows, store_conformance

    TestMyStores = store_conformance(name="my stores", stores={...}, business_rows=...)

A suite per contract (`execution_lease`, `fenced_effect`, ...) exposes
`cases() -> list[Case]`; `store_conformance` runs every suite the set claims, plus the
store-set cases, as one pytest class. `execution_lease_contract`,
`fenced_effect_contract`, `outbound_call_contract` and `execution_lease_event_contract`
run one store on its own.
"""

from __future__ import annotations

from agboss_sql.testing._case import (
    START_MS,
    BusinessRows,
    Case,
    CaseContext,
    Seam,
    StoreFactory,
)
from agboss_sql.testing._errors import StoreConformanceError
from agboss_sql.testing.contracts._registry import SUITES
from agboss_sql.testing.contracts.conformance import (
    NO_PROTECTION_CASE,
    OPTED_OUT_NOTE,
    CaseInfo,
    StoreSet,
    add_test,
    execution_lease_contract,
    execution_lease_event_contract,
    fenced_effect_contract,
    generated_cases,
    outbound_call_contract,
    store_conformance,
)

__all__ = [
    "NO_PROTECTION_CASE",
    "OPTED_OUT_NOTE",
    "START_MS",
    "SUITES",
    "BusinessRows",
    "Case",
    "CaseContext",
    "CaseInfo",
    "Seam",
    "StoreConformanceError",
    "StoreFactory",
    "StoreSet",
    "add_test",
    "execution_lease_contract",
    "execution_lease_event_contract",
    "fenced_effect_contract",
    "generated_cases",
    "outbound_call_contract",
    "store_conformance",
]
