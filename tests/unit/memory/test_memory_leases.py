"""What only the in-memory lease store shows: its database time is this host's clock,
and refused arguments leave its backend untouched.

Every promise of `ExecutionLeaseRepository` (docs/contracts.md) is an `execution_lease` contract
case, run once on the in-memory set (tests/unit/test_conformance_memory.py).
"""

from __future__ import annotations

import pytest
from memory_cluster import LEASE_MS, TENANT, Cluster

from agboss_sql.contracts import (
    ApplicationContext,
    InvalidIdentifierError,
    StoreClock,
    SystemClock,
    VirtualClock,
)
from agboss_sql.memory import InMemoryBackend, InMemoryExecutionLeaseRepository

# time


async def test_database_time_is_this_hosts_clock_in_memory() -> None:
    leases = InMemoryExecutionLeaseRepository(
        InMemoryBackend(), StoreClock(), ApplicationContext("instance-1")
    )
    before = SystemClock().now()
    lease = await leases.acquire(TENANT, "tree-1", 60_000)
    assert lease is not None
    assert 59_000 <= lease.remaining_ms <= 60_000
    remaining = await leases.renew(lease, 120_000)
    assert remaining is not None and 119_000 <= remaining <= 120_000
    row = leases.memory.leases[(TENANT, "tree-1")]
    assert before + 120_000 <= row.expires_at <= SystemClock().now() + 120_000


# arguments


@pytest.mark.parametrize("bad", ["", "x" * 256, None, 7])
async def test_identifiers_are_checked_before_anything(cluster: Cluster, bad: object) -> None:
    leases = cluster.leases(1)
    with pytest.raises(InvalidIdentifierError):
        await leases.acquire(bad, "tree-1", LEASE_MS)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        await leases.acquire(TENANT, bad, LEASE_MS)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        await leases.save_execution_id_if_absent(TENANT, bad)  # type: ignore[arg-type]
    assert cluster.backend.leases == {}
    assert cluster.backend.execution_ids == set()


def test_the_lease_store_needs_the_stores_clock_and_an_application() -> None:
    backend = InMemoryBackend()
    with pytest.raises(TypeError, match="StoreClock"):
        InMemoryExecutionLeaseRepository(backend, VirtualClock(), ApplicationContext("a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ApplicationContext"):
        InMemoryExecutionLeaseRepository(backend, StoreClock(), "a")  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        InMemoryExecutionLeaseRepository(backend, StoreClock(), ApplicationContext(""))
