"""The runtime on the database under test, in real time with short leases: a takeover by
another instance's sweep, self-fencing before anyone can take over, and children on three
connections. Each instance has its own `SqlConnection`; lease expiry is database time."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest

from agboss_sql.contracts import (
    ApplicationContext,
    ClaimedChild,
    ExecutionLease,
    ExecutionLeaseLostError,
    ExecutionRecord,
    ExecutionRecordStatus,
    JsonValue,
    LeaseEventKind,
    LeaseHolder,
    QueuedChild,
    StoreClock,
    SystemClock,
)
from agboss_sql.runtime import ChildWorker, LeaseKeeper, RecoverySweep
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository
from agboss_sql.sql.records import SqlExecutionRecordRepository

pytestmark = pytest.mark.database

TENANT = "tenant-1"
CLOCK = SystemClock()
# Long enough that a loaded 2-core machine's stalls (a slow round trip, a late wake-up of
# the event loop) stay well inside the slack between two renewals and the trust window:
# trusted for 2 s of each 3 s lease, renewed every second, so a live holder survives a
# stall of about a second.
LEASE_MS = 3_000
MARGIN_MS = 1_000
DEADLINE_S = 20.0


class Node:
    """One instance: its connection and its stores."""

    def __init__(self, connection: SqlConnection, name: str) -> None:
        app = ApplicationContext(instance_id=name)
        self.name = name
        self.leases = SqlExecutionLeaseRepository(connection, StoreClock(), app)
        self.events = SqlExecutionLeaseEventRepository(connection, CLOCK, app)
        self.records = SqlExecutionRecordRepository(connection, CLOCK, app)
        self.queue = SqlChildExecutionQueueRepository(connection, CLOCK, app)

    def keeper(self, leases: SqlExecutionLeaseRepository | None = None) -> LeaseKeeper:
        return LeaseKeeper(
            leases or self.leases,
            self.events,
            CLOCK,
            lease_ms=LEASE_MS,
            trust_margin_ms=MARGIN_MS,
        )


class HangingRenewals(SqlExecutionLeaseRepository):
    """The SQL lease store, except that renewals are never answered (the holder's network
    stalls); takes still reach the database."""

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")


def record(execution_id: str) -> ExecutionRecord:
    now = CLOCK.now()
    return ExecutionRecord(
        TENANT, execution_id, execution_id, None, None, "flow", None,
        ExecutionRecordStatus.RUNNING, now, now,
    )  # fmt: skip


async def test_a_frozen_holders_tree_is_taken_over_by_another_instances_sweep(
    new_connection: Callable[[], SqlConnection],
) -> None:
    a, b = Node(new_connection(), "a"), Node(new_connection(), "b")
    await a.records.save(record("tree-1"))
    a_keeper = a.keeper()
    assert await a_keeper.take(TENANT, "tree-1") is not None
    a_keeper.start()
    resumed: list[LeaseKeeper] = []

    async def resume(rec: ExecutionRecord, lease: ExecutionLease) -> None:
        keeper = b.keeper()
        assert await keeper.adopt(lease)
        resumed.append(keeper)

    sweep = RecoverySweep(
        b.records, b.leases, b.events, None, CLOCK,
        resume=resume, free_slots=lambda: 4, lease_ms=LEASE_MS,
    )  # fmt: skip

    # Renewed in the background well past one lease: B's sweeps find it live.
    started = CLOCK.monotonic()
    while CLOCK.monotonic() - started < LEASE_MS * 3 // 2:
        await asyncio.sleep(0.25)
        assert await sweep.run_once() == []
        assert a_keeper.trusted()

    await a_keeper.stop()  # A freezes
    frozen_at = CLOCK.monotonic()
    claimed: list[ExecutionLease] = []
    while not claimed:
        assert CLOCK.monotonic() - frozen_at < DEADLINE_S * 1000
        await asyncio.sleep(0.05)
        claimed = await sweep.run_once()

    (lease,) = claimed
    assert (lease.holder_instance_id, lease.lease_epoch) == ("b", 2)
    assert lease.taken_over_from == LeaseHolder("a", 1)
    assert resumed[0].trusted()
    # A wakes up: its renewal is refused, it aborts and logs the loss.
    assert await a_keeper.confirm_now() is False
    reason = a_keeper.signal.reason
    assert isinstance(reason, ExecutionLeaseLostError) and reason.code == "execution.lease-lost"
    events = await a.events.list(TENANT, "tree-1")
    assert [(e.kind, e.instance_id, e.lease_epoch, e.taken_over_from) for e in events] == [
        (LeaseEventKind.ACQUIRED, "a", 1, None),
        (LeaseEventKind.TAKEN_OVER, "b", 2, LeaseHolder("a", 1)),
        (LeaseEventKind.LOST, "a", 1, None),
    ]
    await resumed[0].finish()


async def test_a_holder_whose_renewals_stall_fences_itself_before_anyone_can_take_over(
    new_connection: Callable[[], SqlConnection],
) -> None:
    connection_a = new_connection()
    a, b = Node(connection_a, "a"), Node(new_connection(), "b")
    stalled = HangingRenewals(connection_a, StoreClock(), ApplicationContext("a"))
    a_keeper = a.keeper(stalled)
    sent = CLOCK.monotonic()
    lease = await a_keeper.take(TENANT, "tree-1")
    assert lease is not None
    assert a_keeper.trusted_until == sent + lease.remaining_ms - MARGIN_MS
    a_keeper.start()
    aborted_at: list[int] = []

    async def watch() -> None:
        await a_keeper.signal.wait()
        aborted_at.append(CLOCK.monotonic())

    watcher = asyncio.get_running_loop().create_task(watch())
    b_keeper = b.keeper()
    while True:
        assert CLOCK.monotonic() - sent < DEADLINE_S * 1000
        b_sent = CLOCK.monotonic()
        taken = await b_keeper.take(TENANT, "tree-1")
        if taken is not None:
            break
        await asyncio.sleep(0.01)
    await watcher

    # A stopped trusting its lease before B even sent the take that got it.
    assert aborted_at and aborted_at[0] < b_sent
    # ...and before its lease could have ended by its own clock (the margin is the slack a
    # late wake-up of the watcher may use; the bound is the promise, not a timing figure).
    assert aborted_at[0] - sent < lease.remaining_ms
    assert isinstance(a_keeper.signal.reason, ExecutionLeaseLostError)
    assert taken.taken_over_from == LeaseHolder("a", 1)
    events = await b.events.list(TENANT, "tree-1")
    assert [(e.kind, e.instance_id, e.lease_epoch) for e in events] == [
        (LeaseEventKind.ACQUIRED, "a", 1),
        (LeaseEventKind.LOST, "a", 1),
        (LeaseEventKind.TAKEN_OVER, "b", 2),
    ]
    assert "trust window" in (events[1].reason or "")
    await b_keeper.release()


async def test_children_on_three_connections_run_once_each_and_wake_the_parent_once(
    new_connection: Callable[[], SqlConnection],
) -> None:
    nodes = [Node(new_connection(), f"w{i}") for i in range(3)]
    ids = [f"child-{i}" for i in range(9)]
    for child_id in ids:
        await nodes[0].queue.enqueue(QueuedChild(TENANT, "root", "parent", child_id, 1, {}))
    runs: list[tuple[str, str]] = []
    wakes: list[str] = []

    def runner(name: str):  # type: ignore[no-untyped-def]
        async def run_child(child: ClaimedChild, lease: ExecutionLease) -> JsonValue:
            runs.append((child.child_execution_id, name))
            await asyncio.sleep(0.01)
            return {"by": name}

        return run_child

    async def wake(tenant_id: str, parent: str) -> None:
        wakes.append(parent)

    async def drain(node: Node) -> None:
        worker = ChildWorker(
            node.queue, node.leases, node.events, CLOCK,
            run_child=runner(node.name), wake_parent=wake, lease_ms=3_000,
        )  # fmt: skip
        while await worker.run_once():
            pass

    await asyncio.gather(*(drain(node) for node in nodes))
    assert Counter(child for child, _ in runs) == dict.fromkeys(ids, 1)
    assert wakes == ["parent"]
    ran_by = dict(runs)
    for child in await nodes[0].queue.children(TENANT, "parent"):
        assert child.outcome == {"by": ran_by[child.child_execution_id]}
    for child_id in ids:
        kinds = [e.kind for e in await nodes[1].events.list(TENANT, child_id)]
        assert kinds == [LeaseEventKind.ACQUIRED, LeaseEventKind.FINISHED]
