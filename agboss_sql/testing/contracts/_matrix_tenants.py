"""Tenant isolation of writes and wakes where a tenant's rows meet another's through an id
they share beside the row's own: a parent id (the child queue's counts and wakes), an
execution id or an application (the cost ledger's totals and reservations). (The lease
log's and the drained pauses' reads are kept apart by hand-picked cases of their suites.) Each case gives both tenants
every id equal and proves that what one tenant does never changes, wakes or counts
anything of the other. The row-by-row isolation (one tenant's write never moves another's
row of the same ids) is in every table of `_matrix_rows`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agboss_sql.contracts.types import (
    BudgetScope,
    ChildStatus,
    CostEntry,
    QueuedChild,
)
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import OTHER_TENANT, TENANT, World, expect, fail

RULE = "tenant-isolation"
A, B = TENANT, OTHER_TENANT

CaseRun = Callable[[CaseContext], Awaitable[None]]

# --- the child queue ----------------------------------------------------------------------

CHILD_QUEUE = "child_queue"


def _queued(tenant: str, parent: str, child: str) -> QueuedChild:
    return QueuedChild(tenant, f"{parent}-root", parent, child, 1, None)


async def _claim(queue: Any, child: str, kept: dict[str, int]) -> int:
    """Claim until `child` is claimed: its attempt. A child claimed on the way is kept in
    `kept` for its own `_claim` (the queue takes the oldest first)."""
    found = kept.pop(child, None)
    if found is not None:
        return found
    for _ in range(100):
        claimed = await queue.claim("instance-1")
        if claimed is None:
            break
        if claimed.child_execution_id == child:
            return int(claimed.attempt)
        kept[claimed.child_execution_id] = int(claimed.attempt)
    fail("claim-when-queued", f"the queued child {child!r} was never claimed")


async def _status(queue: Any, tenant: str, parent: str, child: str) -> str | None:
    for found in await queue.children(tenant, parent):
        if found.child_execution_id == child:
            return str(found.status.value)
    return None


async def finish_counts_its_own_tenant(ctx: CaseContext) -> None:
    """The last finish of tenant A's children of a parent id sees none left while tenant
    B's child of the same parent id is unfinished: it owes A's parent its wake, and B's
    child and its count are untouched (B's own last finish then sees none left too)."""
    w = World(ctx)
    queue = ctx.store(CHILD_QUEUE, 0)
    other = ctx.store(CHILD_QUEUE, 1)
    kept: dict[str, int] = {}
    parent, mine, theirs = w.name("parent"), w.name("child"), w.name("child")
    await queue.enqueue(_queued(A, parent, mine))
    await other.enqueue(_queued(B, parent, theirs))
    done = await other.finish(mine, {"ok": True}, attempt=await _claim(queue, mine, kept))
    expect(
        tuple(done) == (True, 0),
        RULE,
        f"the finish of {A}'s only child of {parent!r} answered {done}, with {B}'s child of "
        "the same parent id unfinished: it counted another tenant's child",
    )
    owed = [c.child_execution_id for c in await queue.unwoken(10_000)]
    expect(mine in owed, RULE, f"{A}'s last finish owes no wake: unwoken lists {owed}")
    listed = [c.child_execution_id for c in await queue.children(A, parent)]
    expect(listed == [mine], RULE, f"{A}'s children of {parent!r} are {listed}")
    status = await _status(queue, B, parent, theirs)
    expect(status == "queued", RULE, f"{B}'s child reads {status!r} after {A}'s finish")
    done = await queue.finish(theirs, {"ok": True}, attempt=await _claim(queue, theirs, kept))
    expect(
        tuple(done) == (True, 0),
        RULE,
        f"{B}'s only child of {parent!r} finished answering {done}: {A}'s finish changed "
        f"{B}'s count",
    )


async def _waiting(
    queue: Any, tenant: str, parent: str, child: str, kept: dict[str, int]
) -> tuple[str, int]:
    """Tenant's child `parent` running, then waiting for its own child `child`."""
    await queue.enqueue(_queued(tenant, f"{parent}-up", parent))
    attempt = await _claim(queue, parent, kept)
    await queue.enqueue(_queued(tenant, parent, child))
    waited = await queue.wait_for_children(parent, attempt=attempt)
    expect(
        waited is not None and waited.waiting,
        "wait-state",
        f"a child with an unfinished child of its own did not wait: {waited}",
    )
    return f"{parent}-up", attempt


async def last_finish_wakes_its_own_tenant(ctx: CaseContext) -> None:
    """Tenant B's entry P waits for its own child; tenant A's last child of a parent with
    the same id P finishes: B's P stays waiting (A's finish wakes no parent of B), and B's
    own last finish then wakes it."""
    w = World(ctx)
    queue = ctx.store(CHILD_QUEUE, 0)
    other = ctx.store(CHILD_QUEUE, 1)
    kept: dict[str, int] = {}
    parent, theirs, mine = w.name("parent"), w.name("child"), w.name("child")
    up, _ = await _waiting(queue, B, parent, theirs, kept)
    await queue.enqueue(_queued(A, parent, mine))
    done = await other.finish(mine, {"ok": True}, attempt=await _claim(queue, mine, kept))
    expect(tuple(done) == (True, 0), RULE, f"{A}'s last finish answered {done}")
    status = await _status(queue, B, up, parent)
    expect(
        status == "waiting",
        RULE,
        f"{A}'s last finish of a parent id {B} also uses moved {B}'s waiting entry to {status!r}",
    )
    done = await other.finish(theirs, {"ok": True}, attempt=await _claim(queue, theirs, kept))
    expect(tuple(done) == (True, 0), RULE, f"{B}'s own last finish answered {done}")
    status = await _status(queue, B, up, parent)
    expect(status == "queued", "wait-wake", f"{B}'s own last finish left its parent {status!r}")


async def wait_counts_its_own_tenant(ctx: CaseContext) -> None:
    """Tenant B's entry P runs with no child of its own; tenant A queues children under a
    parent with the same id P (one by one and in a batch): B's P does not wait for them."""
    w = World(ctx)
    queue = ctx.store(CHILD_QUEUE, 0)
    other = ctx.store(CHILD_QUEUE, 1)
    kept: dict[str, int] = {}
    parent = w.name("parent")
    await queue.enqueue(_queued(B, f"{parent}-up", parent))
    attempt = await _claim(queue, parent, kept)
    await other.enqueue(_queued(A, parent, w.name("child")))
    await other.enqueue_many([_queued(A, parent, w.name("child")) for _ in range(2)])
    waited = await other.wait_for_children(parent, attempt=attempt)
    expect(
        waited is not None and tuple(waited) == (False, 0),
        RULE,
        f"{B}'s entry with no child of its own answered {waited} to its wait, with {A}'s 3 "
        "children of the same parent id queued: it counted another tenant's children",
    )
    status = await _status(queue, B, f"{parent}-up", parent)
    expect(status == ChildStatus.RUNNING.value, RULE, f"{B}'s entry reads {status!r}")


# --- the cost ledger ----------------------------------------------------------------------

LEDGER = "cost_ledger"


def _entry(tenant: str, entry_id: str, execution: str, cost: int) -> CostEntry:
    return CostEntry(entry_id, tenant, execution, "app-1", 1, 2, cost, 1_700_000_000_000)


async def _cost(ledger: Any, scope: BudgetScope, key: str, tenant: str | None) -> int:
    return int((await ledger.total(scope, key, tenant_id=tenant)).cost_micros)


async def record_counts_its_own_tenant(ctx: CaseContext) -> None:
    """Two tenants record an entry of one id, one execution id and one application: both
    are recorded, and each tenant's totals (by execution, tenant and application) count its
    own entry only; the application's total without a tenant counts both."""
    w = World(ctx)
    ledger = ctx.store(LEDGER, 0)
    other = ctx.store(LEDGER, 1)
    entry, execution = w.name("entry"), w.name("exec")
    first = await ledger.record(_entry(B, entry, execution, 700))
    second = await other.record(_entry(A, entry, execution, 100))
    expect(
        (first, second) == (True, True),
        RULE,
        f"one entry id recorded by two tenants answered {first}, {second}: entry ids are per "
        "tenant",
    )
    for scope, key, tenant in (
        (BudgetScope.EXECUTION, execution, A),
        (BudgetScope.TENANT, A, A),
        (BudgetScope.TENANT, A, None),
        (BudgetScope.APPLICATION, "app-1", A),
    ):
        got = await _cost(ledger, scope, key, tenant)
        expect(
            got == 100,
            RULE,
            f"{A}'s total by {scope.value} {key!r} (tenant_id={tenant!r}) is {got}, not its "
            f"own 100: {B}'s entry of the same ids counted",
        )
    both = await _cost(ledger, BudgetScope.APPLICATION, "app-1", None)
    expect(both == 800, "ledger-states", f"the application's total is {both}, not 800")


async def reserve_counts_its_own_tenant(ctx: CaseContext) -> None:
    """A reservation under tenant A is held against A's spend alone, counts in A's totals
    and in none of B's, whatever ids the two share."""
    w = World(ctx)
    ledger = ctx.store(LEDGER, 0)
    other = ctx.store(LEDGER, 1)
    execution = w.name("exec")
    await ledger.record(_entry(B, w.name("entry"), execution, 100))
    before = {scope: await _cost(ledger, scope, key, B) for scope, key in _keys(execution)}
    for scope, key in ((BudgetScope.EXECUTION, execution), (BudgetScope.APPLICATION, "app-1")):
        got = await other.try_reserve(scope, key, 100, 100, tenant_id=A)
        expect(
            got,
            RULE,
            f"{A}'s reservation of 100 within 100 by {scope.value} {key!r} was refused: "
            f"{B}'s spend of the same ids counted against it",
        )
        again = await ledger.try_reserve(scope, key, 1, 100, tenant_id=A)
        expect(not again, "reserve-within-limit", f"{A} reserved past its limit by {scope.value}")
    after = {scope: await _cost(ledger, scope, key, B) for scope, key in _keys(execution)}
    expect(
        after == before,
        RULE,
        f"{A}'s reservations changed {B}'s totals: {before} -> {after}",
    )


def _keys(execution: str) -> list[tuple[BudgetScope, str]]:
    return [
        (BudgetScope.EXECUTION, execution),
        (BudgetScope.APPLICATION, "app-1"),
        (BudgetScope.TENANT, B),
    ]


CASES: dict[str, list[tuple[str, CaseRun]]] = {
    CHILD_QUEUE: [
        (
            "tenants: a finish counts and wakes its own tenant's children of a parent id",
            finish_counts_its_own_tenant,
        ),
        (
            "tenants: the last finish wakes no waiting entry of another tenant",
            last_finish_wakes_its_own_tenant,
        ),
        (
            "tenants: a wait counts no child of another tenant's parent id",
            wait_counts_its_own_tenant,
        ),
    ],
    LEDGER: [
        ("tenants: a record counts in its own tenant's totals only", record_counts_its_own_tenant),
        (
            "tenants: a reservation is held and counted in its own tenant only",
            reserve_counts_its_own_tenant,
        ),
    ],
}
"""The tenant cases of each contract."""


def tenant_cases(contract: str) -> list[Case]:
    """The tenant cases of `contract` (none for a contract not listed)."""
    return [Case(contract, name, run) for name, run in CASES.get(contract, [])]


__all__ = ["CASES", "tenant_cases"]
