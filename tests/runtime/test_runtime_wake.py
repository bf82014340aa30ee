"""The parent's wake survives lost replies and dead workers: `ChildWorker` retries the
idempotent finish and wake calls, the queue guards the wake by compare-and-set, and the
wake sweep (`wake_once`) wakes a parent whose finisher never did — exactly once, in memory
and on the database under test.

Lost replies are simulated by a queue wrapper that lets the call commit and then raises
`CommitOutcomeUnknownError`, as a connection does when the answer to COMMIT never comes.
Each guarantee is also run against a broken queue (a non-idempotent finish, a wake claim
without compare-and-set) to show the check catches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import pytest
from runtime_support import START, TENANT, RecordingLeases, World, settle

from agboss_sql.contracts import (
    ApplicationContext,
    ChildExecution,
    ChildExecutionQueueRepository,
    ChildStatus,
    ClaimedChild,
    CommitOutcomeUnknownError,
    ExecutionLease,
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    FinishResult,
    JsonValue,
    LeaseEventKind,
    QueuedChild,
    StoreClock,
    StoreUnavailableError,
    VirtualClock,
    WaitResult,
)
from agboss_sql.lab.database import truncate_all
from agboss_sql.runtime import ChildWorker
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository

PARENT = "parent"
CLAIM_MS = 10_000


class LossyQueue(ChildExecutionQueueRepository):
    """A queue whose replies can be lost: a call named in `lose` commits and then raises
    `CommitOutcomeUnknownError`, once per (method, child) unless `always`; a call named in
    `down` raises `StoreUnavailableError` before reaching the store (nothing applied)."""

    def __init__(
        self,
        inner: ChildExecutionQueueRepository,
        *,
        lose: Sequence[str] = (),
        down: Sequence[str] = (),
        always: bool = False,
    ) -> None:
        self.inner = inner
        self.lose = set(lose)
        self.down = set(down)
        self.always = always
        self.lost: list[tuple[str, str]] = []

    async def _reply(self, method: str, child_id: str, result: object) -> None:
        if method in self.lose and (self.always or (method, child_id) not in self.lost):
            self.lost.append((method, child_id))
            raise CommitOutcomeUnknownError(f"the reply to {method}({child_id}) was lost")

    def _reach(self, method: str) -> None:
        if method in self.down:
            raise StoreUnavailableError(f"{method}: the store is unreachable")

    async def ping(self) -> None:
        await self.inner.ping()

    async def enqueue(self, child: QueuedChild) -> None:
        await self.inner.enqueue(child)

    async def enqueue_many(self, children: Sequence[QueuedChild]) -> Sequence[str]:
        return await self.inner.enqueue_many(children)

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        return await self.inner.claim(instance_id)

    async def claim_many(self, instance_id: str, n: int) -> Sequence[ClaimedChild]:
        return await self.inner.claim_many(instance_id, n)

    async def running(self, limit: int) -> Sequence[ChildExecution]:
        return await self.inner.running(limit)

    async def restart(self, child_execution_id: str, attempt: int) -> ClaimedChild | None:
        return await self.inner.restart(child_execution_id, attempt)

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> FinishResult:
        self._reach("finish")
        result = await self.inner.finish(child_execution_id, outcome, attempt=attempt)
        await self._reply("finish", child_execution_id, result)
        return result

    async def wait_for_children(
        self, child_execution_id: str, *, attempt: int
    ) -> WaitResult | None:
        self._reach("wait_for_children")
        result = await self.inner.wait_for_children(child_execution_id, attempt=attempt)
        await self._reply("wait_for_children", child_execution_id, result)
        return result

    async def children(self, tenant_id: str, parent_execution_id: str) -> Sequence[ChildExecution]:
        return await self.inner.children(tenant_id, parent_execution_id)

    async def unwoken(self, limit: int) -> Sequence[ChildExecution]:
        return await self.inner.unwoken(limit)

    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        self._reach("claim_wake")
        result = await self.inner.claim_wake(child_execution_id, claimer, claim_ms)
        await self._reply("claim_wake", child_execution_id, result)
        return result

    async def mark_woken(self, child_execution_id: str, claimer: str) -> bool:
        self._reach("mark_woken")
        result = await self.inner.mark_woken(child_execution_id, claimer)
        await self._reply("mark_woken", child_execution_id, result)
        return result


class ForgetfulFinish(LossyQueue):
    """Broken: answers a retried finish `finished=False`, as the queue did before a finish
    was idempotent per attempt."""

    def __init__(self, inner: ChildExecutionQueueRepository, **kw: object) -> None:
        super().__init__(inner, **kw)  # type: ignore[arg-type]
        self.finished: set[str] = set()

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> FinishResult:
        result = await self.inner.finish(child_execution_id, outcome, attempt=attempt)
        again = child_execution_id in self.finished
        self.finished.add(child_execution_id)
        await self._reply("finish", child_execution_id, result)
        return FinishResult(False, result.remaining) if again else result


class ClaimWakeBlindly(LossyQueue):
    """Broken: reads whether the wake is owed, then claims it whatever happened meanwhile
    (no compare-and-set). `between` holds each claimer between its read and its write until
    the others have read too (the race, made certain)."""

    def __init__(self, inner: ChildExecutionQueueRepository, between: asyncio.Barrier) -> None:
        super().__init__(inner)
        self.between = between

    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        owed = [c.child_execution_id for c in await self.inner.unwoken(1_000)]
        await self.between.wait()
        await self.inner.claim_wake(child_execution_id, claimer, claim_ms)
        return child_execution_id in owed


@dataclass
class Node:
    """One instance's stores (the queue as built, unwrapped)."""

    name: str
    queue: ChildExecutionQueueRepository
    leases: ExecutionLeaseRepository
    events: ExecutionLeaseEventRepository


