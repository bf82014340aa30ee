"""Applications on SQL stores: one connection per instance, readiness against a dead
database, and instances that see each other's leases through the database under test."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from support.ports import closed_port

from agboss_sql.application import Application, DatabaseUrl, HealthStatus, sql_stores
from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionLeaseRepository,
    ExecutionRecordRepository,
    StoreClock,
    StoreUnavailableError,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.testing.instances import instances


async def test_connection_is_built_once_per_instance(sql_url: str) -> None:
    app = Application("support", providers=sql_stores(), values={DatabaseUrl: DatabaseUrl(sql_url)})
    await app.start()
    connections = {
        id(store.connection) for store in app.stores.values() if hasattr(store, "connection")
    }
    assert len(connections) == 1
    other = Application(
        "support", providers=sql_stores(), values={DatabaseUrl: DatabaseUrl(sql_url)}
    )
    await other.start()
    assert app.store(ExecutionLeaseRepository).connection is not (  # type: ignore[attr-defined]
        other.store(ExecutionLeaseRepository).connection  # type: ignore[attr-defined]
    )
    report = await app.check_readiness()
    assert report.status is HealthStatus.UP, str(report)
    await app.close()
    await other.close()


async def test_backend_is_read_from_the_connection(sql_url: str) -> None:
    app = Application("support", providers=sql_stores(), values={DatabaseUrl: DatabaseUrl(sql_url)})
    await app.start()
    dialect = SqlConnection(sql_url).dialect_name
    for contract in (ExecutionLeaseRepository, ExecutionRecordRepository):
        assert app.store(contract).backend == dialect
    await app.close()


async def test_async_with_starts_on_entry_and_closes_its_connections_on_exit(
    sql_url: str, sql: SqlConnection
) -> None:
    given = {DatabaseUrl: DatabaseUrl(sql_url)}
    async with Application("support", providers=sql_stores(), values=given) as app:
        leases = app.store(ExecutionLeaseRepository)
        assert await leases.acquire("tenant-1", "run-1", 30_000) is not None
    with pytest.raises(StoreUnavailableError):
        await leases.acquire("tenant-1", "run-2", 30_000)
    with pytest.raises(RuntimeError):
        app.store(ExecutionLeaseRepository)
    with pytest.raises(ValueError, match="from the block"):
        async with Application("support", providers=sql_stores(), values=given) as app:
            leases = app.store(ExecutionLeaseRepository)
            raise ValueError("from the block")
    with pytest.raises(StoreUnavailableError):
        await leases.acquire("tenant-1", "run-3", 30_000)


async def test_async_with_leaves_a_given_connection_open(sql: SqlConnection) -> None:
    async with Application("support", providers=sql_stores(), values={SqlConnection: sql}):
        pass
    leases = SqlExecutionLeaseRepository(sql, StoreClock(), ApplicationContext("after"))
    assert await leases.acquire("tenant-1", "run-1", 30_000) is not None


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never answers (a hung database)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        for writer in held:
            writer.close()
        server.close()


@pytest.mark.parametrize("scheme", ["postgresql://postgres@", "mysql://root@"])
async def test_readiness_answers_within_the_timeout_when_the_database_hangs(scheme: str) -> None:
    async with silent_server() as port:
        url = f"{scheme}127.0.0.1:{port}/nothing"
        app = Application(
            "support",
            providers=[SqlExecutionLeaseRepository],
            values={DatabaseUrl: DatabaseUrl(url)},
        )
        await app.start()
        started = time.perf_counter()
        report = await app.check_readiness()
        elapsed = time.perf_counter() - started
        assert 1.9 < elapsed < 3.0, elapsed
        assert report.status is HealthStatus.DOWN
        leases = next(c for c in report.components if "SqlExecutionLeaseRepository" in c.name)
        assert leases.status is HealthStatus.DOWN and "no answer within 2 s" in (leases.error or "")
        await app.close()


@pytest.mark.parametrize("scheme", ["postgresql://postgres@", "mysql://root@"])
async def test_readiness_reports_a_stopped_database(scheme: str) -> None:
    url = f"{scheme}127.0.0.1:{closed_port()}/nothing"
    app = Application(
        "support", providers=[SqlExecutionLeaseRepository], values={DatabaseUrl: DatabaseUrl(url)}
    )
    await app.start()
    report = await app.check_readiness()
    assert report.status is HealthStatus.DOWN
    leases = next(c for c in report.components if "SqlExecutionLeaseRepository" in c.name)
    assert leases.error is not None and "store.unavailable" in leases.error
    await app.close()


async def test_instances_see_each_others_leases(sql_url: str, sql: SqlConnection) -> None:
    template = Application("support", providers=sql_stores())
    async with instances(template, n=2, url=sql_url) as cluster:
        a, b = cluster.apps
        first = await a.store(ExecutionLeaseRepository).acquire("t", "root-1", 30_000)
        assert first is not None
        assert await b.store(ExecutionLeaseRepository).acquire("t", "root-1", 30_000) is None
        await cluster.clock.advance(30_000)
        second = await b.store(ExecutionLeaseRepository).acquire("t", "root-1", 30_000)
        assert second is not None and second.lease_epoch == 2
        assert second.taken_over_from is not None
        assert second.taken_over_from.instance_id == a.instance_id


async def test_instances_see_each_others_effects(sql_url: str, sql: SqlConnection) -> None:
    from typing import Any

    from agboss_sql.contracts import (
        ExecutionContext,
        ExecutionFencedError,
        FencedEffectRepository,
        StepRef,
        fenced_effect_key_of,
    )
    from agboss_sql.lab.business import committed_business_rows, insert_business_row

    template = Application("support", providers=sql_stores())
    async with instances(template, n=2, url=sql_url) as cluster:
        a, b = cluster.apps
        first = await a.store(ExecutionLeaseRepository).acquire("t", "root-2", 30_000)
        assert first is not None
        step = StepRef("root-2", "step-1", "charge")

        def key(lease: Any) -> Any:
            return fenced_effect_key_of(
                ExecutionContext("t", "root-2", "root-2", lease, step), "pay"
            )

        async def work(tx: Any) -> str:
            await insert_business_row(tx, "charged")
            return "paid"

        done = await a.store(FencedEffectRepository).save_result_if_absent(key(first), work)
        assert (done.value, done.replayed) == ("paid", False)
        await cluster.clock.advance(30_000)
        second = await b.store(ExecutionLeaseRepository).acquire("t", "root-2", 30_000)
        assert second is not None
        replay = await b.store(FencedEffectRepository).save_result_if_absent(key(second), work)
        assert (replay.value, replay.replayed) == ("paid", True)
        with pytest.raises(ExecutionFencedError):
            await a.store(FencedEffectRepository).save_result_if_absent(key(first), work)
        assert await committed_business_rows(sql) == ["charged"]
