"""`RecoverySweep`: a frozen instance's tree is taken over and resumed elsewhere; no more
trees than free slots; old pauses purged (docs/contracts.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from runtime_support import (
    LEASE_MS,
    START,
    TENANT,
    Instance,
    World,
    running_record,
    settle,
)

from agboss_sql.contracts import (
    ExecutionLease,
    ExecutionLeaseLostError,
    ExecutionRecord,
    LeaseEventKind,
    LeaseHolder,
    PausedExecution,
    PauseStatus,
)
from agboss_sql.runtime import DAY_MS, LeaseKeeper, RecoverySweep


class Resumed:
    """A `resume` callback that holds each lease with a keeper, as a runner would."""

    def __init__(self, world: World, instance: Instance) -> None:
        self.world = world
        self.instance = instance
        self.calls: list[tuple[str, ExecutionLease]] = []
        self.keepers: list[LeaseKeeper] = []

    async def __call__(self, record: ExecutionRecord, lease: ExecutionLease) -> None:
        self.calls.append((record.execution_id, lease))
        keeper = LeaseKeeper(self.instance.leases, self.instance.events, self.world.clock)
        assert await keeper.adopt(lease)
        self.keepers.append(keeper)

    @property
    def executions(self) -> list[str]:
        return [execution_id for execution_id, _ in self.calls]


def sweep_of(
    world: World,
    instance: Instance,
    resume: Resumed,
    free: Callable[[], int] = lambda: 32,
    **kw: int,
) -> RecoverySweep:
    return RecoverySweep(
        instance.records,
        instance.leases,
        instance.events,
        instance.pauses,
        world.clock,
        resume=resume,
        free_slots=free,
        **kw,
    )


async def test_a_frozen_instances_tree_is_taken_over_and_resumed_by_another(
    world: World,
) -> None:
    a, b = world.instance("a"), world.instance("b")
    await a.records.save(running_record("tree-1"))
    a_keeper = LeaseKeeper(a.leases, a.events, world.clock)
    assert await a_keeper.take(TENANT, "tree-1") is not None
    a_keeper.start()
    resumed = Resumed(world, b)
    sweep = sweep_of(world, b, resumed)

    assert await sweep.run_once() == []  # live on A: skipped
    assert resumed.calls == []

    await a_keeper.stop()  # A freezes: no renewal, no release
    await world.clock.advance(LEASE_MS - 1)
    assert await sweep.run_once() == []  # live until the last ms
    await world.clock.advance(1)
    claimed = await sweep.run_once()

    assert [(c.holder_instance_id, c.lease_epoch) for c in claimed] == [("b", 2)]
    assert claimed[0].taken_over_from == LeaseHolder("a", 1)
    assert resumed.executions == ["tree-1"] and resumed.calls[0][1] == claimed[0]
    assert resumed.keepers[0].trusted()
    events = await b.events.list(TENANT, "tree-1")
    assert [(e.kind, e.instance_id, e.lease_epoch, e.taken_over_from) for e in events] == [
        (LeaseEventKind.ACQUIRED, "a", 1, None),
        (LeaseEventKind.TAKEN_OVER, "b", 2, LeaseHolder("a", 1)),
    ]
    # A wakes up: its next renewal is refused and it fences itself.
    assert await a_keeper.confirm_now() is False
    assert isinstance(a_keeper.signal.reason, ExecutionLeaseLostError)
    # A second pass finds the tree live on B.
    assert await sweep.run_once() == []
    assert resumed.executions == ["tree-1"]


async def test_the_sweep_claims_no_more_trees_than_free_slots(world: World) -> None:
    a, b = world.instance("a"), world.instance("b")
    for i in range(5):
        await a.records.save(running_record(f"tree-{i}", at=START + i))
        assert await a.leases.acquire(TENANT, f"tree-{i}", LEASE_MS) is not None
    await world.clock.advance(LEASE_MS)  # A died holding all five
    free = [2]
    resumed = Resumed(world, b)
    sweep = sweep_of(world, b, resumed, lambda: free[0])

    assert len(await sweep.run_once()) == 2
    assert resumed.executions == ["tree-0", "tree-1"]
    free[0] = 0
    assert await sweep.run_once() == []
    free[0] = 10
    assert len(await sweep.run_once()) == 3
    assert sorted(resumed.executions) == [f"tree-{i}" for i in range(5)]


async def test_live_trees_do_not_hide_an_orphan_behind_them(world: World) -> None:
    a, b, c = world.instance("a"), world.instance("b"), world.instance("c")
    for i in range(3):  # older records, live on A
        await a.records.save(running_record(f"live-{i}", at=START + i))
        await a.leases.acquire(TENANT, f"live-{i}", LEASE_MS)
    await c.records.save(running_record("orphan", at=START + 10))
    await c.leases.acquire(TENANT, "orphan", 1_000)
    await world.clock.advance(1_000)  # C died
    resumed = Resumed(world, b)
    sweep = sweep_of(world, b, resumed, lambda: 1)
    claimed = await sweep.run_once()
    assert [lease.execution_id for lease in claimed] == ["orphan"]


async def test_only_roots_are_claimed_and_finished_trees_never(world: World) -> None:
    a, b = world.instance("a"), world.instance("b")
    await a.records.save(running_record("child-1", root="tree-1"))
    await a.records.save(running_record("done"))
    lease = await a.leases.acquire(TENANT, "done", LEASE_MS)
    assert lease is not None and await a.leases.finish(lease)
    await a.records.save(running_record("never-leased"))  # died before its first take
    resumed = Resumed(world, b)
    claimed = await sweep_of(world, b, resumed).run_once()
    assert resumed.executions == ["never-leased"]
    assert claimed[0].lease_epoch == 1 and claimed[0].taken_over_from is None
    events = await b.events.list(TENANT, "never-leased")
    assert [e.kind for e in events] == [LeaseEventKind.ACQUIRED]


async def test_a_failed_resume_releases_the_lease_for_the_next_pass(world: World) -> None:
    b = world.instance("b")
    await b.records.save(running_record("tree-1"))

    async def broken(record: ExecutionRecord, lease: ExecutionLease) -> None:
        raise RuntimeError("no checkpoint loader")

    sweep = RecoverySweep(
        b.records, b.leases, b.events, None, world.clock, resume=broken, free_slots=lambda: 4
    )
    assert await sweep.run_once() == []
    events = await b.events.list(TENANT, "tree-1")
    assert [e.kind for e in events] == [LeaseEventKind.ACQUIRED, LeaseEventKind.RELEASED]
    assert "no checkpoint loader" in (events[1].reason or "")
    # Released: the next pass (here or elsewhere) can take it at once.
    resumed = Resumed(world, b)
    assert [c.lease_epoch for c in await sweep_of(world, b, resumed).run_once()] == [2]


def pause(pause_id: str, status: PauseStatus) -> PausedExecution:
    return PausedExecution(
        tenant_id=TENANT,
        pause_id=pause_id,
        execution_id="tree-1",
        root_execution_id="tree-1",
        thread_id=None,
        status=status,
        request={"ask": pause_id},
        decision=None,
        created_at=START,
    )


async def test_the_sweep_purges_taken_and_cancelled_pauses_older_than_the_retention(
    world: World,
) -> None:
    b = world.instance("b")
    for pause_id, status in (
        ("taken", PauseStatus.TAKEN),
        ("cancelled", PauseStatus.CANCELLED),
        ("pending", PauseStatus.PENDING),
    ):
        await b.pauses.save(pause(pause_id, status))
    sweep = sweep_of(world, b, Resumed(world, b), pause_retention_ms=DAY_MS)
    await world.clock.advance(DAY_MS)
    await sweep.run_once()
    assert await b.pauses.get(TENANT, "taken") is not None  # exactly 24 h old: kept
    await world.clock.advance(1)
    await sweep.run_once()
    assert await b.pauses.get(TENANT, "taken") is None
    assert await b.pauses.get(TENANT, "cancelled") is None
    assert await b.pauses.get(TENANT, "pending") is not None


async def test_start_runs_a_pass_at_once_and_then_every_interval(world: World) -> None:
    b = world.instance("b")
    passes: list[int] = []

    def free() -> int:
        passes.append(world.clock.now())
        return 1

    sweep = sweep_of(world, b, Resumed(world, b), free, every_ms=30_000)
    sweep.start()
    await settle()
    assert passes == [START]
    for _ in range(4):
        await world.clock.advance(15_000)
        await settle()
    assert passes == [START, START + 30_000, START + 60_000]
    await sweep.stop()
    await world.clock.advance(60_000)
    await settle()
    assert passes == [START, START + 30_000, START + 60_000]


async def test_a_failing_pass_does_not_stop_the_sweep(world: World) -> None:
    b = world.instance("b")
    calls: list[int] = []

    def free() -> int:
        calls.append(world.clock.now())
        raise RuntimeError("slot counter broke")

    sweep = sweep_of(world, b, Resumed(world, b), free, every_ms=1_000)
    sweep.start()
    await settle()
    await world.clock.advance(1_000)
    await settle()
    assert calls == [START, START + 1_000]
    await sweep.stop()


@pytest.mark.parametrize("value", [0, -1, True])
def test_sweep_settings_must_be_positive(world: World, value: int) -> None:
    b = world.instance("b")
    with pytest.raises(ValueError):
        sweep_of(world, b, Resumed(world, b), every_ms=value)
