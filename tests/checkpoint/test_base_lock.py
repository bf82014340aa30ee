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
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from support.capabilities import require, scripts

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


@pytest.mark.database
async def test_a_delete_of_a_base_waits_for_the_put_that_appends_to_it(
    sql: SqlConnection, sql_url: str
) -> None:
    require(scripts(sql), "a fenced put's statements sent one by one (the MySQL family)")
    store_clock = StoreClock(VirtualClock(1_700_000_000_000))
    leases = SqlExecutionLeaseRepository(sql, store_clock, ApplicationContext("i-1"))
    lease = await leases.acquire("tenant-1", f"run-{uuid.uuid4()}", 30_000)
    assert lease is not None
    saver = SqlCheckpointSaver(sql, fenced=True, store_clock=store_clock)
    thread_id = f"thread-{uuid.uuid4()}"
    thread = _Thread(saver, thread_id, lease)
    conversation: list[BaseMessage] = []
    for turn in range(12):
        conversation = [*conversation, *_turn(turn)]
        await thread.put(conversation)
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