@dataclass
class Cluster:
    clock: VirtualClock
    node: Callable[[str], Node]


@pytest.fixture(params=["memory", pytest.param("sql", marks=pytest.mark.database)])
async def cluster(
    request: pytest.FixtureRequest,
) -> AsyncIterator[Cluster]:
    """Instances on one backend and one application clock: in memory, or each with its own
    connection to the database under test (leases on the database's time)."""
    if request.param == "memory":
        world = World()

        def memory_node(name: str) -> Node:
            instance = world.instance(name, RecordingLeases)
            return Node(name, instance.queue, instance.leases, instance.events)

        yield Cluster(world.clock, memory_node)
        return
    url: str = request.getfixturevalue("sql_url")
    clock = VirtualClock(START)
    connections: list[SqlConnection] = []

    def sql_node(name: str) -> Node:
        connection = SqlConnection(url)
        connections.append(connection)
        app = ApplicationContext(instance_id=name)
        return Node(
            name,
            SqlChildExecutionQueueRepository(connection, clock, app),
            SqlExecutionLeaseRepository(connection, StoreClock(), app),
            SqlExecutionLeaseEventRepository(connection, clock, app),
        )

    cleaner = SqlConnection(url)
    try:
        await truncate_all(cleaner)
    finally:
        await cleaner.close()
    try:
        yield Cluster(clock, sql_node)
    finally:
        for connection in connections:
            await connection.close()


class Wakes:
    """The parents woken, in order; `fail` makes the next calls raise instead."""

    def __init__(self) -> None:
        self.woken: list[str] = []
        self.calls = 0
        self.fail = 0

    async def wake(self, tenant_id: str, parent_execution_id: str) -> None:
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the parent could not be woken")
        assert tenant_id == TENANT
        self.woken.append(parent_execution_id)


