"""`SqlChildExecutionQueueRepository` on the database under test (docs/contracts.md).

Several `SqlConnection`s stand for several instances. The races run for real: workers
on their own connections claim and finish at once. Broken twins (a check-then-write
claim, a finish that counts outside the lock) run under the same races and are caught,
which shows the races bite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from support.capabilities import require, row_locks, skip_locked, update_returning
from support.sql import statements

from agboss_sql.contracts import (
    ApplicationContext,
    ChildStatus,
    ClaimedChild,
    DuplicateChildError,
    FinishResult,
    InvalidIdentifierError,
    QueuedChild,
    StoreTimeoutError,
    VirtualClock,
    WaitResult,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.queue import QUEUED, RUNNING, SqlChildExecutionQueueRepository
from agboss_sql.sql.schema import child_executions, child_parents
from agboss_sql.sql.timeouts import Timeouts

START = 1_000_000
TENANT = "tenant-1"
C = child_executions

NewConnection = Callable[[], SqlConnection]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


def store(
    connection: SqlConnection, clock: VirtualClock, instance: str = "instance-1"
) -> SqlChildExecutionQueueRepository:
    return SqlChildExecutionQueueRepository(connection, clock, ApplicationContext(instance))


def child(
    child_id: str,
    depth: int = 1,
    parent: str = "parent-1",
    payload: object = None,
    tenant: str = TENANT,
) -> QueuedChild:
    return QueuedChild(tenant, "root-1", parent, child_id, depth, payload)


async def enqueue_many(
    queues: Sequence[SqlChildExecutionQueueRepository], children: list[QueuedChild]
) -> None:
    async def part(i: int) -> None:
        for queued in children[i :: len(queues)]:
            await queues[i].enqueue(queued)

    await asyncio.gather(*(part(i) for i in range(len(queues))))


# --- claims ----------------------------------------------------------------------------


async def test_a_claim_of_an_empty_queue_is_none(sql: SqlConnection, clock: VirtualClock) -> None:
    assert await store(sql, clock).claim("instance-1") is None


async def test_a_claim_marks_the_child_running_for_its_claimer(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    payload = {"input": {"text": "grüße ✓ 😀", "items": [1, 2.5, None, True]}}
    await store(sql, clock).enqueue(child("c-1", depth=2, payload=payload))
    await clock.advance(5)
    other = store(new_connection(), clock, "instance-2")
    claimed = await other.claim("worker-b")
    assert claimed == ClaimedChild(
        TENANT, "root-1", "parent-1", "c-1", 2, payload, attempt=1, claimed_by="worker-b"
    )
    assert await other.claim("worker-c") is None
    [listed] = await store(sql, clock).children(TENANT, "parent-1")
    assert (listed.status, listed.attempt, listed.claimed_by, listed.queued_at) == (
        ChildStatus.RUNNING,
        1,
        "worker-b",
        START,
    )
    assert listed.payload == payload and listed.outcome is None


async def test_claims_go_deepest_first_then_oldest_then_in_queue_order(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    await queue.enqueue(child("shallow-old", depth=1))
    await clock.advance(10)
    await queue.enqueue(child("deep-new", depth=3))
    await queue.enqueue(child("shallow-new-a", depth=1))
    await queue.enqueue(child("shallow-new-b", depth=1))
    await queue.enqueue(child("deep-newer", depth=3, parent="parent-2"))
    await clock.advance(10)
    await queue.enqueue(child("middle", depth=2))
    order = []
    while (claimed := await queue.claim("instance-1")) is not None:
        order.append(claimed.child_execution_id)
    assert order == [
        "deep-new",
        "deep-newer",
        "middle",
        "shallow-old",
        "shallow-new-a",
        "shallow-new-b",
    ]


async def test_a_claim_in_flight_hides_only_the_child_it_holds(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    """A claimer's row lock (held while its transaction is open) must not make the other
    queued children invisible: the next claimer skips the locked row and takes the next.
    (Without an index that serves the claim's order, InnoDB sorts and locks every queued
    row it read, and the next claimer finds nothing.)"""
    # Without row locks (SQLite serialises writers) no claim is ever in flight.
    require(skip_locked(sql), "SKIP LOCKED")
    queue = store(sql, clock)
    for i in range(50):
        await queue.enqueue(child(f"c-{i:02d}", depth=i % 3))
    lock_first = (
        sa.select(C.c.child_execution_id)
        .where(C.c.status == QUEUED)
        .order_by(C.c.depth.desc(), C.c.queued_at, C.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    async with sql.transaction() as in_flight:
        held = (await in_flight.execute(lock_first)).scalar_one()
        assert held == "c-02"
        claimed = await queue.claim("instance-2")
        assert claimed is not None and claimed.child_execution_id == "c-05"


async def test_a_child_id_is_queued_once(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    await queue.enqueue(child("c-1", payload="first"))
    with pytest.raises(DuplicateChildError):
        await store(new_connection(), clock).enqueue(child("c-1", 4, parent="parent-2"))
    [listed] = await queue.children(TENANT, "parent-1")
    assert (listed.child_execution_id, listed.payload, listed.depth) == ("c-1", "first", 1)
    assert await queue.children(TENANT, "parent-2") == []


async def test_concurrent_enqueues_of_one_child_id_queue_it_once(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    queues = [store(sql, clock), store(new_connection(), clock)]
    results = await asyncio.gather(
        *(queues[i % 2].enqueue(child("c-1", payload=i)) for i in range(10)),
        return_exceptions=True,
    )
    assert [r for r in results if r is not None and not isinstance(r, DuplicateChildError)] == []
    assert results.count(None) == 1
    assert len(await queues[0].children(TENANT, "parent-1")) == 1


async def test_an_enqueue_that_waits_past_its_lock_bound_is_a_lock_timeout_not_a_duplicate(
    sql: SqlConnection, sql_url: str, clock: VirtualClock
) -> None:
    """An enqueue whose transaction fails for another reason than a duplicate id raises that
    error: here its parent's count row, held by another session past `lock_ms` (SQLite: the
    write lock). On the MySQL family a duplicate is an error of the insert too, and taking
    any error of the transaction for one would tell the caller a child is queued that is
    not. Nothing of it was applied; queued again once the lock is gone, it is queued."""
    queue = store(sql, clock)
    await queue.enqueue(child("c-1"))  # the parent's count row
    waiter = SqlConnection(sql_url, timeouts=Timeouts(lock_ms=300))
    locked = asyncio.Event()
    release = asyncio.Event()

    async def hold_the_count_row() -> None:
        async with sql.transaction() as tx:
            held = sa.select(child_parents.c.unfinished).where(
                child_parents.c.tenant_id == TENANT,
                child_parents.c.parent_execution_id == "parent-1",
            )
            assert (await tx.execute(held.with_for_update())).scalar_one() == 1
            locked.set()
            await release.wait()

    holding = asyncio.create_task(hold_the_count_row())
    try:
        await locked.wait()
        with pytest.raises(StoreTimeoutError) as raised:
            # The outer bound only keeps a regression from hanging the suite.
            await asyncio.wait_for(store(waiter, clock).enqueue(child("c-2")), 60)
        assert raised.value.what == "lock"
        release.set()
        await holding
        listed = await queue.children(TENANT, "parent-1")
        assert [c.child_execution_id for c in listed] == ["c-1"]
        await store(waiter, clock).enqueue(child("c-2"))
    finally:
        release.set()
        await holding
        await waiter.close()
    listed = await queue.children(TENANT, "parent-1")
    assert sorted(c.child_execution_id for c in listed) == ["c-1", "c-2"]


# --- running, restart ------------------------------------------------------------------


async def test_running_lists_running_children_oldest_first_up_to_limit(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    for i in range(4):
        await queue.enqueue(child(f"c-{i}"))
        await clock.advance(1)
    assert await queue.running(10) == []
    for _ in range(3):
        await queue.claim("instance-1")
    await queue.finish("c-1", None)
    assert [c.child_execution_id for c in await queue.running(10)] == ["c-0", "c-2"]
    assert [c.child_execution_id for c in await queue.running(1)] == ["c-0"]
    assert await queue.running(0) == []
    with pytest.raises(ValueError):
        await queue.running(-1)


async def test_restart_moves_a_running_child_to_this_instance_at_the_next_attempt(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    first = store(sql, clock, "instance-1")
    await first.enqueue(child("c-1", depth=2, payload={"p": 1}))
    await first.enqueue(child("c-2"))
    assert await first.restart("c-1", 0) is None  # still queued
    claimed = await first.claim("instance-1")
    assert claimed is not None and claimed.attempt == 1
    sweeper = store(new_connection(), clock, "instance-2")
    restarted = await sweeper.restart("c-1", 1)
    assert restarted == ClaimedChild(
        TENANT, "root-1", "parent-1", "c-1", 2, {"p": 1}, attempt=2, claimed_by="instance-2"
    )
    assert await store(new_connection(), clock, "instance-3").restart("c-1", 1) is None
    listed = {c.child_execution_id: c for c in await first.children(TENANT, "parent-1")}
    assert (listed["c-1"].status, listed["c-1"].attempt, listed["c-1"].claimed_by) == (
        ChildStatus.RUNNING,
        2,
        "instance-2",
    )
    assert (await sweeper.finish("c-1", "done")).finished
    assert await sweeper.restart("c-1", 2) is None  # finished
    assert await sweeper.restart("unknown", 1) is None


async def test_concurrent_restarts_of_one_attempt_give_one_winner(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    await store(sql, clock).enqueue(child("c-1"))
    claimed = await store(sql, clock).claim("instance-1")
    assert claimed is not None
    sweepers = [store(new_connection(), clock, f"instance-{i}") for i in range(4)]
    attempt = claimed.attempt
    for _ in range(5):
        results = await asyncio.gather(*(sweepers[i % 4].restart("c-1", attempt) for i in range(8)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        assert winners[0].attempt == attempt + 1
        attempt = winners[0].attempt


# --- finish ----------------------------------------------------------------------------


async def test_finish_moves_running_to_finished_once_and_counts_the_siblings_left(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    for i in range(3):
        await queue.enqueue(child(f"c-{i}"))
    await queue.enqueue(child("cousin", parent="parent-2"))
    # Another tenant's child under a parent of the same id is not a sibling.
    await queue.enqueue(child("stranger", tenant="tenant-2"))
    for _ in range(5):
        await queue.claim("instance-1")
    assert await queue.finish("c-0", {"ok": 0}) == FinishResult(True, 2)
    assert await queue.finish("c-0", {"ok": "again"}) == FinishResult(False, 2)
    assert await queue.finish("c-1", {"ok": 1}) == FinishResult(True, 1)
    assert await queue.finish("c-2", {"ok": 2}) == FinishResult(True, 0)
    by_id = {c.child_execution_id: c for c in await queue.children(TENANT, "parent-1")}
    assert [(by_id[f"c-{i}"].status, by_id[f"c-{i}"].outcome) for i in range(3)] == [
        (ChildStatus.FINISHED, {"ok": 0}),
        (ChildStatus.FINISHED, {"ok": 1}),
        (ChildStatus.FINISHED, {"ok": 2}),
    ]
    assert "stranger" not in by_id  # another tenant's child is never listed
    [stranger] = await queue.children("tenant-2", "parent-1")
    assert stranger.child_execution_id == "stranger" and stranger.status is ChildStatus.RUNNING


async def test_a_queued_child_cannot_finish_and_an_unknown_one_finishes_nothing(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    await queue.enqueue(child("c-1"))
    assert await queue.finish("c-1", "early") == FinishResult(False, 1)
    [listed] = await queue.children(TENANT, "parent-1")
    assert (listed.status, listed.outcome) == (ChildStatus.QUEUED, None)
    assert await queue.finish("nobody", None) == FinishResult(False, 0)


async def test_a_finish_at_another_attempt_changes_nothing(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    await queue.enqueue(child("c-1"))
    await queue.claim("instance-1")
    assert await queue.finish("c-1", "wrong", attempt=2) == FinishResult(False, 1)
    assert await queue.finish("c-1", "right", attempt=1) == FinishResult(True, 0)
    [listed] = await queue.children(TENANT, "parent-1")
    assert listed.outcome == "right"


async def test_a_rescued_childs_late_finish_by_its_first_worker_changes_nothing(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    """The sweep restarts a child claimed at attempt 1 (attempt 2); the first worker's late
    `finish(attempt=1)` is refused and does not count; the attempt-2 finish counts once, and
    its retry (a lost reply) answers what it answered and changes nothing."""
    first = store(sql, clock, "instance-1")
    await first.enqueue(child("c-1"))
    await first.enqueue(child("c-2"))
    claimed = await first.claim("instance-1")
    assert claimed is not None and (claimed.child_execution_id, claimed.attempt) == ("c-1", 1)
    sweeper = store(new_connection(), clock, "instance-2")
    restarted = await sweeper.restart("c-1", 1)
    assert restarted is not None and restarted.attempt == 2
    assert await first.finish("c-1", "zombie", attempt=1) == FinishResult(False, 2)
    assert await sweeper.finish("c-1", "real", attempt=2) == FinishResult(True, 1)
    assert await sweeper.finish("c-1", "again", attempt=2) == FinishResult(True, 1)
    assert await first.finish("c-1", "zombie", attempt=1) == FinishResult(False, 1)
    other = await first.claim("instance-1")
    assert other is not None
    assert await first.finish(other.child_execution_id, "last", attempt=1) == FinishResult(True, 0)
    listed = {c.child_execution_id: c for c in await first.children(TENANT, "parent-1")}
    assert (listed["c-1"].outcome, listed["c-1"].attempt) == ("real", 2)


async def test_a_late_finish_racing_its_rescue_lets_exactly_one_win(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    """Round after round, the first worker's finish at attempt 1 races the sweep's
    restart of attempt 1: either the finish counts (and the restart finds nothing running)
    or the restart wins (and the finish is refused, changing nothing)."""
    first = store(sql, clock, "instance-1")
    sweeper = store(new_connection(), clock, "instance-2")
    for round_ in range(10):
        parent = f"parent-{round_}"
        await first.enqueue(child(f"c-{round_}", parent=parent))
        await first.enqueue(child(f"sibling-{round_}", parent=parent, depth=0))
        claimed = await first.claim("instance-1")
        assert claimed is not None and claimed.child_execution_id == f"c-{round_}"
        finish, restart = await asyncio.gather(
            first.finish(claimed.child_execution_id, "late", attempt=1),
            sweeper.restart(claimed.child_execution_id, 1),
        )
        [row] = [
            c for c in await first.children(TENANT, parent) if c.child_execution_id == f"c-{round_}"
        ]
        if finish.finished:
            assert restart is None
            assert (finish.remaining, row.status, row.outcome) == (1, ChildStatus.FINISHED, "late")
        else:
            assert restart is not None and restart.attempt == 2
            assert (finish.remaining, row.status, row.outcome) == (2, ChildStatus.RUNNING, None)
            assert await sweeper.finish(row.child_execution_id, "real", attempt=2) == (True, 1)
        await first.claim("instance-1")
        assert (await first.finish(f"sibling-{round_}", None)).remaining == 0


# --- statements per operation ----------------------------------------------------------


async def test_each_operation_sends_the_fewest_statements(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    one_statement_claim = update_returning(sql)
    with statements(sql, transaction_control=False) as sent:
        await queue.enqueue(child("c-1"))
    # The child, and one more on its parent's count (and, where the database notifies, the
    # notification to idle claimers, sent at the commit).
    assert len(sent) == 2 + sql.capabilities.notifications
    with statements(sql, transaction_control=False) as sent:
        with pytest.raises(DuplicateChildError):
            await queue.enqueue(child("c-1"))
    assert len(sent) == 1
    with statements(sql, transaction_control=False) as sent:
        await queue.claim("instance-1")
    assert len(sent) == (1 if one_statement_claim else 2)
    with statements(sql, transaction_control=False) as sent:
        assert await queue.claim("instance-1") is None
    assert len(sent) == 1
    with statements(sql, transaction_control=False) as sent:
        await queue.restart("c-1", 1)
    assert len(sent) == (1 if one_statement_claim else 2)
    with statements(sql, transaction_control=False) as sent:
        assert await queue.restart("c-1", 1) is None
    assert len(sent) == 1
    with statements(sql, transaction_control=False) as sent:
        assert await queue.finish("c-1", None, attempt=2) == FinishResult(True, 0)
    # The child's row locked, one taken off its parent's count (one statement with UPDATE …
    # RETURNING, else a locking read and the update), the child finished; the finish that
    # sees none left also moves a waiting parent back to queued.
    counted = 1 if one_statement_claim else 2
    assert len(sent) == 3 + counted
    assert "FOR UPDATE" in sent[0].upper() or not row_locks(sql)
    with statements(sql, transaction_control=False) as sent:
        assert await queue.finish("c-1", None, attempt=2) == FinishResult(True, 0)
    # A retry of the attempt's finish answers from the child's row alone.
    assert len(sent) == 1
    with statements(sql, transaction_control=False) as sent:
        assert await queue.finish("c-1", None) == FinishResult(False, 0)
    # A refused finish reads the count it answers.
    assert len(sent) == 2
    await queue.enqueue(child("c-2"))
    await queue.enqueue(child("c-3"))
    c2, c3 = await queue.claim("instance-1"), await queue.claim("instance-1")
    assert c2 is not None and c3 is not None
    with statements(sql, transaction_control=False) as sent:
        assert (await queue.finish(c2.child_execution_id, None, attempt=1)).remaining == 1
    assert len(sent) == 2 + counted
    with statements(sql, transaction_control=False) as sent:
        await queue.enqueue(child("c-3/a", depth=2, parent=c3.child_execution_id))
    with statements(sql, transaction_control=False) as sent:
        assert await queue.wait_for_children(c3.child_execution_id, attempt=1) == WaitResult(
            True, 1
        )
    assert len(sent) == 3
    assert "FOR UPDATE" in sent[0].upper() or not row_locks(sql)
    with statements(sql, transaction_control=False) as sent:
        assert await queue.wait_for_children(c3.child_execution_id, attempt=1) == WaitResult(
            True, 1
        )
    assert len(sent) == 2
    with statements(sql, transaction_control=False) as sent:
        await queue.running(5)
        await queue.children(TENANT, "parent-1")
    assert len(sent) == 2
    with statements(sql, transaction_control=False) as sent:
        with pytest.raises(InvalidIdentifierError):
            await queue.wait_for_children("", attempt=1)
    assert sent == []


async def test_a_finish_sends_the_same_statements_with_3_or_300_siblings(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    """A finish locks its parent's count, not the siblings: what it sends (the first finish
    of the parent's children, a middle one, the last one, a refused one) does not depend on
    how many siblings there are."""
    queue = store(sql, clock)
    sent_with: dict[int, list[list[str]]] = {}
    for siblings in (3, 300):
        parent = f"fan-{siblings}"
        await enqueue_many(
            [queue], [child(f"{parent}-{i}", parent=parent) for i in range(siblings)]
        )
        claimed = [await queue.claim("instance-1") for _ in range(siblings)]
        attempts = {c.child_execution_id: c.attempt for c in claimed if c is not None}
        assert len(attempts) == siblings
        ids = sorted(attempts)
        sent_with[siblings] = []
        for child_id, expected in ((ids[0], siblings - 1), (ids[1], siblings - 2)):
            with statements(sql, transaction_control=False) as sent:
                done = await queue.finish(child_id, None, attempt=attempts[child_id])
            assert done == FinishResult(True, expected)
            sent_with[siblings].append(sent)
        with statements(sql, transaction_control=False) as sent:
            assert await queue.finish(ids[0], None) == FinishResult(False, siblings - 2)
        sent_with[siblings].append(sent)
        for child_id in ids[2:-1]:
            await queue.finish(child_id, None, attempt=attempts[child_id])
        with statements(sql, transaction_control=False) as sent:
            assert await queue.finish(ids[-1], None, attempt=attempts[ids[-1]]) == FinishResult(
                True, 0
            )
        sent_with[siblings].append(sent)
    assert [len(sent) for sent in sent_with[3]] == [len(sent) for sent in sent_with[300]]
    assert sent_with[3] == sent_with[300]


# --- arguments -------------------------------------------------------------------------


async def test_arguments_are_checked_before_any_statement(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    with statements(sql, transaction_control=False) as sent:
        with pytest.raises(InvalidIdentifierError):
            await queue.enqueue(child(""))
        with pytest.raises(InvalidIdentifierError):
            await queue.enqueue(child("x" * 256))
        with pytest.raises(InvalidIdentifierError):
            await queue.claim("")
        with pytest.raises(InvalidIdentifierError):
            await queue.finish("", None)
        with pytest.raises(InvalidIdentifierError):
            await queue.children(TENANT, "")
        with pytest.raises(TypeError):
            await queue.enqueue(child("c-1", payload={"bad": object()}))
        with pytest.raises(ValueError):
            await queue.enqueue(child("c-1", depth="deep"))  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await queue.restart("c-1", "1")  # type: ignore[arg-type]
    assert sent == []
    assert await queue.children(TENANT, "parent-1") == []


# --- real concurrency: several instances at once ---------------------------------------


class CheckThenWriteQueue(SqlChildExecutionQueueRepository):
    """BROKEN on purpose: reads the next queued child, then marks it claimed by id, in two
    statements with no lock and no compare. Two claimers can both take one child."""

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        queued = (
            sa.select(C.c.id, C.c.child_execution_id, C.c.attempt)
            .where(C.c.status == QUEUED)
            .order_by(C.c.depth.desc(), C.c.queued_at, C.c.id)
            .limit(1)
        )
        row = (await self.connection.execute(queued)).first()
        if row is None:
            return None
        await asyncio.sleep(0)  # the gap any await between the read and the write opens
        await self.connection.execute(
            sa.update(C)
            .where(C.c.id == sa.bindparam("id"))
            .values(status=RUNNING, claimed_by=sa.bindparam("by"), attempt=C.c.attempt + 1),
            {"id": row[0], "by": instance_id},
        )
        return ClaimedChild(TENANT, "root-1", "parent-1", row[1], 1, None, row[2] + 1, instance_id)


async def drain_with_workers(
    queues: Sequence[SqlChildExecutionQueueRepository], workers: int
) -> list[tuple[str, str]]:
    """`workers` claimers (spread over the instances) claim until the queue is empty; every
    (child, worker) claim they got."""

    async def worker(n: int) -> list[tuple[str, str]]:
        queue = queues[n % len(queues)]
        name = f"worker-{n}"
        got: list[tuple[str, str]] = []
        while (claimed := await queue.claim(name)) is not None:
            got.append((claimed.child_execution_id, name))
        return got

    results = await asyncio.gather(*(worker(n) for n in range(workers)))
    return [claim for got in results for claim in got]


@pytest.mark.slow
async def test_eight_workers_claim_two_thousand_children_each_exactly_once(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    queues = [store(sql, clock)] + [store(new_connection(), clock) for _ in range(3)]
    total = 2_000
    await enqueue_many(
        queues, [child(f"c-{i:04d}", depth=i % 4, parent=f"p-{i % 13}") for i in range(total)]
    )
    claims = await drain_with_workers(queues, workers=8)
    claimed_ids = [child_id for child_id, _ in claims]
    assert len(claimed_ids) == total, "a child was claimed twice or lost"
    assert set(claimed_ids) == {f"c-{i:04d}" for i in range(total)}
    assert len({worker for _, worker in claims}) > 1, "the workers did not run concurrently"
    assert await queues[0].claim("late") is None
    running = await queues[0].running(total + 1)
    assert len(running) == total
    by_worker = dict(claims)
    assert all(c.attempt == 1 and c.claimed_by == by_worker[c.child_execution_id] for c in running)


async def test_the_claim_race_catches_a_check_then_write_claim(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    """The broken twin, under the same race: some child is handed to two workers."""
    broken = [CheckThenWriteQueue(sql, clock, ApplicationContext("instance-1"))] + [
        CheckThenWriteQueue(new_connection(), clock, ApplicationContext(f"instance-{i}"))
        for i in range(2, 5)
    ]
    doubled = 0
    for round_ in range(5):
        await sql.execute(sa.delete(C))
        await enqueue_many(broken, [child(f"r{round_}-c-{i:03d}") for i in range(200)])
        claimed_ids = [child_id for child_id, _ in await drain_with_workers(broken, workers=8)]
        doubled += len(claimed_ids) - len(set(claimed_ids))
        if doubled:
            break
    assert doubled > 0, "the race never handed one child to two workers: it does not bite"


class CountOutsideTheLockQueue(SqlChildExecutionQueueRepository):
    """BROKEN on purpose: finishes the child, then counts the unfinished siblings in a
    second statement, outside any lock. Two finishers can both see none left."""

    async def finish(
        self, child_execution_id: str, outcome: Any, *, attempt: int | None = None
    ) -> FinishResult:
        moved = await self.connection.execute(
            sa.update(C)
            .where(C.c.child_execution_id == sa.bindparam("id"), C.c.status == RUNNING)
            .values(status="finished"),
            {"id": child_execution_id},
        )
        await asyncio.sleep(0)
        me = C.alias("me")
        left = await self.connection.execute(
            sa.select(sa.func.count())
            .select_from(C)
            .where(
                C.c.parent_execution_id
                == sa.select(me.c.parent_execution_id)
                .where(me.c.child_execution_id == sa.bindparam("id"))
                .scalar_subquery(),
                C.c.status != "finished",
            ),
            {"id": child_execution_id},
        )
        return FinishResult(moved.rowcount == 1, int(left.scalar() or 0))


async def finish_race(
    queues: Sequence[SqlChildExecutionQueueRepository], round_: int, children: int
) -> list[FinishResult]:
    """Queue `children` of one parent, claim them all, then finish them all at once through
    every instance, with duplicate finishes racing too."""
    parent = f"parent-{round_}"
    ids = [f"r{round_}-c-{i}" for i in range(children)]
    for child_id in ids:
        await queues[0].enqueue(child(child_id, parent=parent))
    claims = [await queues[0].claim("instance-1") for _ in ids]
    attempts = {c.child_execution_id: c.attempt for c in claims if c is not None}
    return await asyncio.gather(
        *(
            queues[i % len(queues)].finish(child_id, i, attempt=attempts[child_id])
            for i, child_id in enumerate(ids)
        ),
        *(queues[(i + 1) % len(queues)].finish(child_id, "dup") for i, child_id in enumerate(ids)),
    )


async def test_exactly_one_of_concurrent_finishers_of_a_parents_last_children_sees_zero(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    queues = [store(sql, clock)] + [store(new_connection(), clock) for _ in range(3)]
    for round_ in range(8):
        results = await finish_race(queues, round_, children=6)
        assert sum(r.finished for r in results) == 6
        assert [r for r in results if r.finished and r.remaining == 0] == [FinishResult(True, 0)]
        assert all(r.remaining >= 0 for r in results)
        listed = await queues[0].children(TENANT, f"parent-{round_}")
        assert all(c.status is ChildStatus.FINISHED for c in listed)


async def test_the_finish_race_catches_a_count_outside_the_lock(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    """The broken twin, under the same race: two finishers see none left (or none does)."""
    broken = [CountOutsideTheLockQueue(sql, clock, ApplicationContext("instance-1"))] + [
        CountOutsideTheLockQueue(new_connection(), clock, ApplicationContext(f"instance-{i}"))
        for i in range(2, 5)
    ]
    wrong_wakes = 0
    for round_ in range(20):
        results = await finish_race(broken, round_, children=6)
        wakes = [r for r in results if r.finished and r.remaining == 0]
        wrong_wakes += len(wakes) != 1
        if wrong_wakes:
            break
    assert wrong_wakes > 0, "the race never woke the parent twice (or never): it does not bite"


# --- a child waiting for its own children ------------------------------------------------


class CountOutsideTheLockWaitQueue(SqlChildExecutionQueueRepository):
    """BROKEN on purpose: counts the child's unfinished children in one statement, then
    moves it to waiting in a second, outside any lock. The last finish in between finds it
    running and wakes nothing: the child waits for good.

    With `finished` set, a count that saw unfinished children waits for that event (set
    by a racing finish once it committed) before it moves the child: the window made
    certain, so that the race's bite does not depend on a loaded machine's timing."""

    finished: asyncio.Event | None = None

    async def wait_for_children(self, child_execution_id: str, *, attempt: int) -> Any:
        left = await self.connection.execute(
            sa.select(sa.func.count()).where(
                C.c.parent_execution_id == sa.bindparam("id"), C.c.status != "finished"
            ),
            {"id": child_execution_id},
        )
        remaining = int(left.scalar() or 0)
        if remaining == 0:
            return WaitResult(False, 0)
        if self.finished is not None:
            # Nothing is locked here, so the racing finish cannot be blocked by this wait.
            await asyncio.wait_for(self.finished.wait(), 30)
        moved = await self.connection.execute(
            sa.update(C)
            .where(
                C.c.child_execution_id == sa.bindparam("id"),
                C.c.status == RUNNING,
                C.c.attempt == sa.bindparam("attempt"),
            )
            .values(status="waiting"),
            {"id": child_execution_id, "attempt": attempt},
        )
        return WaitResult(True, remaining) if moved.rowcount == 1 else None


class SignallingFinishQueue(SqlChildExecutionQueueRepository):
    """The queue, setting `finished` once a finish has committed."""

    finished: asyncio.Event

    async def finish(
        self, child_execution_id: str, outcome: Any, *, attempt: int | None = None
    ) -> FinishResult:
        try:
            return await super().finish(child_execution_id, outcome, attempt=attempt)
        finally:
            self.finished.set()


async def wait_race(queues: Sequence[SqlChildExecutionQueueRepository], round_: int) -> bool:
    """A child (with one running child of its own) goes to wait on one instance while its
    child finishes on another, at once (either started first). True when the wake was
    lost: the child waits though its last child finished."""
    mid_id, leaf_id = f"mid-{round_}", f"mid-{round_}/leaf"
    await queues[0].enqueue(child(mid_id, parent=f"parent-{round_}"))
    mid = await queues[0].claim("instance-1")
    assert mid is not None and mid.child_execution_id == mid_id
    await queues[1].enqueue(child(leaf_id, depth=2, parent=mid_id))
    leaf = await queues[1].claim("instance-2")
    assert leaf is not None and leaf.child_execution_id == leaf_id
    finish = queues[1].finish(leaf_id, "leaf", attempt=leaf.attempt)
    wait = queues[0].wait_for_children(mid_id, attempt=mid.attempt)
    if round_ % 2:
        finished, waited = await asyncio.gather(finish, wait)
    else:
        waited, finished = await asyncio.gather(wait, finish)
    assert finished == FinishResult(True, 0)
    assert waited is not None
    [row] = await queues[0].children(TENANT, f"parent-{round_}")
    # Tidy up: whatever the race left is run to its end, so the next round's claims are
    # its own.
    attempt = mid.attempt
    if row.status is ChildStatus.QUEUED:
        again = await queues[0].claim("instance-1")
        assert again is not None and again.child_execution_id == mid_id
        attempt = again.attempt
    lost = row.status is ChildStatus.WAITING
    if not lost:
        assert row.status is (ChildStatus.QUEUED if waited.waiting else ChildStatus.RUNNING)
        assert (await queues[0].finish(mid_id, "mid", attempt=attempt)).finished
    else:
        await queues[0].connection.execute(sa.delete(C).where(C.c.child_execution_id == mid_id))
    return lost


async def test_a_wait_raced_by_the_last_finish_never_loses_the_wake(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    queues = [store(sql, clock), store(new_connection(), clock, "instance-2")]
    lost = [round_ for round_ in range(30) if await wait_race(queues, round_)]
    assert lost == []


async def test_the_wait_race_catches_a_count_outside_the_lock(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    """The broken twin, under the same race: some child waits for a finished child (the
    twin's window held open until the racing finish committed)."""
    finished = asyncio.Event()
    waiter = CountOutsideTheLockWaitQueue(sql, clock, ApplicationContext("instance-1"))
    waiter.finished = finished
    finisher = SignallingFinishQueue(new_connection(), clock, ApplicationContext("instance-2"))
    finisher.finished = finished
    lost = 0
    for round_ in range(10):
        finished.clear()
        lost += await wait_race([waiter, finisher], round_)
        if lost:
            break
    assert lost > 0, "the race never lost a wake: it does not bite"


async def test_a_waiting_child_is_neither_claimed_nor_rescued_until_its_last_child_finishes(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    await queue.enqueue(child("mid"))
    mid = await queue.claim("instance-1")
    assert mid is not None
    await queue.enqueue(child("mid/a", depth=2, parent="mid"))
    a = await queue.claim("instance-1")
    assert a is not None and a.child_execution_id == "mid/a"
    assert await queue.wait_for_children("mid", attempt=mid.attempt) == WaitResult(True, 1)
    assert [c.child_execution_id for c in await queue.running(10)] == ["mid/a"]
    assert await queue.claim("instance-2") is None
    assert await queue.restart("mid", mid.attempt) is None
    assert await queue.finish("mid/a", "a", attempt=a.attempt) == FinishResult(True, 0)
    [row] = await queue.children(TENANT, "parent-1")
    assert (row.status, row.attempt) == (ChildStatus.QUEUED, mid.attempt)
    again = await queue.claim("instance-2")
    assert again is not None and (again.child_execution_id, again.attempt) == ("mid", 2)
