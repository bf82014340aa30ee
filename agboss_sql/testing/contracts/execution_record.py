"""Contract suite of `ExecutionRecordRepository` (docs/contracts.md): runs and their status.

A record is saved once per `(tenant, execution)`, read only by its own tenant, found by
thread and by status, and moved only by compare-and-set from the status its caller read:
two outcomes for one run are impossible, whichever instances race.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.errors import DuplicateExecutionError
from agboss_sql.contracts.stores import ExecutionRecordRepository
from agboss_sql.contracts.types import ExecutionRecord, ExecutionRecordStatus
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._execution_record_more import more_cases

CONTRACT = "execution_record"
TENANT = "tenant-1"
OTHER_TENANT = "tenant-2"

QUEUED = ExecutionRecordStatus.QUEUED
RUNNING = ExecutionRecordStatus.RUNNING
PAUSED = ExecutionRecordStatus.PAUSED
SUCCEEDED = ExecutionRecordStatus.SUCCEEDED
FAILED = ExecutionRecordStatus.FAILED
CANCELLED = ExecutionRecordStatus.CANCELLED


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _records(ctx: CaseContext, instance: int = 0) -> ExecutionRecordRepository:
    store: ExecutionRecordRepository = ctx.store(CONTRACT, instance)
    return store


def _record(
    ctx: CaseContext,
    execution_id: str,
    status: ExecutionRecordStatus = RUNNING,
    *,
    tenant_id: str = TENANT,
    thread_id: str | None = "thread-1",
    at: int | None = None,
) -> ExecutionRecord:
    now = ctx.clock.now() if at is None else at
    return ExecutionRecord(
        tenant_id=tenant_id,
        execution_id=execution_id,
        root_execution_id=execution_id,
        parent_execution_id=None,
        thread_id=thread_id,
        workflow="support",
        owner="user-1",
        status=status,
        created_at=now,
        updated_at=now,
    )


async def reads_back_a_saved_record(ctx: CaseContext) -> None:
    """Every field comes back as saved, on the other instance too; an unknown id is `None`."""
    root = _record(ctx, "root-1", QUEUED)
    child = ExecutionRecord(
        tenant_id=TENANT,
        execution_id="child-1",
        root_execution_id="root-1",
        parent_execution_id="root-1",
        thread_id=None,
        workflow="refund ✓",
        owner=None,
        status=RUNNING,
        created_at=ctx.clock.now() - 5,
        updated_at=ctx.clock.now(),
        outcome={"partial": [1, "zwei", None]},
    )
    await _records(ctx, 0).save(root)
    await _records(ctx, 0).save(child)
    for instance in (0, 1):
        for saved in (root, child):
            got = await _records(ctx, instance).get(TENANT, saved.execution_id)
            _expect(got == saved, "record-round-trip", f"saved {saved}, read back {got}")
    unknown = await _records(ctx, 1).get(TENANT, "nobody")
    _expect(unknown is None, "record-round-trip", f"an unknown id reads {unknown}")


async def refuses_a_duplicate_execution_id(ctx: CaseContext) -> None:
    """A second save of one `(tenant, execution)` is `DuplicateExecutionError`, from either
    instance; the first record is untouched."""
    first = _record(ctx, "exec-1", QUEUED)
    await _records(ctx, 0).save(first)
    try:
        await _records(ctx, 1).save(dataclasses.replace(first, status=RUNNING, owner="thief"))
    except DuplicateExecutionError:
        pass
    else:
        raise AssertionError("[duplicate-execution] a second save of exec-1 was accepted")
    got = await _records(ctx, 0).get(TENANT, "exec-1")
    _expect(got == first, "duplicate-execution", f"the refused save changed the record: {got}")


async def accepts_one_of_concurrent_saves_of_one_id(ctx: CaseContext) -> None:
    """Ten saves of one id at once through both instances: one is stored, every other is
    `DuplicateExecutionError` (never another error)."""
    records = [
        dataclasses.replace(_record(ctx, "exec-1", QUEUED), owner=f"owner-{i}") for i in range(10)
    ]
    results = await asyncio.gather(
        *(_records(ctx, i % 2).save(r) for i, r in enumerate(records)), return_exceptions=True
    )
    other = [r for r in results if r is not None and not isinstance(r, DuplicateExecutionError)]
    _expect(not other, "duplicate-execution", f"a duplicate save failed with {other[:1]!r}")
    winners = [rec for rec, r in zip(records, results, strict=True) if r is None]
    _expect(len(winners) == 1, "duplicate-execution", f"{len(winners)} of 10 saves accepted")
    got = await _records(ctx, 1).get(TENANT, "exec-1")
    _expect(got == winners[0], "duplicate-execution", f"stored {got}, winner {winners[0]}")


async def keeps_tenants_apart(ctx: CaseContext) -> None:
    """Another tenant's record reads `None`; one execution id may exist once per tenant, and
    each tenant reads and moves only its own."""
    mine = _record(ctx, "exec-1", RUNNING)
    await _records(ctx, 0).save(mine)
    theirs = await _records(ctx, 1).get(OTHER_TENANT, "exec-1")
    _expect(theirs is None, "tenant-isolation", f"tenant-2 reads tenant-1's record: {theirs}")
    moved = await _records(ctx, 1).transition(OTHER_TENANT, "exec-1", RUNNING, PAUSED)
    _expect(not moved, "tenant-isolation", "tenant-2 moved tenant-1's record")
    other = _record(ctx, "exec-1", QUEUED, tenant_id=OTHER_TENANT, thread_id="thread-9")
    await _records(ctx, 1).save(other)
    got_mine = await _records(ctx, 0).get(TENANT, "exec-1")
    got_other = await _records(ctx, 0).get(OTHER_TENANT, "exec-1")
    _expect(
        (got_mine, got_other) == (mine, other),
        "tenant-isolation",
        f"one id under two tenants reads {got_mine} and {got_other}",
    )
    done = await _records(ctx, 0).complete(TENANT, "exec-1", RUNNING, SUCCEEDED, "ok")
    _expect(done, "transition-cas", "tenant-1's complete was refused")
    still = await _records(ctx, 1).get(OTHER_TENANT, "exec-1")
    _expect(still == other, "tenant-isolation", f"tenant-1's complete moved tenant-2's: {still}")
    threads = await _records(ctx, 0).find_by_thread(TENANT, "thread-9")
    _expect(list(threads) == [], "tenant-isolation", f"tenant-1 finds tenant-2's: {threads}")


async def finds_a_tenants_records_by_thread_oldest_first(ctx: CaseContext) -> None:
    """`find_by_thread` lists the tenant's records of the thread, oldest first, and nothing
    of another thread or tenant."""
    start = ctx.clock.now()
    await _records(ctx, 0).save(_record(ctx, "exec-b", SUCCEEDED, at=start + 20))
    await _records(ctx, 1).save(_record(ctx, "exec-a", RUNNING, at=start + 10))
    await _records(ctx, 0).save(_record(ctx, "exec-c", PAUSED, at=start + 30))
    await _records(ctx, 1).save(_record(ctx, "exec-d", RUNNING, thread_id="thread-2"))
    await _records(ctx, 0).save(_record(ctx, "exec-e", RUNNING, thread_id=None))
    await _records(ctx, 1).save(_record(ctx, "exec-f", RUNNING, tenant_id=OTHER_TENANT))
    found = [r.execution_id for r in await _records(ctx, 1).find_by_thread(TENANT, "thread-1")]
    _expect(
        found == ["exec-a", "exec-b", "exec-c"],
        "find-by-thread",
        f"find_by_thread(tenant-1, thread-1) = {found}, expected ['exec-a', 'exec-b', 'exec-c']",
    )
    none = await _records(ctx, 0).find_by_thread(TENANT, "thread-unknown")
    _expect(list(none) == [], "find-by-thread", f"an unknown thread finds {none}")


async def finds_records_by_status_oldest_update_first(ctx: CaseContext) -> None:
    """`find_by_status` lists up to `limit` records in the status, oldest update first; a
    move stamps `updated_at` with the application clock's time and moves it between lists."""
    start = ctx.clock.now()
    for i, offset in enumerate([30, 10, 20]):
        await _records(ctx, i % 2).save(_record(ctx, f"exec-{i}", RUNNING, at=start + offset))
    await _records(ctx, 0).save(_record(ctx, "exec-q", QUEUED, tenant_id=OTHER_TENANT))
    found = [r.execution_id for r in await _records(ctx, 1).find_by_status(RUNNING, 10)]
    _expect(
        found == ["exec-1", "exec-2", "exec-0"],
        "find-by-status",
        f"find_by_status(running, 10) = {found}, expected ['exec-1', 'exec-2', 'exec-0']",
    )
    two = [r.execution_id for r in await _records(ctx, 0).find_by_status(RUNNING, 2)]
    _expect(two == ["exec-1", "exec-2"], "find-by-status", f"limit 2 gave {two}")
    await ctx.clock.advance(100)
    moved = await _records(ctx, 1).transition(TENANT, "exec-1", RUNNING, PAUSED)
    _expect(moved, "transition-cas", "running -> paused refused")
    got = await _records(ctx, 0).get(TENANT, "exec-1")
    _expect(
        got is not None and got.status is PAUSED and got.updated_at == ctx.clock.now(),
        "find-by-status",
        f"after the move at {ctx.clock.now()} the record reads {got}",
    )
    found = [r.execution_id for r in await _records(ctx, 0).find_by_status(RUNNING, 10)]
    _expect(found == ["exec-2", "exec-0"], "find-by-status", f"running after the move: {found}")
    paused = [r.execution_id for r in await _records(ctx, 1).find_by_status(PAUSED, 10)]
    _expect(paused == ["exec-1"], "find-by-status", f"paused after the move: {paused}")
    queued = [
        (r.tenant_id, r.execution_id) for r in await _records(ctx, 1).find_by_status(QUEUED, 10)
    ]
    _expect(queued == [(OTHER_TENANT, "exec-q")], "find-by-status", f"queued: {queued}")
    zero = await _records(ctx, 0).find_by_status(RUNNING, 0)
    _expect(list(zero) == [], "find-by-status", f"limit 0 gave {zero}")


