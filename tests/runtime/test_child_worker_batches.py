"""`ChildWorker` with batches and wake-ups: `start_many` claims several children in one step,
each run under its own lease at its own attempt; an idle worker polls adaptively (often while
busy, seldom when idle) and, where the queue notifies, claims a child queued elsewhere long
before its poll would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest_asyncio
from runtime_support import TENANT, World, settle
from support.capabilities import require, sessions_kept

from agboss_sql.contracts import (
    ApplicationContext,
    ChildFinish,
    ChildStatus,
    ClaimedChild,
    ExecutionLease,
    FinishResult,
    JsonValue,
    QueuedChild,
    StoreClock,
    SystemClock,
    VirtualClock,
)
from agboss_sql.contracts.errors import CommitOutcomeUnknownError
from agboss_sql.contracts.stores import QueueWakeups
from agboss_sql.memory import InMemoryChildExecutionQueueRepository
from agboss_sql.runtime import ChildWorker
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository


def _child(child_id: str, parent: str = "parent") -> QueuedChild:
    return QueuedChild(TENANT, "root", parent, child_id, 1, {"id": child_id})


class SleepLog(VirtualClock):
    """A virtual clock that notes every sleep asked of it."""

    def __init__(self, start: int) -> None:
        super().__init__(start)
        self.naps: list[int] = []

    async def sleep(self, ms: int) -> None:
        self.naps.append(ms)
        await super().sleep(ms)


async def test_start_many_runs_each_claimed_child_under_its_own_lease_and_attempt() -> None:
    world = World()
    inst = world.instance("instance-1")
    await inst.queue.enqueue_many([_child(f"c-{i}") for i in range(5)])
    runs: list[tuple[str, str, int]] = []
    wakes: list[str] = []

    async def run_child(child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
        runs.append((child.child_execution_id, lease.execution_id, child.attempt))
        return {"done": child.child_execution_id}

    async def wake_parent(_tenant: str, parent: str) -> None:
        wakes.append(parent)

    worker = ChildWorker(
        inst.queue,
        inst.leases,
        inst.events,
        world.clock,
        run_child=run_child,
        wake_parent=wake_parent,
    )
    started = await worker.start_many(3)
    assert [c.child_execution_id for c, _ in started] == ["c-0", "c-1", "c-2"]
    await asyncio.gather(*(task for _, task in started if task is not None))
    assert sorted(runs) == [(f"c-{i}", f"c-{i}", 1) for i in range(3)]
    assert wakes == []
    rest = await worker.start_many(10)
    assert [c.child_execution_id for c, _ in rest] == ["c-3", "c-4"]
    await asyncio.gather(*(task for _, task in rest if task is not None))
    assert await worker.start_many(10) == []
    statuses = {c.child_execution_id: c.status for c in await inst.queue.children(TENANT, "parent")}
    assert set(statuses.values()) == {ChildStatus.FINISHED}
    assert wakes == ["parent"], "the parent is woken once, by its last child's finisher"
    await worker.stop()


async def test_an_idle_worker_polls_ever_less_often_and_often_again_once_busy() -> None:
    """With nothing queued the naps double from `poll_ms / 16` up to `poll_ms`; a claim
    brings them back to the shortest (a queue that was busy is likely busy again)."""
    clock = SleepLog(1_000_000)
    world = World(clock=clock)
    inst = world.instance("instance-1")
    ran: list[str] = []

    async def run_child(child: ClaimedChild, _lease: ExecutionLease) -> JsonValue:
        ran.append(child.child_execution_id)
        return None

    async def wake_parent(_tenant: str, _parent: str) -> None:
        pass

    worker = ChildWorker(
        inst.queue,
        inst.leases,
        inst.events,
        clock,
        run_child=run_child,
        wake_parent=wake_parent,
    )
    worker.start(poll_ms=1_600, rescue_every_ms=10_000_000)
    try:
        await settle()
        for _ in range(6):
            await clock.advance(clock.naps[-1])
            await settle()
        assert clock.naps[:7] == [100, 200, 400, 800, 1_600, 1_600, 1_600]
        before = len(clock.naps)
        await inst.queue.enqueue(_child("late"))
        await clock.advance(1_600)
        await settle()
        assert ran == ["late"]
        assert 100 in clock.naps[before:], "a worker that found work polls at its shortest again"
    finally:
        await worker.stop()


# --- on a database that notifies -------------------------------------------------------


class Watched(QueueWakeups):
    """A listener that says when it listens (its connection open, `LISTEN` sent)."""

    def __init__(self, inner: QueueWakeups) -> None:
        self.inner = inner
        self.listening = asyncio.Event()

    async def wait(self, timeout_ms: int) -> bool:
        if not self.listening.is_set():
            told = await self.inner.wait(1)  # opens its connection and listens
            self.listening.set()
            if told:
                return True
        return await self.inner.wait(timeout_ms)

    async def close(self) -> None:
        await self.inner.close()


class WatchedQueue(SqlChildExecutionQueueRepository):
    watched: Watched | None = None

    def wakeups(self) -> Watched | None:
        inner = super().wakeups()
        if inner is None:
            return None
        self.watched = Watched(inner)
        return self.watched


@pytest_asyncio.fixture
async def two(sql: SqlConnection, sql_url: str) -> AsyncIterator[Sequence[SqlConnection]]:
    other = SqlConnection(sql_url)
    yield sql, other
    await other.close()


async def test_an_idle_worker_told_of_a_child_queued_elsewhere_claims_it_before_its_poll(
    two: Sequence[SqlConnection],
) -> None:
    """A worker whose poll is a minute (its shortest nap too) claims a child another
    connection queued after it went idle, within this test's 10 s bound: only the
    database's notification, not its poll, can wake it that soon."""
    mine, theirs = two
    require(mine.capabilities.notifications, "notifications (LISTEN/NOTIFY)")
    require(sessions_kept(mine), "session kept to LISTEN on (a pooler lends its sessions)")
    clock = SystemClock()
    queue = WatchedQueue(mine, clock, ApplicationContext("worker-1"))
    enqueuer = SqlChildExecutionQueueRepository(theirs, clock, ApplicationContext("api"))
    leases = SqlExecutionLeaseRepository(mine, StoreClock(), ApplicationContext("worker-1"))
    events = SqlExecutionLeaseEventRepository(mine, StoreClock(), ApplicationContext("worker-1"))
    claimed = asyncio.Event()

    async def run_child(child: ClaimedChild, _lease: ExecutionLease) -> JsonValue:
        claimed.set()
        return None

    async def wake_parent(_tenant: str, _parent: str) -> None:
        pass

    worker = ChildWorker(queue, leases, events, clock, run_child=run_child, wake_parent=wake_parent)
    worker.start(poll_ms=16 * 60_000, rescue_every_ms=3_600_000)
    try:
        async with asyncio.timeout(10):
            while queue.watched is None:
                await asyncio.sleep(0.01)
            await queue.watched.listening.wait()
        assert worker.listening
        await enqueuer.enqueue(_child("queued-elsewhere"))
        async with asyncio.timeout(10):
            await claimed.wait()
    finally:
        await worker.stop()


