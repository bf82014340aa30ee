"""A PostgreSQL server that takes no write (a standby, or sessions read-only by default:
SQLSTATE 25006) answers every store's write as `StoreReadOnlyError`: typed, a
`StoreUnavailableError` (call again), naming what happened, never the driver's error; on
the stores' async connections and on the checkpoint saver's synchronous path. Reads are
served as before.

The read-only database is this test's own: made beside the database under test (same
server), migrated, given a lease while it still takes writes, then `ALTER DATABASE … SET
default_transaction_read_only = on` (new sessions only); dropped after. PostgreSQL only.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from support.capabilities import pooled_url

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionContext,
    ExecutionLease,
    QueuedChild,
    StepRef,
    StoreClock,
    StoreReadOnlyError,
    StoreUnavailableError,
    SystemClock,
)
from agboss_sql.contracts.errors import StoreRefusedError
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.lab.database import create_schema
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.migrate import sync_url
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository

TENANT = "tenant-ro"
TREE = "tree-ro"
LEASE_MS = 600_000


def _admin(database_url: str) -> sa.Engine:
    """An autocommit engine on the server's `postgres` database."""
    url = sync_url(database_url).set(database="postgres")
    return sa.create_engine(url, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="module")
def read_only(database_url: str) -> Iterator[tuple[str, ExecutionLease]]:
    """The URL of a migrated database whose new sessions are read-only, and a lease taken
    on it before it became so."""
    if sa.make_url(database_url).get_backend_name() != "postgresql":
        pytest.skip("default_transaction_read_only is PostgreSQL's")
    if pooled_url(database_url):
        pytest.skip(
            "default_transaction_read_only reaches new server sessions only: a pooler reuses "
            "the ones it opened before"
        )
    base = sa.make_url(database_url)
    name = f"{base.database}_ro_{os.getpid()}"[:63]
    url = base.set(database=name).render_as_string(hide_password=False)
    admin = _admin(database_url)
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        create_schema(url)
        lease = _take_lease(url)
        with admin.connect() as connection:
            connection.exec_driver_sql(
                f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'
            )
        yield url, lease
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _take_lease(url: str) -> ExecutionLease:
    import asyncio

    async def take() -> ExecutionLease:
        connection = SqlConnection(url)
        try:
            lease = await _leases(connection).acquire(TENANT, TREE, LEASE_MS)
            assert lease is not None
            return lease
        finally:
            await connection.close()

    return asyncio.run(take())


def _leases(connection: SqlConnection) -> SqlExecutionLeaseRepository:
    return SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("instance-1"))


@pytest.fixture
async def connection(read_only: tuple[str, ExecutionLease]) -> AsyncIterator[SqlConnection]:
    opened = SqlConnection(read_only[0])
    yield opened
    await opened.close()


def _is_read_only(error: BaseException) -> None:
    """What every refused write must be: typed, retryable, naming what happened, the
    driver's error only as its cause."""
    assert isinstance(error, StoreReadOnlyError), repr(error)
    assert isinstance(error, StoreUnavailableError)
    assert not isinstance(error, StoreRefusedError)
    assert error.code == "store.read-only"
    assert "read-only" in str(error) and "nothing was committed" in str(error)
    assert "25006" in repr(_sqlstates(error)), _sqlstates(error)


def _sqlstates(error: BaseException) -> list[Any]:
    found = []
    cause: BaseException | None = error
    while cause is not None:
        found.append(getattr(cause, "sqlstate", None))
        cause = cause.__cause__
    return found


async def test_a_lease_take_on_a_read_only_server_is_typed_and_retryable(
    connection: SqlConnection,
) -> None:
    with pytest.raises(StoreReadOnlyError) as caught:
        await _leases(connection).acquire(TENANT, f"other-{uuid.uuid4()}", LEASE_MS)
    _is_read_only(caught.value)


async def test_a_fenced_effect_and_a_child_enqueue_are_typed_and_reads_are_served(
    connection: SqlConnection, read_only: tuple[str, ExecutionLease]
) -> None:
    lease = read_only[1]
    with pytest.raises(StoreReadOnlyError) as caught:
        await _leases(connection).renew(lease, LEASE_MS)
    _is_read_only(caught.value)
    effects: SqlFencedEffectRepository[Any] = SqlFencedEffectRepository(
        connection, StoreClock(), ApplicationContext("instance-1")
    )
    context = ExecutionContext(
        tenant_id=TENANT,
        root_execution_id=TREE,
        execution_id=TREE,
        lease=lease,
        step=StepRef(TREE, "s1", "s1"),
    )
    ran: list[str] = []

    async def work(tx: Any) -> dict[str, str]:
        ran.append("work")
        return {"ok": "yes"}

    with pytest.raises(StoreReadOnlyError) as caught:
        await effects.save_result_if_absent(fenced_effect_key_of(context, "charge"), work)
    _is_read_only(caught.value)
    assert ran == []  # the fence's lock is refused before the work runs
    queue = SqlChildExecutionQueueRepository(
        connection, SystemClock(), ApplicationContext("instance-1")
    )
    assert list(await queue.children(TENANT, TREE)) == []  # a read is served
    with pytest.raises(StoreReadOnlyError) as caught:
        await queue.enqueue(
            QueuedChild(
                tenant_id=TENANT,
                root_execution_id=TREE,
                parent_execution_id=TREE,
                child_execution_id=f"{TREE}.c0",
                depth=1,
                payload={},
            )
        )
    _is_read_only(caught.value)


def test_the_savers_sync_path_is_typed_and_its_reads_are_served(
    read_only: tuple[str, ExecutionLease],
) -> None:
    pytest.importorskip("langgraph.checkpoint.base")
    from langgraph.checkpoint.base import empty_checkpoint

    from agboss_sql.sql.checkpoint import SqlCheckpointSaver

    config: Any = {"configurable": {"thread_id": f"t-{uuid.uuid4()}", "checkpoint_ns": ""}}
    with SqlCheckpointSaver.from_conn_string(read_only[0]) as saver:
        assert saver.get_tuple(config) is None
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"answer": 42}
        checkpoint["channel_versions"] = {"answer": saver.get_next_version(None, None)}
        with pytest.raises(StoreReadOnlyError) as caught:
            saver.put(config, checkpoint, {"source": "input", "step": -1}, {})
        _is_read_only(caught.value)
        with pytest.raises(StoreReadOnlyError) as caught:
            saver.put_writes(
                {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}},
                [("answer", 1)],
                "task-1",
            )
        _is_read_only(caught.value)