async def moves_a_status_by_compare_and_set(ctx: CaseContext) -> None:
    """`transition` moves only from the expected status, once; a wrong expectation or an
    unknown run moves nothing."""
    await _records(ctx, 0).save(_record(ctx, "exec-1", QUEUED))
    wrong = await _records(ctx, 1).transition(TENANT, "exec-1", PAUSED, RUNNING)
    _expect(not wrong, "transition-cas", "moved from paused while the run was queued")
    first = await _records(ctx, 1).transition(TENANT, "exec-1", QUEUED, RUNNING)
    _expect(first, "transition-cas", "queued -> running refused")
    again = await _records(ctx, 0).transition(TENANT, "exec-1", QUEUED, RUNNING)
    _expect(not again, "transition-cas", "a second queued -> running was accepted")
    got = await _records(ctx, 0).get(TENANT, "exec-1")
    _expect(got is not None and got.status is RUNNING, "transition-cas", f"reads {got}")
    unknown = await _records(ctx, 0).transition(TENANT, "nobody", QUEUED, RUNNING)
    _expect(not unknown, "transition-cas", "an unknown run was moved")


async def lets_one_of_concurrent_transitions_win(ctx: CaseContext) -> None:
    """Ten instances' `queued -> running` of one run at once: one wins."""
    for round_ in range(3):
        execution_id = f"exec-{round_}"
        await _records(ctx, 0).save(_record(ctx, execution_id, QUEUED))
        moved = await asyncio.gather(
            *(
                _records(ctx, i % 2).transition(TENANT, execution_id, QUEUED, RUNNING)
                for i in range(10)
            )
        )
        _expect(
            moved.count(True) == 1,
            "transition-cas",
            f"round {round_ + 1}: {moved.count(True)} of 10 concurrent transitions won",
        )


