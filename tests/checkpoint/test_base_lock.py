"""A put that appends to a base holds the base's row until its commit: a delete of the base
between the put's check of it and the put's commit waits for the commit, so no append is
ever committed against a base already gone.

The moment is made, not raced for: a statement listener on the putting connection runs
the delete on a connection of its own when the put sends its `COMMIT` (the check ran, the
commit not yet), with a lock wait of one second. The put cannot commit while the listener
runs, so a delete that waits for the put's lock ends in the server's lock wait timeout;
one that does not wait deletes the base, and the put then commits an append without it.

A fenced put on the MySQL family: its fence, its bases' check (a shared lock) and its
writes are statements of one transaction. (An unfenced put there is one script, and
PostgreSQL folds a put into one statement: neither leaves the client a moment between the
check and the commit to run a delete in; SQLite runs one writer at a time.)

The other way round on PostgreSQL: a delete of the bases still uncommitted when a folded
put starts. The put's snapshot sees the bases (the delete not committed), so only a lock
on them makes the put wait for the delete and see them gone; the server shows the wait
(polled, bounded) before the delete commits.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from support.capabilities import require, row_locks, scripts
from support.sql import lock_waits_sql

from agboss_sql.contracts import ApplicationContext, StoreClock, VirtualClock
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql.checkpoint import LEASE_KEY, SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.migrate import sync_url
from agboss_sql.sql.schema import checkpoint_blobs

LOCK_WAIT_TIMEOUT = 1205
"""The MySQL family's error when a lock wait passes `innodb_lock_wait_timeout`."""


def _turn(turn: int) -> list[BaseMessage]:
    return [
        HumanMessage(content=f"Turn {turn}: what I tried and what went wrong. " * 4, id=f"h{turn}"),
        AIMessage(content=f"Turn {turn}: let us go through it step by step. " * 4, id=f"a{turn}"),
    ]


class _Thread:
    """Fenced puts of one growing `messages` channel on one thread, each with its parent."""

    def __init__(self, saver: SqlCheckpointSaver, thread_id: str, lease: Any) -> None:
        self.saver, self.thread_id, self.lease = saver, thread_id, lease
        self.version: str | None = None
        self.last: str | None = None

    async def put(self, messages: list[BaseMessage]) -> None:
        self.version = self.saver.get_next_version(self.version, None)
        checkpoint: Checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages}
        checkpoint["channel_versions"] = {"messages": self.version}
        configurable: dict[str, Any] = {
            "thread_id": self.thread_id,
            "checkpoint_ns": "",
            LEASE_KEY: self.lease,
        }
        if self.last is not None:
            configurable["checkpoint_id"] = self.last
        stored = await self.saver.aput(
            {"configurable": configurable},
            checkpoint,
            {"source": "loop", "step": 1},
            {"messages": self.version},
        )
        self.last = stored["configurable"]["checkpoint_id"]


async def _rows(sql: SqlConnection, thread: str) -> list[tuple[str, str | None]]:
    """(version, base version) of a thread's value rows."""
    b = checkpoint_blobs
    statement = sa.select(b.c.version, b.c.base_version).where(
        b.c.thread_hash == identity_hash(thread)
    )
    return [
        (str(v), None if base is None else str(base))
        for v, base in (await sql.execute(statement)).rows
    ]


async def _appending_thread(
    sql: SqlConnection, *, fenced: bool
) -> tuple[_Thread, list[BaseMessage]]:
    """A new thread of a saver on `sql` (under a lease held when `fenced`) whose 12 turns
    were put, so that its later values are stored as appends: the thread and its
    conversation."""
    store_clock = StoreClock(VirtualClock(1_700_000_000_000))
    lease: Any = None
    if fenced:
        leases = SqlExecutionLeaseRepository(sql, store_clock, ApplicationContext("i-1"))
        lease = await leases.acquire("tenant-1", f"run-{uuid.uuid4()}", 30_000)
        assert lease is not None
    saver = SqlCheckpointSaver(sql, fenced=fenced, store_clock=store_clock)
    thread = _Thread(saver, f"thread-{uuid.uuid4()}", lease)
    conversation: list[BaseMessage] = []
    for turn in range(12):
        conversation = [*conversation, *_turn(turn)]
        await thread.put(conversation)
    return thread, conversation


