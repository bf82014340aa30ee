"""More cases of the execution records' suite: what a move leaves alone.

Added where mutation testing of the stores (docs/mutation.md) found a change no case saw:
a `transition` that also wrote the run's outcome (to `None`) passed every case, because no
case read a run's outcome after a transition; a `find_by_status` that answered nothing for
a limit of one passed too (the cases asked for 0, 2 and 10).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.stores import ExecutionRecordRepository
from agboss_sql.contracts.types import ExecutionRecord, ExecutionRecordStatus
from agboss_sql.testing._case import Case, CaseContext

CONTRACT = "execution_record"
TENANT = "tenant-1"

RUNNING = ExecutionRecordStatus.RUNNING
PAUSED = ExecutionRecordStatus.PAUSED


def _records(ctx: CaseContext, instance: int = 0) -> ExecutionRecordRepository:
    store: ExecutionRecordRepository = ctx.store(CONTRACT, instance)
    return store


async def moves_the_status_and_time_only(ctx: CaseContext) -> None:
    """A `transition` changes the status and `updated_at` (the moving instance's clock) and
    nothing else: an outcome saved with a running record still reads back after it moved,
    there and back again, on either instance."""
    saved = ExecutionRecord(
        tenant_id=TENANT,
        execution_id="exec-1",
        root_execution_id="root-1",
        parent_execution_id="root-1",
        thread_id="thread-1",
        workflow="support",
        owner="user-1",
        status=RUNNING,
        created_at=ctx.clock.now(),
        updated_at=ctx.clock.now(),
        outcome={"progress": [1, 2], "note": "half way"},
    )
    await _records(ctx, 0).save(saved)
    expected = saved
    for instance, (before, after) in enumerate([(RUNNING, PAUSED), (PAUSED, RUNNING)]):
        await ctx.clock.advance(100)
        moved = await _records(ctx, instance).transition(TENANT, "exec-1", before, after)
        if not moved:
            raise AssertionError(f"[transition-cas] {before} -> {after} refused")
        expected = dataclasses.replace(expected, status=after, updated_at=ctx.clock.now())
        for reader in (0, 1):
            got = await _records(ctx, reader).get(TENANT, "exec-1")
            if got != expected:
                raise AssertionError(
                    f"[transition-cas] after {before} -> {after}, instance {reader + 1} "
                    f"reads {got}, expected {expected} (only the status and updated_at move)"
                )


async def finds_by_status_with_a_limit_of_one(ctx: CaseContext) -> None:
    """`find_by_status(status, 1)` answers the one record of the status updated first, on
    either instance; with one record left in the status, that one."""
    start = ctx.clock.now()
    for i, offset in enumerate([20, 10]):
        record = ExecutionRecord(
            tenant_id=TENANT,
            execution_id=f"exec-{i}",
            root_execution_id=f"exec-{i}",
            parent_execution_id=None,
            thread_id=None,
            workflow="support",
            owner=None,
            status=RUNNING,
            created_at=start,
            updated_at=start + offset,
        )
        await _records(ctx, i % 2).save(record)
    for instance in (0, 1):
        one = [r.execution_id for r in await _records(ctx, instance).find_by_status(RUNNING, 1)]
        if one != ["exec-1"]:
            raise AssertionError(
                f"[find-by-status] find_by_status(running, 1) on instance {instance + 1} "
                f"gave {one}, expected ['exec-1'] (the oldest update)"
            )
    await _records(ctx, 0).transition(TENANT, "exec-1", RUNNING, PAUSED)
    left = [r.execution_id for r in await _records(ctx, 1).find_by_status(RUNNING, 1)]
    if left != ["exec-0"]:
        raise AssertionError(f"[find-by-status] limit 1 after exec-1 moved gave {left}")


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("a transition moves the status and time only", moves_the_status_and_time_only),
    ("find_by_status with a limit of one answers the oldest", finds_by_status_with_a_limit_of_one),
]


def more_cases() -> list[Case]:
    """The cases of this module, in the suite's order."""
    return [Case(CONTRACT, name, run) for name, run in CASES]


__all__ = ["more_cases"]
