"""`ChildWorker`: children run once each across workers, the parent woken exactly once,
a dead worker's child rescued at the next epoch (docs/contracts.md)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from runtime_support import LEASE_MS, START, TENANT, Instance, World, settle

from agboss_sql.contracts import (
    CANCEL_REQUEST_KEY,
    ChildStatus,
    ClaimedChild,
    ExecutionLease,
    ExecutionLeaseLostError,
    JsonValue,
    LeaseEventKind,
    LeaseHolder,
    QueuedChild,
    VirtualClock,
)
from agboss_sql.memory import InMemoryChildExecutionQueueRepository
from agboss_sql.runtime import ChildWorker, current_keeper


class Children:
    """What the workers did: runs per child (with the worker and attempt), parent wakes."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, int]] = []
        self.wakes: list[tuple[str, str]] = []
        self.gate: asyncio.Event | None = None
        self.gated: set[str] | None = None
        """The workers that wait on `gate` (all of them when `None`)."""
        self.cancelled: list[str] = []
        self.fail: set[str] = set()

    def runner(self, worker: str):  # type: ignore[no-untyped-def]
        async def run_child(child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
            keeper = current_keeper()
            assert keeper is not None and keeper.lease == lease and keeper.trusted()
            assert lease.execution_id == child.child_execution_id
            self.runs.append((child.child_execution_id, worker, child.attempt))
            try:
                if self.gate is not None and (self.gated is None or worker in self.gated):
                    await self.gate.wait()
                for _ in range(3):  # let the other workers interleave
                    keeper.guard()
                    await asyncio.sleep(0)
            except asyncio.CancelledError:
                self.cancelled.append(child.child_execution_id)
                raise
            if child.child_execution_id in self.fail:
                raise ValueError(f"{child.child_execution_id} broke")
            return {"done": child.child_execution_id, "by": worker, "attempt": child.attempt}

        return run_child

    async def wake(self, tenant_id: str, parent_execution_id: str) -> None:
        self.wakes.append((tenant_id, parent_execution_id))


def worker_of(world: World, instance: Instance, children: Children) -> ChildWorker:
    return ChildWorker(
        instance.queue,
        instance.leases,
        instance.events,
        world.clock,
        run_child=children.runner(instance.name),
        wake_parent=children.wake,
        tree=instance.tree,
    )


async def enqueue(instance: Instance, count: int, parent: str = "parent") -> list[str]:
    ids = [f"child-{i}" for i in range(count)]
    for child_id in ids:
        await instance.queue.enqueue(
            QueuedChild(TENANT, "root", parent, child_id, depth=1, payload={"n": child_id})
        )
    return ids


async def test_three_workers_run_ten_children_once_each_and_wake_the_parent_once(
    world: World,
) -> None:
    instances = [world.instance(f"w{i}") for i in range(3)]
    children = Children()
    ids = await enqueue(instances[0], 10)
    workers = [worker_of(world, inst, children) for inst in instances]

    async def drain(worker: ChildWorker) -> int:
        ran = 0
        while await worker.run_once():
            ran += 1
        return ran

    counts = await asyncio.gather(*(drain(w) for w in workers))

    assert sum(counts) == 10
    assert Counter(child for child, _, _ in children.runs) == dict.fromkeys(ids, 1)
    assert len({worker for _, worker, _ in children.runs}) > 1  # the work was shared
    assert children.wakes == [(TENANT, "parent")]
    listed = await instances[0].queue.children("parent")
    assert {c.status for c in listed} == {ChildStatus.FINISHED}
    assert all(c.outcome["done"] == c.child_execution_id for c in listed)
    for child_id in ids:  # each child held its own lease, finished after its run
        kinds = [e.kind for e in await instances[0].events.list(TENANT, child_id)]
        assert kinds == [LeaseEventKind.ACQUIRED, LeaseEventKind.FINISHED]
    assert await workers[0].run_once() is False


async def test_a_dead_workers_child_is_rescued_at_the_next_epoch(world: World) -> None:
    w1, w2 = world.instance("w1"), world.instance("w2")
    children = Children()
    children.gate = asyncio.Event()
    children.gated = {"w1"}
    await enqueue(w1, 2)
    first, second = worker_of(world, w1, children), worker_of(world, w2, children)
    assert await second.run_once()  # oldest first: child-0
    assert children.runs == [("child-0", "w2", 1)]
    dying = asyncio.get_running_loop().create_task(first.run_once())
    await settle()
    assert children.runs[-1] == ("child-1", "w1", 1)
    dying.cancel()  # w1 dies mid-run: no release, no finish, no renewals
    await settle()
    assert children.wakes == []
    children.gate.set()

    assert await second.rescue_once() == 0  # w1's lease is still live
    await world.clock.advance(LEASE_MS)
    await settle()
    assert await second.rescue_once() == 1

    assert children.runs[-1] == ("child-1", "w2", 2)
    assert children.wakes == [(TENANT, "parent")]
    listed = {c.child_execution_id: c for c in await w1.queue.children("parent")}
    assert listed["child-1"].status is ChildStatus.FINISHED
    assert listed["child-1"].outcome == {"done": "child-1", "by": "w2", "attempt": 2}
    events = await w1.events.list(TENANT, "child-1")
    assert [(e.kind, e.instance_id, e.lease_epoch, e.taken_over_from) for e in events] == [
        (LeaseEventKind.ACQUIRED, "w1", 1, None),
        (LeaseEventKind.TAKEN_OVER, "w2", 2, LeaseHolder("w1", 1)),
        (LeaseEventKind.FINISHED, "w2", 2, None),
    ]
    # The superseded attempt's late finish changes nothing, and wakes nobody.
    late = await w1.queue.finish("child-1", {"late": True}, attempt=1)
    assert late.finished is False
    assert (await w1.queue.children("parent"))[1].outcome["by"] == "w2"


async def test_a_lost_lease_cancels_the_run_and_finishes_nothing(world: World) -> None:
    world.store_time = VirtualClock(START)
    w1, w2 = world.instance("w1"), world.instance("w2")
    children = Children()
    children.gate = asyncio.Event()
    await enqueue(w1, 1)
    running = asyncio.get_running_loop().create_task(worker_of(world, w1, children).run_once())
    await settle()
    assert children.runs == [("child-0", "w1", 1)]
    await world.store_time.advance(LEASE_MS)  # the store saw w1 silent past its lease
    assert await w2.leases.acquire(TENANT, "child-0", LEASE_MS) is not None
    await world.clock.advance(10_000)  # w1's renewal is refused
    await settle()

    assert running.done() and running.result() is True
    assert children.cancelled == ["child-0"]  # the run was stopped mid-call
    assert children.wakes == []
    (child,) = await w1.queue.children("parent")
    assert child.status is ChildStatus.RUNNING and child.attempt == 1  # left to the new holder
    kinds = [(e.kind, e.instance_id) for e in await w1.events.list(TENANT, "child-0")]
    assert kinds == [(LeaseEventKind.ACQUIRED, "w1"), (LeaseEventKind.LOST, "w1")]


async def test_a_child_that_raises_finishes_with_its_error(world: World) -> None:
    w1 = world.instance("w1")
    children = Children()
    children.fail = {"child-0"}
    await enqueue(w1, 1)
    assert await worker_of(world, w1, children).run_once()
    (child,) = await w1.queue.children("parent")
    assert child.status is ChildStatus.FINISHED
    assert child.outcome == {
        "error": {"type": "ValueError", "code": None, "message": "child-0 broke"}
    }
    assert children.wakes == [(TENANT, "parent")]


async def test_a_cancelled_tree_stops_its_child_and_finishes_it_cancelled(world: World) -> None:
    w1 = world.instance("w1")
    children = Children()
    children.gate = asyncio.Event()
    await enqueue(w1, 1)
    running = asyncio.get_running_loop().create_task(worker_of(world, w1, children).run_once())
    await settle()
    await w1.tree.save_if_absent(TENANT, "root", CANCEL_REQUEST_KEY, True)
    await world.clock.advance(10_000)  # the next renewal reads the request
    await settle()
    assert running.done()
    assert children.cancelled == ["child-0"]
    (child,) = await w1.queue.children("parent")
    assert child.status is ChildStatus.FINISHED
    assert child.outcome["error"]["code"] == "execution.cancelled"
    assert children.wakes == [(TENANT, "parent")]


async def test_a_run_that_finds_its_lease_lost_finishes_nothing(world: World) -> None:
    w1 = world.instance("w1")
    wakes: list[str] = []

    async def run_child(child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
        raise ExecutionLeaseLostError("fenced mid-step")

    async def wake(tenant_id: str, parent: str) -> None:
        wakes.append(parent)

    await enqueue(w1, 1)
    worker = ChildWorker(
        w1.queue, w1.leases, w1.events, world.clock, run_child=run_child, wake_parent=wake
    )
    assert await worker.run_once()
    (child,) = await w1.queue.children("parent")
    assert child.status is ChildStatus.RUNNING and wakes == []


async def test_the_worker_needs_an_instance_id(world: World) -> None:
    w1 = world.instance("w1")

    class Anonymous:
        pass

    async def run_child(child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
        return None

    async def wake(tenant_id: str, parent: str) -> None:
        return None

    with pytest.raises(TypeError, match="instance_id"):
        ChildWorker(
            Anonymous(),  # type: ignore[arg-type]
            w1.leases,
            w1.events,
            world.clock,
            run_child=run_child,
            wake_parent=wake,
        )
    worker = ChildWorker(
        w1.queue, w1.leases, w1.events, world.clock, run_child=run_child, wake_parent=wake
    )
    assert worker.instance_id == "w1"


async def test_start_runs_children_as_they_are_queued(world: World) -> None:
    w1 = world.instance("w1")
    children = Children()
    worker = worker_of(world, w1, children)
    worker.start(poll_ms=1_000)
    await settle()
    await enqueue(w1, 2)
    assert children.runs == []
    await world.clock.advance(1_000)
    await settle(200)
    assert [c for c, _, _ in children.runs] == ["child-0", "child-1"]
    assert children.wakes == [(TENANT, "parent")]
    await worker.stop()


async def test_a_superseded_runs_late_finish_wakes_nobody(world: World) -> None:
    world.store_time = VirtualClock(START)
    w1, w2 = world.instance("w1"), world.instance("w2")
    children = Children()
    children.gate = asyncio.Event()
    children.gated = {"w1"}
    await enqueue(w1, 1)
    slow = asyncio.get_running_loop().create_task(worker_of(world, w1, children).run_once())
    await settle()
    await world.store_time.advance(LEASE_MS)  # w1 looks dead to the store
    assert await worker_of(world, w2, children).rescue_once() == 1
    assert children.wakes == [(TENANT, "parent")]
    children.gate.set()  # w1 comes back before its next renewal and returns its outcome
    await settle()
    assert slow.done() and slow.result() is True
    assert children.runs == [("child-0", "w1", 1), ("child-0", "w2", 2)]
    assert children.wakes == [(TENANT, "parent")]  # the late finish counted for nothing
    (child,) = await w1.queue.children("parent")
    assert child.outcome["by"] == "w2"


async def test_a_run_that_returns_after_its_lease_was_lost_finishes_nothing(
    world: World,
) -> None:
    world.store_time = VirtualClock(START)
    w1, w2 = world.instance("w1"), world.instance("w2")

    async def run_child(child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
        await world.store_time.advance(LEASE_MS)  # type: ignore[union-attr]
        assert await w2.leases.acquire(TENANT, child.child_execution_id, LEASE_MS)
        keeper = current_keeper()
        assert keeper is not None
        try:
            assert await keeper.confirm_now() is False
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass  # a run that swallows its cancellation ...
        assert keeper.lost
        return {"done": True}  # ... and returns normally, though the lease is gone

    wakes: list[str] = []

    async def wake(tenant_id: str, parent: str) -> None:
        wakes.append(parent)

    await enqueue(w1, 1)
    worker = ChildWorker(
        w1.queue, w1.leases, w1.events, world.clock, run_child=run_child, wake_parent=wake
    )
    assert await worker.run_once()
    (child,) = await w1.queue.children("parent")
    assert child.status is ChildStatus.RUNNING and child.outcome is None and wakes == []


class FinishedMeanwhile(InMemoryChildExecutionQueueRepository):
    """A queue where the listed child is finished (by its first worker, at its attempt)
    between the rescuer's `running()` and its `restart`."""

    async def restart(self, child_execution_id: str, attempt: int) -> ClaimedChild | None:
        assert (await self.finish(child_execution_id, {"by": "w1"}, attempt=attempt)).finished
        return await super().restart(child_execution_id, attempt)


async def test_a_rescue_that_loses_the_restart_releases_the_lease_and_runs_nothing(
    world: World,
) -> None:
    w1, w2 = world.instance("w1"), world.instance("w2")
    await enqueue(w1, 1)
    claimed = await w1.queue.claim("w1")
    assert claimed is not None
    assert await w1.leases.acquire(TENANT, "child-0", 1_000)
    await world.clock.advance(1_000)
    children = Children()
    queue = FinishedMeanwhile(world.backend, world.clock, w2.queue.application)
    rescuer = ChildWorker(
        queue,
        w2.leases,
        w2.events,
        world.clock,
        run_child=children.runner("w2"),
        wake_parent=children.wake,
    )
    assert await rescuer.rescue_once() == 0
    assert children.runs == [] and children.wakes == []
    kinds = [(e.kind, e.instance_id) for e in await w2.events.list(TENANT, "child-0")]
    assert kinds == [(LeaseEventKind.TAKEN_OVER, "w2"), (LeaseEventKind.RELEASED, "w2")]
