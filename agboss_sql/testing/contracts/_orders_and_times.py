"""Cases of the coordination suites on what a store orders by and which time it records.

Added after a trial of one-line mistakes written from outside the suites, as a store
author copying the SQL stores would make them (docs/mutation.md, "A trial from outside"):
mutation tools flip operators and drop terms, but never put one column in place of
another. Each case below sets up rows whose orders (or times) differ by every column a
store could plausibly use, so only the column the contract names passes:

- pauses drained by `created_at`, not by when they were answered (nor by id);
- a cancel records `resolved_at`; `purge` measures a taken pause's age from its take;
- a holder's own slot is never shortened, by a take again or by a renewal with a shorter
  ttl (`max(expires_at, now + ttl)`);
- records of a thread by `created_at`, whatever their ids and save order;
- running children oldest queued first, not first claimed.

`cases_of(contract)` is appended to each contract's suite by `_registry.suite_cases`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agboss_sql.contracts.stores import (
    ChildExecutionQueueRepository,
    ExecutionRecordRepository,
    PausedExecutionRepository,
    RateLimitRepository,
)
from agboss_sql.contracts.types import (
    ExecutionRecord,
    ExecutionRecordStatus,
    PausedExecution,
    PauseStatus,
    QueuedChild,
)
from agboss_sql.testing._case import Case, CaseContext

PAUSES = "paused_execution"
LIMITS = "rate_limit"
RECORDS = "execution_record"
QUEUE = "child_queue"
TENANT = "tenant-1"
ROOT = "root-1"
TTL = 10_000


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _pauses(ctx: CaseContext, instance: int = 0) -> PausedExecutionRepository:
    store: PausedExecutionRepository = ctx.store(PAUSES, instance)
    return store


def _pending(pause_id: str, created_at: int) -> PausedExecution:
    return PausedExecution(
        tenant_id=TENANT,
        pause_id=pause_id,
        execution_id=f"{ROOT}/{pause_id}",
        root_execution_id=ROOT,
        thread_id=None,
        status=PauseStatus.PENDING,
        request={"question": "approve?"},
        decision=None,
        created_at=created_at,
    )


async def drains_by_creation_whatever_the_answer_order(ctx: CaseContext) -> None:
    """`resolved` lists the tree's resolved pauses oldest created first, whatever order
    they were saved, answered and named in."""
    start = ctx.clock.now()
    # Saved (and named) p-1, p-2, p-3; created p-2, p-3, p-1; answered p-3, p-1, p-2.
    created = {"p-2": start + 10, "p-3": start + 20, "p-1": start + 30}
    for pause_id in ("p-1", "p-2", "p-3"):
        await _pauses(ctx, 0).save(_pending(pause_id, created[pause_id]))
    for i, pause_id in enumerate(("p-3", "p-1", "p-2")):
        await ctx.clock.advance(100)
        await _pauses(ctx, i % 2).resolve(TENANT, pause_id, {"approved": i})
    drained = [p.pause_id for p in await _pauses(ctx, 1).resolved(TENANT, ROOT)]
    _expect(
        drained == ["p-2", "p-3", "p-1"],
        "drain-order",
        f"resolved() drained {drained}, expected ['p-2', 'p-3', 'p-1'] (by created_at; "
        "saved p-1, p-2, p-3, answered p-3, p-1, p-2)",
    )


async def records_when_a_pause_was_cancelled(ctx: CaseContext) -> None:
    """A cancel stamps `resolved_at` with the time it cancelled (the application clock's),
    as an answer does."""
    await _pauses(ctx, 0).save(_pending("p-1", ctx.clock.now()))
    await ctx.clock.advance(1_500)
    cancelled_at = ctx.clock.now()
    _expect(await _pauses(ctx, 1).cancel(TENANT, "p-1"), "cancel-cas", "the cancel was refused")
    got = await _pauses(ctx, 0).get(TENANT, "p-1")
    _expect(
        got is not None and got.resolved_at == cancelled_at,
        "cancel-time",
        f"a pause cancelled at {cancelled_at} reads resolved_at="
        f"{None if got is None else got.resolved_at}",
    )


async def purges_a_taken_pause_by_its_take(ctx: CaseContext) -> None:
    """`purge` measures a taken pause's age from its take (its last move), not from its
    answer: taken long after its answer, it stays until the retention passes its take."""
    start = ctx.clock.now()
    await _pauses(ctx, 0).save(_pending("p-1", start))
    await ctx.clock.advance(1_000)
    await _pauses(ctx, 1).resolve(TENANT, "p-1", {"approved": True})
    await ctx.clock.advance(9_000)
    taken_at = ctx.clock.now()
    _expect(await _pauses(ctx, 0).take(TENANT, "p-1", taker="w-1"), "take-once", "take refused")
    kept = await _pauses(ctx, 1).purge(taken_at - 1)
    left = await _pauses(ctx, 0).get(TENANT, "p-1")
    _expect(
        kept == 0 and left is not None,
        "purge-retention",
        f"purge({taken_at - 1}) deleted {kept} pause(s) taken at {taken_at} (answered at "
        f"{start + 1_000}): its age was measured from its answer",
    )
    gone = await _pauses(ctx, 1).purge(taken_at + 1)
    _expect(gone == 1, "purge-retention", f"purge past the take deleted {gone}, expected 1")


def _limits(ctx: CaseContext, instance: int = 0) -> RateLimitRepository:
    store: RateLimitRepository = ctx.store(LIMITS, instance)
    return store


async def never_shortens_a_holders_own_slot(ctx: CaseContext) -> None:
    """A holder's take again, or renewal, with a shorter ttl leaves its longer slot as it
    was (`max(expires_at, now + ttl)`): the slot still counts until its first end."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    _expect(await a.acquire_slot("model", "h-1", 1, 10 * TTL), "slots-within-max", "refused")
    _expect(await b.acquire_slot("model", "h-1", 1, TTL), "slot-refresh", "own take refused")
    _expect(await a.renew_slot("model", "h-1", TTL), "renew-live-slot", "renewal refused")
    await ctx.clock.advance(2 * TTL)
    _expect(
        not await b.acquire_slot("model", "h-2", 1, TTL),
        "slot-never-shortens",
        "a slot taken for 10 ttl was shortened to 1 ttl by its holder's later take or "
        "renewal with the shorter ttl: another holder was admitted to a full key",
    )
    _expect(
        await a.renew_slot("model", "h-1", TTL),
        "slot-never-shortens",
        "the holder's slot had ended after 2 ttl though it was taken for 10",
    )


def _records(ctx: CaseContext, instance: int = 0) -> ExecutionRecordRepository:
    store: ExecutionRecordRepository = ctx.store(RECORDS, instance)
    return store


def _record(execution_id: str, created_at: int) -> ExecutionRecord:
    return ExecutionRecord(
        tenant_id=TENANT,
        execution_id=execution_id,
        root_execution_id=execution_id,
        parent_execution_id=None,
        thread_id="thread-1",
        workflow="support",
        owner="user-1",
        status=ExecutionRecordStatus.RUNNING,
        created_at=created_at,
        updated_at=created_at,
    )


async def finds_a_threads_records_by_creation(ctx: CaseContext) -> None:
    """`find_by_thread` lists oldest created first, whatever the ids and the save order."""
    start = ctx.clock.now()
    # Saved (and named) r-1, r-2, r-3; created r-3, r-1, r-2.
    for i, (execution_id, offset) in enumerate((("r-1", 20), ("r-2", 30), ("r-3", 10))):
        await _records(ctx, i % 2).save(_record(execution_id, start + offset))
    found = [r.execution_id for r in await _records(ctx, 1).find_by_thread(TENANT, "thread-1")]
    _expect(
        found == ["r-3", "r-1", "r-2"],
        "find-by-thread",
        f"find_by_thread gave {found}, expected ['r-3', 'r-1', 'r-2'] (by created_at; "
        "saved r-1, r-2, r-3)",
    )


def _queue(ctx: CaseContext, instance: int = 0) -> ChildExecutionQueueRepository:
    store: ChildExecutionQueueRepository = ctx.store(QUEUE, instance)
    return store


async def lists_running_children_oldest_queued_first(ctx: CaseContext) -> None:
    """`running` lists oldest queued first, whatever order they were claimed in (a deeper
    child queued later is claimed first)."""
    for child_id, depth in (("c-old", 1), ("c-new", 5)):
        await _queue(ctx, 0).enqueue(QueuedChild(TENANT, ROOT, "parent-1", child_id, depth, None))
        await ctx.clock.advance(100)
    for i in (1, 0):
        claimed = await _queue(ctx, i).claim(ctx.instance_id(i))
        _expect(claimed is not None, "claim-marks-running", "a queued child was not claimed")
        await ctx.clock.advance(100)
    running = [c.child_execution_id for c in await _queue(ctx, 1).running(10)]
    _expect(
        running == ["c-old", "c-new"],
        "running-listed",
        f"running(10) = {running}, expected ['c-old', 'c-new'] (oldest queued first; "
        "claimed c-new, then c-old)",
    )


CASES: dict[str, list[tuple[str, Callable[[CaseContext], Awaitable[None]]]]] = {
    PAUSES: [
        (
            "drains by creation whatever the answer order",
            drains_by_creation_whatever_the_answer_order,
        ),
        ("records when a pause was cancelled", records_when_a_pause_was_cancelled),
        ("purges a taken pause by its take", purges_a_taken_pause_by_its_take),
    ],
    LIMITS: [("never shortens a holder's own slot", never_shortens_a_holders_own_slot)],
    RECORDS: [("finds a thread's records by creation", finds_a_threads_records_by_creation)],
    QUEUE: [
        (
            "lists running children oldest queued first",
            lists_running_children_oldest_queued_first,
        )
    ],
}


def cases_of(contract: str) -> list[Case]:
    """This module's cases of `contract` (none for a contract it has none of)."""
    return [Case(contract, name, run) for name, run in CASES.get(contract, [])]


__all__ = ["CASES", "cases_of"]
