"""`StoreConformanceError`: a store set the conformance suite or the explorer cannot run
as given."""

from __future__ import annotations

from collections.abc import Sequence

EMPTY = "store-conformance.empty"
UNKNOWN_STORE = "store-conformance.unknown-store"
INVALID_WITHOUT = "store-conformance.invalid-without"
WITHOUT_IMPLEMENTED = "store-conformance.without-implemented"
LEASE_STORE_REQUIRED = "store-conformance.lease-store-required"
MISSING_FENCING_CONTRACT = "store-conformance.missing-fencing-contract"
BUSINESS_ROWS_REQUIRED = "store-conformance.business-rows-required"
INVALID_FACTORY = "store-conformance.invalid-factory"
INVALID_OPTION = "store-conformance.invalid-option"
OPTED_OUT_STORE = "store-conformance.opted-out-store"
OPT_OUT_NOT_DECLARED = "store-conformance.opt-out-not-declared"
SUITE_UNAVAILABLE = "store-conformance.suite-unavailable"

CODES = (
    EMPTY,
    UNKNOWN_STORE,
    INVALID_WITHOUT,
    WITHOUT_IMPLEMENTED,
    LEASE_STORE_REQUIRED,
    MISSING_FENCING_CONTRACT,
    BUSINESS_ROWS_REQUIRED,
    INVALID_FACTORY,
    INVALID_OPTION,
    OPTED_OUT_STORE,
    OPT_OUT_NOT_DECLARED,
    SUITE_UNAVAILABLE,
)
"""Every code a `StoreConformanceError` carries."""


class StoreConformanceError(Exception):
    """A store set that cannot be proven as given, or a store that refuses to be proven.

    The message carries each problem's code in brackets, e.g.
    `[store-conformance.unknown-store]`, and says what to change. A malformed set is
    reported whole, every problem at once; `code` is the first problem's, `codes` all.
    """

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        if not problems:
            raise ValueError("a StoreConformanceError needs at least one problem")
        self.problems = tuple(problems)
        self.codes = tuple(code for code, _ in self.problems)
        self.code = self.codes[0]
        super().__init__("\n".join(f"[{code}] {text}" for code, text in self.problems))

    @classmethod
    def of(cls, code: str, text: str) -> StoreConformanceError:
        """One problem."""
        return cls([(code, text)])


__all__ = ["CODES", "StoreConformanceError"]