async def completes_a_run_with_one_outcome(ctx: CaseContext) -> None:
    """`complete` stores the final status and outcome from the expected status; a second
    complete and any later move are refused, so the first outcome stands."""
    await _records(ctx, 0).save(_record(ctx, "exec-1", RUNNING))
    await ctx.clock.advance(50)
    done = await _records(ctx, 1).complete(TENANT, "exec-1", RUNNING, SUCCEEDED, {"answer": 42})
    _expect(done, "one-outcome", "complete from running was refused")
    got = await _records(ctx, 0).get(TENANT, "exec-1")
    _expect(
        got is not None
        and (got.status, got.outcome, got.updated_at)
        == (SUCCEEDED, {"answer": 42}, ctx.clock.now()),
        "one-outcome",
        f"after the complete the record reads {got}",
    )
    second = await _records(ctx, 0).complete(TENANT, "exec-1", RUNNING, FAILED, "late")
    _expect(not second, "one-outcome", "a second complete from running was accepted")
    again = await _records(ctx, 0).complete(TENANT, "exec-1", SUCCEEDED, FAILED, "overwrite")
    _expect(not again, "one-outcome", "a finished run was completed again from its final status")
    back = await _records(ctx, 1).transition(TENANT, "exec-1", SUCCEEDED, RUNNING)
    _expect(not back, "one-outcome", "a finished run moved back to running")
    got = await _records(ctx, 1).get(TENANT, "exec-1")
    _expect(
        got is not None and (got.status, got.outcome) == (SUCCEEDED, {"answer": 42}),
        "one-outcome",
        f"the first outcome did not stand: {got}",
    )