@pytest.mark.database
async def test_a_delete_of_a_base_waits_for_the_put_that_appends_to_it(
    sql: SqlConnection, sql_url: str
) -> None:
    require(scripts(sql), "a fenced put's statements sent one by one (the MySQL family)")
    thread, conversation = await _appending_thread(sql, fenced=True)
    thread_id = thread.thread_id
    before = await _rows(sql, thread_id)
    assert any(base is not None for _, base in before), before  # it appends already

    # Each value stored whole (a base) deleted by its key: a delete that locks that row
    # alone, not the rows the put inserts beside it.
    b = checkpoint_blobs
    key = (b.c.thread_hash, b.c.ns_hash, b.c.channel_hash, b.c.version)
    whole = (
        await sql.execute(
            sa.select(*key).where(
                b.c.thread_hash == identity_hash(thread_id), b.c.base_version.is_(None)
            )
        )
    ).rows
    deletes_of_bases = [
        sa.delete(b).where(*(column == value for column, value in zip(key, row, strict=True)))
        for row in whole
    ]
    engine = sa.create_engine(sync_url(sql_url))
    deletes: list[Any] = []

    def delete_at_the_commit(statement: str, _params: Any) -> None:
        if deletes or statement.split()[0].upper() != "COMMIT":
            return
        try:
            with engine.begin() as other:
                other.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
                deletes.append(sum(other.execute(d).rowcount for d in deletes_of_bases))
        except sa.exc.OperationalError as exc:
            deletes.append(exc.orig.args[0] if exc.orig is not None else exc)

    remove = sql.add_statement_listener(delete_at_the_commit)
    try:
        conversation = [*conversation, *_turn(12)]
        await thread.put(conversation)
    finally:
        remove()
        engine.dispose()
    after = await _rows(sql, thread_id)
    new = set(after) - set(before)
    assert any(base is not None for _, base in new), after  # the last put was an append
    assert deletes == [LOCK_WAIT_TIMEOUT], (
        f"the delete of the bases answered {deletes}: it did not wait for the put's commit"
    )
    versions = {version for version, _ in after}
    assert all(base in versions for _, base in after if base is not None), after


async def _wait_for_put_or_lock_wait(sql: SqlConnection, put: asyncio.Task[None]) -> bool:
    """Whether the put waits for a lock (seen by the server, polled, bounded) rather than
    ending without waiting; fails if neither happens."""
    waiting = lock_waits_sql(sql, "WITH")
    for _ in range(3_000):
        if put.done():
            return False
        if (await sql.execute(waiting)).scalar():
            return True
        await asyncio.sleep(0.01)
    pytest.fail("the put neither ended nor waited for a lock")


@pytest.mark.database
@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
async def test_a_put_that_appends_to_a_base_being_deleted_stores_its_value_whole(
    sql: SqlConnection, sql_url: str, fenced: bool
) -> None:
    """A transaction deletes every base of a thread and holds its commit while a folded put
    that appends to one of them runs: the put waits for that commit, finds its base gone,
    and stores its value whole; its checkpoint reads back whole. Without the guard's shared
    lock the put's snapshot still saw the base (its delete uncommitted), the put committed
    its append, and the delete's commit left the append without a base."""
    require(row_locks(sql), "a delete that holds its rows' locks while another write runs")
    require(not scripts(sql), "a put folded into one statement (`WITH` parts)")
    thread, conversation = await _appending_thread(sql, fenced=fenced)
    thread_id = thread.thread_id
    before = await _rows(sql, thread_id)
    bases = {base for _, base in before if base is not None}
    assert bases, before  # it appends already

    b = checkpoint_blobs
    delete_bases = sa.delete(b).where(
        b.c.thread_hash == identity_hash(thread_id), b.c.base_version.is_(None)
    )
    holder = SqlConnection(sql_url)
    try:
        async with holder.transaction() as tx:
            deleted = await tx.execute(delete_bases)
            assert deleted.rowcount > 0
            conversation = [*conversation, *_turn(12)]
            put = asyncio.create_task(thread.put(conversation))
            waited = await _wait_for_put_or_lock_wait(sql, put)
        await asyncio.wait_for(put, 30)
    finally:
        await holder.close()
    after = await _rows(sql, thread_id)
    versions = {version for version, _ in after}
    new = set(after) - set(before)
    orphans = [(v, base) for v, base in new if base is not None and base not in versions]
    assert new and not orphans, f"appends whose base is gone (the put waited: {waited}): {orphans}"
    assert waited, "the put did not wait for the delete of its base"
    (newest,) = [base for version, base in after if version == thread.version]
    assert newest is None  # stored whole, as the retry without appends writes it
    fresh = SqlCheckpointSaver(sql, value_cache_bytes=0)
    found = await fresh.aget_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    assert found is not None
    assert found.checkpoint["channel_values"]["messages"] == conversation
