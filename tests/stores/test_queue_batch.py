"""The SQL child queue's batches on the database under test: `claim_many`, `enqueue_many`
and `finish_many` (what they send, SKIP LOCKED, concurrent batches across connections)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from support.capabilities import require, sessions_kept, skip_locked, update_returning
from support.sql import statements

from agboss_sql.contracts import (
    ApplicationContext,
    ChildFinish,
    FinishResult,
    QueuedChild,
    VirtualClock,
)
from agboss_sql.contracts.errors import InvalidValueError
from agboss_sql.sql._queue_batch import chunks
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.queue import QUEUED, QueueStatements, SqlChildExecutionQueueRepository
from agboss_sql.sql.schema import child_executions

pytestmark = pytest.mark.database

START = 1_700_000_000_000
C = child_executions
NewConnection = Callable[[], SqlConnection]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


def store(
    connection: SqlConnection, clock: VirtualClock, instance: str = "instance-1"
) -> SqlChildExecutionQueueRepository:
    return SqlChildExecutionQueueRepository(connection, clock, ApplicationContext(instance))


def child(child_id: str, depth: int = 1, parent: str = "parent-1") -> QueuedChild:
    return QueuedChild("tenant-1", "root-1", parent, child_id, depth, {"id": child_id})


def test_a_batch_is_sent_in_a_few_sizes() -> None:
    assert chunks(0) == []
    assert chunks(1) == [1]
    assert chunks(5) == [4, 1]
    assert chunks(300) == [128, 128, 32, 8, 4]
    assert all(sum(chunks(n)) == n for n in range(0, 1_000))
    assert {size for n in range(1_000) for size in chunks(n)} == {1, 2, 4, 8, 16, 32, 64, 128}


async def test_a_batch_claim_is_one_statement_or_one_locking_read_and_one_update(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    await queue.enqueue_many([child(f"c-{i}") for i in range(5)])
    with statements(sql, transaction_control=False) as sent:
        got = await queue.claim_many("instance-1", 3)
    assert [c.child_execution_id for c in got] == ["c-0", "c-1", "c-2"]
    assert len(sent) == (1 if update_returning(sql) else 2)
    with statements(sql, transaction_control=False) as sent:
        got = await queue.claim_many("instance-1", 100)
    assert [(c.child_execution_id, c.attempt) for c in got] == [("c-3", 1), ("c-4", 1)]
    with statements(sql, transaction_control=False) as sent:
        assert list(await queue.claim_many("instance-1", 100)) == []
    assert len(sent) == 1
    with statements(sql, transaction_control=False) as sent:
        assert list(await queue.claim_many("instance-1", 0)) == []
    assert sent == []


async def test_a_batch_claim_answers_ties_in_queue_order_whatever_order_the_rows_come_in(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    """Children of one depth queued at one time are answered in queue order, whatever order
    the database hands the claimed rows back in. A parent queued again after its children
    finished keeps its place (its row id) but, on PostgreSQL, its row's new version lies
    after the rows queued since; with the table's statistics (`ANALYZE`, as a database in
    service has them) PostgreSQL's batch claim joins the picked ids by hash over a scan
    of the table and returns the rows in that physical order, so the answer's order is the
    store's own sort. Without statistics it walks the queue's index, in queue order already:
    no case on a fresh database tells the two apart."""
    queue = store(sql, clock)
    await queue.enqueue(child("p"))
    parent = await queue.claim("instance-1")
    assert parent is not None
    await queue.enqueue(child("p/k", 2, parent="p"))
    assert await queue.wait_for_children("p", attempt=parent.attempt) is not None
    await queue.enqueue_many([child(f"q-{i}") for i in range(3)])
    kid = await queue.claim("instance-1")
    assert kid is not None and kid.child_execution_id == "p/k"
    assert (await queue.finish("p/k", None, attempt=kid.attempt)).finished
    analyze = {"mysql": "ANALYZE TABLE {}", "mariadb": "ANALYZE TABLE {}"}
    template = analyze.get(sql.dialect_name, "ANALYZE {}")
    await sql.execute(sa.text(template.format(C.name)))
    got = await queue.claim_many("instance-1", 3)
    assert [c.child_execution_id for c in got] == ["p", "q-0", "q-1"]


async def test_a_batch_enqueue_sends_its_sizes_and_one_count_per_parent(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    queue = store(sql, clock)
    batch = [child(f"c-{i:03d}", parent=f"p-{i % 2}") for i in range(300)]
    with statements(sql, transaction_control=False) as sent:
        queued = await queue.enqueue_many(batch)
    assert list(queued) == [c.child_execution_id for c in batch]
    # Five inserts (128, 128, 32, 8, 4 rows) and a count per parent; MySQL/MariaDB lock the
    # batch's ids first (128, 128, 44); PostgreSQL sends arrays: one insert, one count.
    arrays = sql.prepared(QueueStatements).batch.arrays  # the store's choice, not a name
    inserts, counts = (1, 1) if arrays else (5, 2)
    reads = 0 if sql.capabilities.insert_returning and not _raises(sql) else 3
    notify = 1 if sql.capabilities.notifications else 0
    assert len(sent) == reads + inserts + counts + notify
    with statements(sql, transaction_control=False) as sent:
        assert list(await queue.enqueue_many([])) == []
        with pytest.raises(InvalidValueError):
            await queue.enqueue_many([child("x"), child("x", parent="p-9")])
    assert sent == []
    assert await queue.children("tenant-1", "p-9") == []


def _raises(sql: SqlConnection) -> bool:
    return sql.capabilities.insert_if_absent_raises


async def test_a_batch_claim_in_flight_hides_only_the_children_it_holds(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    """Rows another claimer holds are skipped, not waited for: the batch takes the next."""
    require(skip_locked(sql), "SKIP LOCKED")
    queue = store(sql, clock)
    await queue.enqueue_many([child(f"c-{i:02d}", depth=i % 3) for i in range(30)])
    lock_first_two = (
        sa.select(C.c.child_execution_id)
        .where(C.c.status == QUEUED)
        .order_by(C.c.depth.desc(), C.c.queued_at, C.c.id)
        .limit(2)
        .with_for_update(skip_locked=True)
    )
    async with sql.transaction() as in_flight:
        held = list((await in_flight.execute(lock_first_two)).scalars())
        assert held == ["c-02", "c-05"]
        got = await queue.claim_many("instance-2", 3)
        assert [c.child_execution_id for c in got] == ["c-08", "c-11", "c-14"]


async def test_workers_batch_claiming_across_connections_claim_each_child_once(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    queues = [store(sql, clock)] + [store(new_connection(), clock, f"i-{n}") for n in range(3)]
    total = 400
    await asyncio.gather(
        *(
            queues[q].enqueue_many(
                [child(f"c-{i:03d}", i % 3, f"p-{i % 7}") for i in range(q, total, 4)]
            )
            for q in range(4)
        )
    )

    async def worker(n: int) -> list[str]:
        got: list[str] = []
        while batch := await queues[n % 4].claim_many(f"w-{n}", 1 + n % 8):
            got.extend(c.child_execution_id for c in batch)
        return got

    claimed = [c for got in await asyncio.gather(*(worker(n) for n in range(8))) for c in got]
    assert len(claimed) == total, "a child was claimed twice or lost"
    assert set(claimed) == {f"c-{i:03d}" for i in range(total)}
    running = await queues[0].running(total + 1)
    assert len(running) == total and all(c.attempt == 1 for c in running)


async def test_concurrent_batches_across_connections_queue_and_count_each_id_once(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    queues = [store(sql, clock)] + [store(new_connection(), clock, f"i-{n}") for n in range(3)]
    ids = [f"c-{i:03d}" for i in range(120)]
    # Eight batches, each overlapping the next by half.
    batches = [ids[start : start + 30] for start in range(0, 91, 15)]
    answers = await asyncio.gather(
        *(queues[b % 4].enqueue_many([child(i) for i in batch]) for b, batch in enumerate(batches))
    )
    answered = sorted(i for got in answers for i in got)
    assert answered == ids, "an id was answered by two batches, or by none"
    claimed = await queues[0].claim_many("instance-1", 1_000)
    assert len(claimed) == len(ids)
    last = [
        (await queues[0].finish(c.child_execution_id, None, attempt=c.attempt)).remaining
        for c in claimed
    ]
    assert last == list(range(len(ids) - 1, -1, -1)), "the parent's count is off"


# --- wake-ups --------------------------------------------------------------------------


async def test_a_listener_hears_children_queued_and_requeued_on_other_connections(
    sql: SqlConnection, new_connection: NewConnection, clock: VirtualClock
) -> None:
    """Where the database notifies, an idle claimer's listener is told of a child queued
    (one by one or in a batch) or of a waiting parent made claimable again, from another
    connection, long before its 60 s wait would end (the test's 10 s bound on each wait is
    only a bound: the notification comes at the other's commit). Elsewhere, and behind a
    transaction pooler (no session stays to LISTEN on), there is none."""
    queue = store(sql, clock)
    wakeups = queue.wakeups()
    if not (sql.capabilities.notifications and sessions_kept(sql)):
        assert wakeups is None
        return
    assert wakeups is not None
    other = store(new_connection(), clock, "instance-2")
    try:
        assert await wakeups.wait(1) is False  # listening from here on; nothing queued yet

        async def told_after(act: Callable[[], Any]) -> bool:
            # Hints already received (this test's own enqueues) are taken first.
            while await wakeups.wait(20):
                pass
            waiting = asyncio.create_task(wakeups.wait(60_000))
            await act()
            return await asyncio.wait_for(waiting, 10)

        assert await told_after(lambda: other.enqueue(child("mid")))
        assert await told_after(lambda: other.enqueue_many([child("b"), child("c")]))
        mid = await queue.claim("instance-1")
        assert mid is not None and mid.child_execution_id == "mid"
        await queue.enqueue(child("mid/x", 2, parent="mid"))
        x = await queue.claim("instance-1")
        assert x is not None and x.child_execution_id == "mid/x"
        waited = await queue.wait_for_children("mid", attempt=mid.attempt)
        assert waited is not None and waited.waiting
        assert await told_after(lambda: other.finish("mid/x", None, attempt=x.attempt))
    finally:
        await wakeups.close()


async def test_a_batch_finish_sends_a_fixed_few_statements_in_one_transaction(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    """Ten children finished in one `finish_many`: on PostgreSQL two statements whatever
    the number of children or parents (arrays), on SQLite three (JSON documents: the
    locking read, the counts, the children); on MySQL/MariaDB four (the locking read, the
    counts' locking read and update, the children's update, each of a `JSON_TABLE`). The
    parent emptied by the second batch, waiting for nothing, wakes no row (one statement
    more)."""
    queue = store(sql, clock)
    await queue.enqueue_many([child(f"c-{i:02d}") for i in range(12)])
    claimed = list(await queue.claim_many("instance-1", 12))
    first = [ChildFinish(c.child_execution_id, c.attempt) for c in claimed[:10]]
    with statements(sql, transaction_control=False) as sent:
        got = await queue.finish_many(first)
    assert [r.remaining for r in got] == list(range(11, 1, -1))
    shape = sql.prepared(QueueStatements).finish_many
    fixed = 2 if shape.arrays else 3 if shape.documents else 4
    assert len(sent) == fixed, sent
    rest = [ChildFinish(c.child_execution_id, c.attempt, "last") for c in claimed[10:]]
    with statements(sql, transaction_control=False) as sent:
        got = await queue.finish_many(rest)
    assert list(got) == [FinishResult(True, 1), FinishResult(True, 0)]
    assert len(sent) == fixed + 1  # + the waiting parent's wake
    with statements(sql, transaction_control=False) as sent:
        assert list(await queue.finish_many(first[:3])) == [
            FinishResult(True, n) for n in (11, 10, 9)
        ]
    assert len(sent) == 1, "a retried batch is answered from the children's rows alone"


async def test_a_batch_finish_of_a_parent_per_child_is_as_few_statements(
    sql: SqlConnection, clock: VirtualClock
) -> None:
    """Ten children of ten waiting parents finished in one `finish_many`: the statements of
    a batch of one parent and one wake of every emptied parent (on PostgreSQL also its
    notification), not a statement per parent; each parent is claimable again, each child
    answered none left."""
    queue = store(sql, clock)
    await queue.enqueue_many([child(f"p-{i}") for i in range(10)])
    parents = list(await queue.claim_many("instance-1", 10))
    await queue.enqueue_many([child(f"p-{i}/c", 2, parent=f"p-{i}") for i in range(10)])
    for parent in parents:
        waited = await queue.wait_for_children(parent.child_execution_id, attempt=parent.attempt)
        assert waited is not None and waited.waiting
    children = list(await queue.claim_many("instance-1", 10))
    assert {c.parent_execution_id for c in children} == {f"p-{i}" for i in range(10)}
    batch = [ChildFinish(c.child_execution_id, c.attempt) for c in children]
    with statements(sql, transaction_control=False) as sent:
        got = await queue.finish_many(batch)
    assert list(got) == [FinishResult(True, 0)] * 10
    shape = sql.prepared(QueueStatements).finish_many
    fixed = 2 if shape.arrays else 3 if shape.documents else 4
    assert len(sent) == fixed + 1 + (1 if shape.arrays else 0), sent
    again = list(await queue.claim_many("instance-2", 20))
    assert sorted(c.child_execution_id for c in again) == sorted(f"p-{i}" for i in range(10))