async def _done(child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
    return {"done": child.child_execution_id}


def worker(
    cluster: Cluster,
    node: Node,
    wakes: Wakes,
    queue: ChildExecutionQueueRepository | None = None,
    **kw: int,
) -> ChildWorker:
    return ChildWorker(
        queue or node.queue,
        node.leases,
        node.events,
        cluster.clock,
        run_child=_done,
        wake_parent=wakes.wake,
        instance_id=node.name,
        wake_claim_ms=CLAIM_MS,
        **kw,
    )


async def enqueue(node: Node, count: int) -> list[str]:
    ids = [f"child-{i}" for i in range(count)]
    for child_id in ids:
        await node.queue.enqueue(QueuedChild(TENANT, "root", PARENT, child_id, 1))
    return ids


async def all_finished(node: Node) -> bool:
    return all(c.status is ChildStatus.FINISHED for c in await node.queue.children(TENANT, PARENT))


async def run_with_lost_replies(cluster: Cluster, lossy: type[LossyQueue]) -> Wakes:
    """Two children run by one worker; every finish, wake claim and wake mark loses its
    first reply. The parents woken."""
    node = cluster.node("w1")
    await enqueue(node, 2)
    wakes = Wakes()
    queue = lossy(node.queue, lose=("finish", "claim_wake", "mark_woken"))
    w = worker(cluster, node, wakes, queue)
    assert await w.run_once() and await w.run_once()
    assert not await w.run_once()
    assert await all_finished(node)
    assert ("finish", "child-1") in queue.lost
    return wakes


async def test_lost_replies_of_finish_and_wake_still_wake_the_parent_once(
    cluster: Cluster,
) -> None:
    wakes = await run_with_lost_replies(cluster, LossyQueue)

    assert wakes.woken == [PARENT]
    node = cluster.node("check")
    assert list(await node.queue.unwoken(10)) == []
    for child_id in ("child-0", "child-1"):  # each child's lease finished, once
        kinds = [e.kind for e in await node.events.list(TENANT, child_id)]
        assert kinds == [LeaseEventKind.ACQUIRED, LeaseEventKind.FINISHED]
    sweeper = worker(cluster, cluster.node("w2"), wakes)
    assert await sweeper.wake_once() == 0
    assert wakes.woken == [PARENT]


async def test_a_finish_that_forgets_its_retry_loses_the_wake(cluster: Cluster) -> None:
    """The check above bites: with a finish that answers its own retry `finished=False`,
    the last child's worker never wakes the parent."""
    wakes = await run_with_lost_replies(cluster, ForgetfulFinish)

    assert wakes.woken == []


async def test_a_worker_dead_between_finish_and_wake_is_covered_by_one_sweep_wake(
    cluster: Cluster,
) -> None:
    """The last child is finished and its worker dies before the wake: two instances' wake
    sweeps race, and the parent is woken once."""
    w1, w2, w3 = cluster.node("w1"), cluster.node("w2"), cluster.node("w3")
    await enqueue(w1, 1)
    claimed = await w1.queue.claim("w1")
    assert claimed is not None
    finished = await w1.queue.finish("child-0", "done", attempt=claimed.attempt)
    assert finished == FinishResult(True, 0)  # ... and the worker died here.
    wakes = Wakes()
    sweepers = [worker(cluster, w2, wakes), worker(cluster, w3, wakes)]

    woken = await asyncio.gather(*(s.wake_once() for s in sweepers))

    assert sorted(woken) == [0, 1]
    assert wakes.woken == [PARENT]
    assert [await s.wake_once() for s in sweepers] == [0, 0]
    assert wakes.woken == [PARENT]


async def test_a_wake_claim_without_compare_and_set_wakes_twice(cluster: Cluster) -> None:
    """The check above bites: two sweepers on a queue that gives the wake to every claimer
    both wake the parent."""
    w1, w2, w3 = cluster.node("w1"), cluster.node("w2"), cluster.node("w3")
    await enqueue(w1, 1)
    claimed = await w1.queue.claim("w1")
    assert claimed is not None
    assert (await w1.queue.finish("child-0", "done", attempt=claimed.attempt)).remaining == 0
    wakes = Wakes()
    between = asyncio.Barrier(2)
    sweepers = [
        worker(cluster, w2, wakes, ClaimWakeBlindly(w2.queue, between)),
        worker(cluster, w3, wakes, ClaimWakeBlindly(w3.queue, between)),
    ]

    await asyncio.gather(*(s.wake_once() for s in sweepers))

    assert wakes.woken == [PARENT, PARENT]


async def test_a_wake_claimed_by_a_dead_worker_is_swept_once_its_claim_runs_out(
    cluster: Cluster,
) -> None:
    w1, w2 = cluster.node("w1"), cluster.node("w2")
    await enqueue(w1, 1)
    claimed = await w1.queue.claim("w1")
    assert claimed is not None
    await w1.queue.finish("child-0", "done", attempt=claimed.attempt)
    assert await w1.queue.claim_wake("child-0", "w1/dead", CLAIM_MS)  # ... then it died.
    wakes = Wakes()
    sweeper = worker(cluster, w2, wakes)

    assert await sweeper.wake_once() == 0
    await cluster.clock.advance(CLAIM_MS - 1)
    assert await sweeper.wake_once() == 0
    await cluster.clock.advance(1)
    assert await sweeper.wake_once() == 1
    assert wakes.woken == [PARENT]
    assert not await w1.queue.mark_woken("child-0", "w1/dead")  # its late mark is refused


async def test_a_failed_wake_is_retried_by_the_sweep_and_counted_once(cluster: Cluster) -> None:
    node = cluster.node("w1")
    await enqueue(node, 1)
    wakes = Wakes()
    wakes.fail = 1
    w = worker(cluster, node, wakes)

    with pytest.raises(RuntimeError, match="could not be woken"):
        await w.run_once()

    assert wakes.woken == [] and await all_finished(node)
    assert await w.wake_once() == 0  # its claim is still live
    await cluster.clock.advance(CLAIM_MS)
    wakes.fail = 1
    assert await w.wake_once() == 0  # the sweep's wake fails too: reported, left for later
    await cluster.clock.advance(CLAIM_MS)
    assert await w.wake_once() == 1
    assert wakes.woken == [PARENT] and wakes.calls == 3


async def test_a_finish_that_never_answers_stops_the_keeper_and_the_sweep_wakes(
    cluster: Cluster,
) -> None:
    """Every reply to the finish is lost: the worker gives up after its retries, stops
    renewing the child's lease, and the sweep wakes the parent (the finish had committed)."""
    node = cluster.node("w1")
    await enqueue(node, 1)
    wakes = Wakes()
    queue = LossyQueue(node.queue, lose=("finish",), always=True)
    w = worker(cluster, node, wakes, queue, store_retries=2)

    with pytest.raises(CommitOutcomeUnknownError):
        await w.run_once()

    assert [m for m, _ in queue.lost] == ["finish"] * 3  # the first try and two retries
    if isinstance(node.leases, RecordingLeases):
        before = len(node.leases.renewals)
        await cluster.clock.advance(60_000)
        assert len(node.leases.renewals) == before  # nothing renews the lease any more
    assert wakes.woken == []
    assert await w.wake_once() == 1
    assert wakes.woken == [PARENT]


SHORT_LEASE_MS = 400
RESCUE_DEADLINE_S = 5.0
"""How long the SQL variant waits (real time) for a 400 ms lease to run out on the
database's clock: ample on a loaded machine, and the test fails rather than hangs."""


async def test_a_finish_that_cannot_reach_the_store_leaves_the_child_to_the_rescue(
    cluster: Cluster,
) -> None:
    """The finish never reaches the store: the child stays running; once its lease runs out
    a rescue on another instance runs it again, finishes it and wakes the parent once."""
    w1, w2 = cluster.node("w1"), cluster.node("w2")
    await enqueue(w1, 1)
    wakes = Wakes()
    first = ChildWorker(
        LossyQueue(w1.queue, down=("finish",)),
        w1.leases,
        w1.events,
        cluster.clock,
        run_child=_done,
        wake_parent=wakes.wake,
        instance_id="w1",
        lease_ms=SHORT_LEASE_MS,
        trust_margin_ms=100,
        store_retries=1,
    )

    with pytest.raises(StoreUnavailableError):
        await first.run_once()

    [child] = await w1.queue.children(TENANT, PARENT)
    assert child.status is ChildStatus.RUNNING and wakes.woken == []
    rescuer = worker(cluster, w2, wakes)
    if isinstance(w1.leases, RecordingLeases):
        assert await rescuer.rescue_once() == 0  # the lease is still live
        await cluster.clock.advance(SHORT_LEASE_MS)
        assert await rescuer.rescue_once() == 1
    else:
        # The lease runs out on the database's own time: retry the rescue until it does.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESCUE_DEADLINE_S
        while await rescuer.rescue_once() == 0:
            assert loop.time() < deadline, "the dead worker's lease never ran out"
            await asyncio.sleep(0.05)
    assert wakes.woken == [PARENT]
    assert await rescuer.wake_once() == 0
    [child] = await w1.queue.children(TENANT, PARENT)
    assert child.status is ChildStatus.FINISHED and child.attempt == 2


async def test_the_worker_loop_runs_the_wake_sweep(world: World) -> None:
    """`start()` sweeps wakes with the rescue: an owed wake left by a dead finisher is done
    at the loop's first pass, once."""
    node = world.instance("w1")
    await node.queue.enqueue(QueuedChild(TENANT, "root", PARENT, "child-0", 1))
    claimed = await node.queue.claim("w1")
    assert claimed is not None
    await node.queue.finish("child-0", "done", attempt=claimed.attempt)
    wakes = Wakes()
    w = ChildWorker(
        node.queue,
        node.leases,
        node.events,
        world.clock,
        run_child=_done,
        wake_parent=wakes.wake,
    )

    w.start(poll_ms=1_000, rescue_every_ms=30_000)
    try:
        await settle()
        assert wakes.woken == [PARENT]
        await world.clock.advance(30_000)
        await settle()
        assert wakes.woken == [PARENT]
    finally:
        await w.stop()
