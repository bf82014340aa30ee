"""The fenced `SqlCheckpointSaver` passes the reusable fenced-saver contract
(`agboss_sql.testing.checkpoint_saver`) on the database under test, and the contract fails
deliberately broken savers (`broken_savers.py`), each at the case that names its mistake."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from broken_savers import BROKEN
from support.nodes import node_url

from agboss_sql.lab.database import truncate_all
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints
from agboss_sql.testing.checkpoint_saver import SaverStatements, checkpoint_saver_contract
from agboss_sql.testing.contracts import Seam, StoreFactory, generated_cases


class Instances:
    """One `SqlConnection` per instance id, opened on first use, on the database under test."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.connections: dict[str, SqlConnection] = {}

    def connection(self, instance_id: str) -> SqlConnection:
        found = self.connections.get(instance_id)
        if found is None:
            assert self.url is not None, "the database fixture has not run"
            found = self.connections[instance_id] = SqlConnection(
                node_url(self.url, len(self.connections))
            )
        return found

    async def close(self) -> None:
        for connection in self.connections.values():
            await connection.close()
        self.connections.clear()


INSTANCES = Instances()


@pytest_asyncio.fixture(scope="module", loop_scope="session", autouse=True)
async def _database(sql_url: str) -> AsyncIterator[None]:
    INSTANCES.url = sql_url
    yield
    await INSTANCES.close()


async def reset() -> None:
    await truncate_all(INSTANCES.connection("instance-1"))


async def stored_rows(thread_id: str) -> int:
    """The checkpoints, value rows and pending writes stored for the thread."""
    sql, total = INSTANCES.connection("instance-1"), 0
    for table in (checkpoints, checkpoint_blobs, checkpoint_writes):
        statement = sa.select(sa.func.count()).where(
            table.c.thread_hash == identity_hash(thread_id)
        )
        total += int((await sql.execute(statement)).scalar() or 0)
    return total


@contextmanager
def record(saver: SqlCheckpointSaver) -> Iterator[list[str]]:
    sent: list[str] = []
    stop = saver.connection.add_statement_listener(lambda text, _params: sent.append(text))
    try:
        yield sent
    finally:
        stop()


def is_lease_check(text: str) -> bool:
    """The fence (an update of the lease row), or a write with the fence folded in."""
    return "UPDATE agboss_execution_leases" in text or "agboss_fence" in text


async def _close(saver: SqlCheckpointSaver) -> None:
    await saver.aclose()


def _saver(cls: type[SqlCheckpointSaver], *, fenced: bool = True, **options: Any) -> StoreFactory:
    def build(seam: Seam) -> SqlCheckpointSaver:
        connection = INSTANCES.connection(seam.application.instance_id)
        return cls(connection, fenced=fenced, store_clock=seam.store_clock, **options)

    return StoreFactory(build, close=_close)


def _leases(seam: Seam) -> SqlExecutionLeaseRepository:
    connection = INSTANCES.connection(seam.application.instance_id)
    return SqlExecutionLeaseRepository(connection, seam.store_clock, seam.application)


def contract(cls: type[SqlCheckpointSaver], name: str) -> type:
    return checkpoint_saver_contract(
        _saver(cls),
        execution_lease=_leases,
        name=name,
        reset=reset,
        reader=_saver(cls, value_cache_bytes=0),
        # The package's saver used without a lease (the broken savers' unfenced twin too).
        unfenced=_saver(SqlCheckpointSaver, fenced=False),
        stored_rows=stored_rows,
        statements=SaverStatements(record=record, is_lease_check=is_lease_check),
    )


TestSqlSaver = contract(SqlCheckpointSaver, "SQL saver")


@pytest.mark.parametrize("broken", sorted(BROKEN))
@pytest.mark.asyncio(loop_scope="session")  # the loop of the instances' connections
async def test_the_contract_fails_a_broken_saver_at_its_mistake(broken: str) -> None:
    """Each broken saver fails the cases that name its mistake, and passes the others
    (no case fails for another reason)."""
    cls, expected = BROKEN[broken]
    generated = contract(cls, f"broken {broken}")
    generated.__test__ = False  # type: ignore[attr-defined]
    instance = generated()
    failed: dict[str, str] = {}
    for name in generated_cases(generated):
        try:
            await getattr(instance, name)()
        except pytest.skip.Exception:
            continue
        except Exception as error:
            failed[name.removeprefix("test_checkpoint_saver__")] = (
                f"{type(error).__name__}: {error}"
            )
    assert set(failed) == expected, failed