class CountedFinishes(InMemoryChildExecutionQueueRepository):
    """The in-memory queue, noting each batch of finishes it was sent."""

    batches: list[list[str]]

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        self.batches.append([f.child_execution_id for f in finishes])
        return await super().finish_many(finishes)


async def test_runs_that_end_together_finish_in_one_batch_and_wake_the_parent_once() -> None:
    """Six runs that end at once: the first finish goes alone, the ones that came while it
    was in flight go as one `finish_many`; every child finishes once, the parent is woken
    once. A run whose outcome cannot be stored fails alone, its batch mates finish."""
    world = World()
    inst = world.instance("instance-1")
    queue = CountedFinishes(world.backend, world.clock, inst.queue.application)
    queue.batches = []
    await queue.enqueue_many([_child(f"c-{i}") for i in range(7)])
    all_started = asyncio.Event()
    started: list[str] = []
    wakes: list[str] = []

    async def run_child(child: ClaimedChild, _lease: ExecutionLease) -> JsonValue:
        started.append(child.child_execution_id)
        if len(started) == 7:
            all_started.set()
        await all_started.wait()  # all end in one turn of the loop
        if child.child_execution_id == "c-3":
            return {"not json": {1, 2}}  # type: ignore[dict-item]
        return {"done": child.child_execution_id}

    async def wake_parent(_tenant: str, parent: str) -> None:
        wakes.append(parent)

    worker = ChildWorker(
        queue, inst.leases, inst.events, world.clock, run_child=run_child, wake_parent=wake_parent
    )
    runs = await worker.start_many(7)
    await asyncio.gather(*(task for _, task in runs if task is not None))
    batched = [name for batch in queue.batches for name in batch]
    assert queue.batches and all(len(batch) >= 2 for batch in queue.batches)
    assert "c-3" not in batched, "an outcome that cannot be stored never joins a batch"
    assert len(batched) == len(set(batched)) >= 5
    statuses = {c.child_execution_id: c.status for c in await queue.children(TENANT, "parent")}
    assert statuses.pop("c-3") is ChildStatus.RUNNING  # left to the rescue
    assert set(statuses.values()) == {ChildStatus.FINISHED}
    assert wakes == [], "c-3 is unfinished: nobody saw none left"
    assert worker._finishes.batches == len(queue.batches)
    await worker.stop()


class LosesTheFirstReply(CountedFinishes):
    """Applies the first batch of finishes, then loses its reply (the outcome unknown)."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        answers = await super().finish_many(finishes)
        if len(self.batches) == 1:
            raise CommitOutcomeUnknownError("the reply of the commit was lost")
        return answers


async def test_a_batch_whose_reply_was_lost_is_sent_again_and_answered_as_the_first() -> None:
    """The batch applied but its reply lost: the worker sends it again (idempotent per
    attempt), each retried entry answers as its committed finish did, so the parent is
    woken once, by the finisher its batch told none was left."""
    world = World()
    inst = world.instance("instance-1")
    queue = LosesTheFirstReply(world.backend, world.clock, inst.queue.application)
    queue.batches = []
    await queue.enqueue_many([_child(f"c-{i}") for i in range(4)])
    ends = asyncio.Event()
    started: list[str] = []
    wakes: list[str] = []

    async def run_child(child: ClaimedChild, _lease: ExecutionLease) -> JsonValue:
        started.append(child.child_execution_id)
        if len(started) == 4:
            ends.set()
        await ends.wait()
        return None

    async def wake_parent(_tenant: str, parent: str) -> None:
        wakes.append(parent)

    worker = ChildWorker(
        queue, inst.leases, inst.events, world.clock, run_child=run_child, wake_parent=wake_parent
    )
    runs = await worker.start_many(4)
    await asyncio.gather(*(task for _, task in runs if task is not None))
    assert len(queue.batches) == 2 and queue.batches[0] == queue.batches[1], queue.batches
    statuses = {c.child_execution_id: c.status for c in await queue.children(TENANT, "parent")}
    assert set(statuses.values()) == {ChildStatus.FINISHED}
    assert wakes == ["parent"]
    await worker.stop()