async def lets_one_of_two_concurrent_completes_win(ctx: CaseContext) -> None:
    """Two instances complete one run at once with different outcomes, in both orders,
    round after round: exactly one returns True, and its outcome is the one stored."""
    for round_ in range(10):
        execution_id = f"exec-{round_}"
        await _records(ctx, round_ % 2).save(_record(ctx, execution_id, RUNNING))
        a = _records(ctx, 0).complete(TENANT, execution_id, RUNNING, SUCCEEDED, {"by": "a"})
        b = _records(ctx, 1).complete(TENANT, execution_id, RUNNING, FAILED, {"by": "b"})
        if round_ % 2 == 0:
            done_a, done_b = await asyncio.gather(a, b)
        else:
            done_b, done_a = await asyncio.gather(b, a)
        _expect(
            [done_a, done_b].count(True) == 1,
            "one-outcome",
            f"round {round_ + 1}: two concurrent completes returned {done_a} and {done_b}",
        )
        want = (SUCCEEDED, {"by": "a"}) if done_a else (FAILED, {"by": "b"})
        got = await _records(ctx, 0).get(TENANT, execution_id)
        _expect(
            got is not None and (got.status, got.outcome) == want,
            "one-outcome",
            f"round {round_ + 1}: the winner's outcome is {want}, the record reads {got}",
        )


async def answers_a_retried_complete_as_the_first(ctx: CaseContext) -> None:
    """A complete whose reply was lost is sent again with the same final status and outcome:
    it answers True again, on either instance, and changes nothing; another final status or
    another outcome is False."""
    await _records(ctx, 0).save(_record(ctx, "exec-1", RUNNING))
    await ctx.clock.advance(50)
    done = await _records(ctx, 0).complete(TENANT, "exec-1", RUNNING, SUCCEEDED, {"n": [1, 2]})
    _expect(done, "one-outcome", "complete from running was refused")
    completed = await _records(ctx, 1).get(TENANT, "exec-1")
    await ctx.clock.advance(50)
    for instance in (0, 1):
        retry = await _records(ctx, instance).complete(
            TENANT, "exec-1", RUNNING, SUCCEEDED, {"n": [1, 2]}
        )
        _expect(retry, "complete-retry", f"the retry on instance {instance + 1} gave False")
        other = await _records(ctx, instance).complete(
            TENANT, "exec-1", RUNNING, SUCCEEDED, {"n": [2, 1]}
        )
        _expect(not other, "complete-retry", "a complete with another outcome answered True")
        status = await _records(ctx, instance).complete(
            TENANT, "exec-1", RUNNING, FAILED, {"n": [1, 2]}
        )
        _expect(not status, "complete-retry", "a complete as another status answered True")
    got = await _records(ctx, 0).get(TENANT, "exec-1")
    _expect(got == completed, "complete-retry", f"a retry changed the record: {got}")
    none = await _records(ctx, 1).complete(TENANT, "nobody", RUNNING, SUCCEEDED, {"n": [1, 2]})
    _expect(not none, "complete-retry", "an unknown run was completed")
    await _records(ctx, 1).save(_record(ctx, "exec-2", RUNNING))
    empty = await _records(ctx, 1).complete(TENANT, "exec-2", RUNNING, CANCELLED, None)
    again = await _records(ctx, 0).complete(TENANT, "exec-2", RUNNING, CANCELLED, None)
    _expect(empty and again, "complete-retry", "a retried complete without outcome gave False")


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("reads back a saved record", reads_back_a_saved_record),
    ("refuses a duplicate execution id", refuses_a_duplicate_execution_id),
    ("accepts one of concurrent saves of one id", accepts_one_of_concurrent_saves_of_one_id),
    ("keeps tenants apart", keeps_tenants_apart),
    (
        "finds a tenant's records by thread, oldest first",
        finds_a_tenants_records_by_thread_oldest_first,
    ),
    (
        "finds records by status, oldest update first",
        finds_records_by_status_oldest_update_first,
    ),
    ("moves a status by compare-and-set", moves_a_status_by_compare_and_set),
    ("lets one of concurrent transitions win", lets_one_of_concurrent_transitions_win),
    ("completes a run with one outcome", completes_a_run_with_one_outcome),
    ("lets one of two concurrent completes win", lets_one_of_two_concurrent_completes_win),
    ("answers a retried complete as the first", answers_a_retried_complete_as_the_first),
]


def cases() -> list[Case]:
    """The execution records' cases (none is a fencing case: records are not fenced)."""
    return [Case(CONTRACT, name, run) for name, run in CASES] + more_cases()


__all__ = ["CONTRACT", "cases"]
