"""The in-memory backend, the lease log, and what every in-memory store declares."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from memory_cluster import LEASE_MS, START, TENANT, Cluster

from agboss_sql.contracts import (
    CONTRACTS,
    ApplicationContext,
    ExecutionLeaseEvent,
    FencingStore,
    InvalidIdentifierError,
    LeaseCheck,
    LeaseEventKind,
    LeaseHolder,
    QueuedChild,
    StoreClock,
    VirtualClock,
)
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryExecutionLeaseEventRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryTransaction,
    memory_stores,
)

# every store


def test_memory_stores_lists_one_store_per_contract_in_contract_order() -> None:
    stores = memory_stores()
    assert len(stores) == len(CONTRACTS) == 12
    for store, contract in zip(stores, CONTRACTS.values(), strict=True):
        assert issubclass(store, contract)
        assert not inspect.isabstract(store)
        assert store.backend == "in-memory"
        assert store.__doc__


def test_fencing_stores_pair_with_the_in_memory_lease_store() -> None:
    fencing = [store for store in memory_stores() if issubclass(store, FencingStore)]
    assert len(fencing) == 2
    for store in fencing:
        assert store.lease_repository is InMemoryExecutionLeaseRepository
        assert store.lease_check is LeaseCheck.ATOMIC
        assert store.lease_repository.backend == store.backend


@pytest.mark.parametrize("store", memory_stores(), ids=lambda s: s.__name__)
async def test_every_store_builds_from_the_uniform_constructor_and_pings(
    cluster: Cluster, store: type
) -> None:
    built = cluster.store(store, 1)
    assert built.backend == "in-memory"
    assert built.memory is cluster.backend
    assert await asyncio.wait_for(built.ping(), timeout=2) is None


def test_the_package_imports_with_the_base_install_alone() -> None:
    root = Path(__file__).resolve().parents[3]
    probe = (
        "import sys, agboss_sql.memory as m; "
        "assert len(m.memory_stores()) == 12; "
        "assert not any(name.split('.')[0] in {'langgraph', 'psycopg', 'aiomysql', 'pytest'} "
        "for name in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=root)


# the backend


async def test_instances_share_one_backend_and_reset_clears_it(cluster: Cluster) -> None:
    lease = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await cluster.leases(1).save_execution_id_if_absent(TENANT, "tree-1")
    await cluster.queue(1).enqueue(QueuedChild(TENANT, "r", "p", "c", 1))
    await cluster.trees(1).save_if_absent(TENANT, "r", "k", 1)
    cluster.backend.business_rows.append("row")
    cluster.backend.reset()
    backend = cluster.backend
    assert not (backend.leases or backend.execution_ids or backend.children or backend.trees)
    assert backend.business_rows == []
    assert await cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS) is not None


def test_a_backend_is_built_outside_a_loop_and_serves_in_several() -> None:
    backend = InMemoryBackend()
    app = ApplicationContext("instance-1")

    async def acquire(execution: str) -> bool:
        leases = InMemoryExecutionLeaseRepository(backend, StoreClock(VirtualClock(START)), app)
        return await leases.acquire(TENANT, execution, LEASE_MS) is not None

    assert asyncio.run(acquire("tree-1"))
    assert asyncio.run(acquire("tree-2"))


async def test_atomic_serialises_its_steps() -> None:
    backend = InMemoryBackend()
    inside = 0
    most = 0

    async def step() -> None:
        nonlocal inside, most
        async with backend.atomic():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0)
            inside -= 1

    await asyncio.gather(*(step() for _ in range(10)))
    assert most == 1


async def test_atomic_is_not_reentrant_and_says_so() -> None:
    backend = InMemoryBackend()
    async with backend.atomic():
        with pytest.raises(RuntimeError, match="lock the effect holds"):
            async with backend.atomic():
                pass
    async with backend.atomic():
        pass


def test_a_transaction_commits_its_rows_once() -> None:
    backend = InMemoryBackend()
    tx = InMemoryTransaction(backend)
    tx.insert({"a": 1})
    tx._commit()
    assert backend.business_rows == [{"a": 1}]
    with pytest.raises(RuntimeError):
        tx._commit()
    rolled_back = InMemoryTransaction(backend)
    rolled_back.insert("b")
    rolled_back._rollback()
    assert rolled_back.rows == ()
    assert backend.business_rows == [{"a": 1}]


# the lease log


def event(
    execution: str, kind: LeaseEventKind, at: int, epoch: int = 1, tenant: str = TENANT
) -> ExecutionLeaseEvent:
    return ExecutionLeaseEvent(tenant, execution, "instance-1", epoch, kind, at)


async def test_the_lease_log_reads_events_back_exactly_as_saved_in_save_order(
    cluster: Cluster,
) -> None:
    log = InMemoryExecutionLeaseEventRepository(cluster.backend)
    other = InMemoryExecutionLeaseEventRepository(
        cluster.backend, cluster.store_clock, cluster.application(2)
    )
    saved = [
        event("tree-1", LeaseEventKind.ACQUIRED, 10),
        ExecutionLeaseEvent(
            TENANT,
            "tree-1",
            "instance-2",
            2,
            LeaseEventKind.TAKEN_OVER,
            5,
            taken_over_from=LeaseHolder("instance-1", 1),
            reason="expired while frozen",
        ),
        event("tree-1", LeaseEventKind.SUPERSEDED, 7, epoch=1),
    ]
    await log.save(saved[0])
    await other.save(event("tree-2", LeaseEventKind.ACQUIRED, 11))
    await other.save(saved[1])
    await log.save(event("tree-1", LeaseEventKind.ACQUIRED, 12, tenant="tenant-2"))
    await log.save(saved[2])
    assert list(await other.list(TENANT, "tree-1")) == saved
    assert await log.list(TENANT, "nothing") == []


async def test_recent_is_newest_first(cluster: Cluster) -> None:
    log = InMemoryExecutionLeaseEventRepository(cluster.backend)
    for at in range(5):
        await log.save(event(f"tree-{at}", LeaseEventKind.RENEWED, at))
    assert [e.at for e in await log.recent(3)] == [4, 3, 2]
    assert [e.at for e in await log.recent(10)] == [4, 3, 2, 1, 0]
    assert await log.recent(0) == []
    with pytest.raises(ValueError):
        await log.recent(-1)
    assert await log.ping() is None


async def test_the_lease_log_refuses_what_is_not_an_event(cluster: Cluster) -> None:
    log = InMemoryExecutionLeaseEventRepository(cluster.backend)
    with pytest.raises(TypeError):
        await log.save({"kind": "acquired"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        ExecutionLeaseEvent("", "tree-1", "instance-1", 1, LeaseEventKind.ACQUIRED, 0),
        ExecutionLeaseEvent(TENANT, "tree-1", "instance-1", 1, "seized", 0),  # type: ignore[arg-type]
        ExecutionLeaseEvent(TENANT, "tree-1", "instance-1", 1.5, LeaseEventKind.RENEWED, 0),  # type: ignore[arg-type]
        ExecutionLeaseEvent(TENANT, "tree-1", "instance-1", 1, LeaseEventKind.RENEWED, None),  # type: ignore[arg-type]
        ExecutionLeaseEvent(
            TENANT,
            "tree-1",
            "i",
            2,
            LeaseEventKind.TAKEN_OVER,
            0,
            ("instance-1", 1),  # type: ignore[arg-type]
        ),
        ExecutionLeaseEvent(TENANT, "tree-1", "i", 2, LeaseEventKind.LOST, 0, reason=5),  # type: ignore[arg-type]
    ],
)
async def test_the_lease_log_refuses_an_event_it_could_not_give_back_exactly(
    cluster: Cluster, bad: ExecutionLeaseEvent
) -> None:
    log = InMemoryExecutionLeaseEventRepository(cluster.backend)
    with pytest.raises((TypeError, ValueError, InvalidIdentifierError)):
        await log.save(bad)
    assert cluster.backend.lease_events == []


async def test_a_kind_saved_as_text_reads_back_equal(cluster: Cluster) -> None:
    log = InMemoryExecutionLeaseEventRepository(cluster.backend)
    saved = ExecutionLeaseEvent(TENANT, "tree-1", "instance-1", 1, "acquired", 0)  # type: ignore[arg-type]
    await log.save(saved)
    [read] = await log.list(TENANT, "tree-1")
    assert read == saved
    assert read.kind is LeaseEventKind.ACQUIRED
