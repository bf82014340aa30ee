"""The lease suite's expected leases and the check its cases share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agboss_sql.contracts.types import ExecutionLease, LeaseHolder
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fencing import TENANT, expect, fail

CaseRun = Callable[[CaseContext], Awaitable[None]]


def _lease(
    tree: str,
    holder: str,
    epoch: int,
    remaining: int,
    taken_over_from: LeaseHolder | None = None,
    tenant: str = TENANT,
) -> ExecutionLease:
    return ExecutionLease(tenant, tree, holder, epoch, remaining, taken_over_from)


def _expect_lease(
    got: ExecutionLease | None, want: ExecutionLease, rule: str, what: str
) -> ExecutionLease:
    if got is None:
        fail(rule, f"{what}: refused, expected {want}")
    expect(got == want, rule, f"{what}: got {got}, expected {want}")
    return got
