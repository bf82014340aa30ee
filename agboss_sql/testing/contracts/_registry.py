"""Which suite proves which contract: contract key -> suite module, imported only when claimed."""

from __future__ import annotations

import difflib
import importlib
import re
from types import ModuleType

from agboss_sql.contracts.stores import CONTRACTS
from agboss_sql.testing._case import Case

_PACKAGE = "agboss_sql.testing.contracts"

SUITES: dict[str, str] = {key: f"{_PACKAGE}.{key}" for key in CONTRACTS}
"""Every contract key of `store_conformance(stores=...)` and the module of its suite (each
module exposes `cases() -> list[Case]`)."""

LEASE = "execution_lease"
LEASE_LOG = "execution_lease_event"
FENCED_EFFECT = "fenced_effect"
OUTBOUND_CALL = "outbound_call"

FENCING_STORES = (FENCED_EFFECT, OUTBOUND_CALL)
"""The stores whose writes are fenced by the set's leases: they need the lease store, on
its backend."""

MAY_BE_LEFT_OUT = (FENCED_EFFECT, OUTBOUND_CALL, LEASE_LOG)
"""What a set with a lease store may list in `without=` instead of claiming."""

WHAT_IT_PROVES: dict[str, str] = {
    FENCED_EFFECT: (
        "its cases prove one effect per key: a zombie's write is refused after a takeover, "
        "a replay returns the stored result, and the business rows commit with the result "
        "or not at all"
    ),
    OUTBOUND_CALL: (
        "its cases prove one send per key: an intent is recorded and claimed under the same "
        "lease check, attempts move by compare-and-set, and lease_state_of closes an expired "
        "lease in the step that reads it"
    ),
    LEASE_LOG: (
        "its cases prove the lease log reads back every event exactly as saved, in save "
        "order, so an operator can tell a zombie from a takeover"
    ),
}


def suite_module(contract: str) -> ModuleType:
    """The suite module of `contract` (imported now, not before)."""
    return importlib.import_module(SUITES[contract])


def suite_cases(contract: str) -> list[Case]:
    """The cases of `contract`'s suite, in the suite's order, then its coordination matrix
    (`_matrix_coordination`: its writes against every state of their row, and tenants),
    then its cases of orders and recorded times (`_orders_and_times`)."""
    from agboss_sql.testing.contracts._matrix_coordination import coordination_cases
    from agboss_sql.testing.contracts._orders_and_times import cases_of

    module = suite_module(contract)
    found: list[Case] = list(module.cases())
    return found + coordination_cases(contract) + cases_of(contract)


def snake_case(text: str) -> str:
    """`rateLimits` -> `rate_limits`; `Rate-Limit` -> `rate_limit`."""
    text = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", text)
    return re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()


def closest_contract(key: str) -> str | None:
    """The contract key a mistyped `key` most likely meant, or `None`."""
    candidates = list(SUITES)
    for probe in (key, snake_case(key)):
        if probe in SUITES:
            return probe
        found = difflib.get_close_matches(probe, candidates, n=1, cutoff=0.6)
        if found:
            return found[0]
    return None


__all__ = [
    "FENCED_EFFECT",
    "FENCING_STORES",
    "LEASE",
    "LEASE_LOG",
    "MAY_BE_LEFT_OUT",
    "OUTBOUND_CALL",
    "SUITES",
    "WHAT_IT_PROVES",
    "closest_contract",
    "snake_case",
    "suite_cases",
    "suite_module",
]
