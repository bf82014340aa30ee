"""Revision 0004_saver_keys keys the checkpoint saver's rows by digests: checkpoints written
before it are still read, listed and resumed after it, and the ids it opens up (long, ending
in a space) work beside them."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import sqlalchemy as sa
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from migration_support import connected

from agboss_sql.sql import migrate
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql.checkpoint import SqlCheckpointSaver

pytestmark = pytest.mark.database

BEFORE = "0002"


def _write_old_rows(url: str, saver: SqlCheckpointSaver, thread_id: str) -> str:
    """A checkpoint with a value and a pending write, as the saver stored them before."""
    checkpoint: Checkpoint = empty_checkpoint()
    checkpoint["channel_versions"] = {"messages": "00000000000000000000000000000001.5"}
    body = dict(checkpoint, channel_values={})
    kind, data = saver.serde.dumps_typed(body)
    value_kind, value = saver.serde.dumps_typed(["hello", "José"])
    write_kind, write = saver.serde.dumps_typed("pending")
    ns_hash = identity_hash("")
    with connected(url) as connection, connection.begin():
        connection.execute(
            sa.text(
                "INSERT INTO agboss_checkpoints (thread_id, ns_hash, checkpoint_id, "
                "checkpoint_ns, parent_checkpoint_id, run_hash, checkpoint_type, checkpoint, "
                "metadata) VALUES (:t, :ns, :id, '', NULL, NULL, :kind, :data, :md)"
            ),
            {
                "t": thread_id,
                "ns": ns_hash,
                "id": checkpoint["id"],
                "kind": kind,
                "data": data,
                "md": '{"source":"loop","step":3,"user":"José"}',
            },
        )
        connection.execute(
            sa.text(
                "INSERT INTO agboss_checkpoint_blobs (thread_id, ns_hash, channel, version, "
                "value_type, value) VALUES (:t, :ns, 'messages', :v, :kind, :value)"
            ),
            {
                "t": thread_id,
                "ns": ns_hash,
                "v": checkpoint["channel_versions"]["messages"],
                "kind": value_kind,
                "value": value,
            },
        )
        connection.execute(
            sa.text(
                "INSERT INTO agboss_checkpoint_writes (thread_id, ns_hash, checkpoint_id, "
                "task_id, idx, channel, task_path, value_type, value) "
                "VALUES (:t, :ns, :id, 'task-1', 0, 'messages', '', :kind, :value)"
            ),
            {
                "t": thread_id,
                "ns": ns_hash,
                "id": checkpoint["id"],
                "kind": write_kind,
                "value": write,
            },
        )
    return checkpoint["id"]


def test_checkpoints_stored_before_the_revision_are_read_after_it(empty_url: str) -> None:
    migrate.upgrade(empty_url, BEFORE)
    probe = SqlCheckpointSaver.from_conn_string(empty_url).saver
    thread_id = f"thread-{uuid.uuid4()}"
    checkpoint_id = _write_old_rows(empty_url, probe, thread_id)

    migrate.upgrade(empty_url)

    async def read() -> None:
        async with SqlCheckpointSaver.from_conn_string(empty_url) as saver:
            config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            found = await saver.aget_tuple(config)
            assert found is not None
            assert found.config["configurable"]["checkpoint_id"] == checkpoint_id
            assert found.checkpoint["channel_values"] == {"messages": ["hello", "José"]}
            assert found.pending_writes == [("task-1", "messages", "pending")]
            listed = [t async for t in saver.alist(config, filter={"user": "José"})]
            assert [t.config["configurable"]["checkpoint_id"] for t in listed] == [checkpoint_id]
            # Ids the old keys refused now sit beside the migrated thread.
            long_id = thread_id + " " + "x" * 300 + " "
            await saver.acopy_thread(thread_id, long_id)
            copied = await saver.aget_tuple({"configurable": {"thread_id": long_id}})
            assert copied is not None
            assert copied.config["configurable"]["thread_id"] == long_id
            assert copied.checkpoint["channel_values"] == {"messages": ["hello", "José"]}
            await saver.adelete_thread(thread_id)
            assert await saver.aget_tuple(config) is None

    asyncio.run(read())


def test_downgrading_below_the_revision_refuses_to_lose_checkpoints(empty_url: str) -> None:
    migrate.upgrade(empty_url)

    async def write() -> None:
        async with SqlCheckpointSaver.from_conn_string(empty_url) as saver:
            checkpoint: Checkpoint = empty_checkpoint()
            config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            await saver.aput(config, checkpoint, {"source": "input", "step": -1}, {})

    asyncio.run(write())
    with pytest.raises(RuntimeError, match="holds checkpoints"):
        migrate.downgrade(empty_url, BEFORE)
    assert migrate.current(empty_url) == migrate.head()


def test_setup_brings_the_schema_to_head_sync_and_async(empty_url: str) -> None:
    # As LangGraph's savers: `saver.setup()` from sync code, `await saver.setup()` from async.
    with SqlCheckpointSaver.from_conn_string(empty_url) as saver:
        saver.setup()
        assert migrate.current(empty_url) == migrate.head()
        config = {"configurable": {"thread_id": "after setup", "checkpoint_ns": ""}}
        saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
        assert saver.get_tuple(config) is not None

    async def again() -> None:
        async with SqlCheckpointSaver.from_conn_string(empty_url) as saver:
            await saver.setup()  # at head: only checks
            await saver.asetup()
            assert await saver.aget_tuple({"configurable": {"thread_id": "after setup"}})

    asyncio.run(again())
    assert migrate.current(empty_url) == migrate.head()
