"""A saver given LangGraph's `EncryptedSerializer` (how LangGraph encrypts checkpoints at
rest) stores only what the serializer makes of each value, body and pending write, on the
database under test: nothing readable is left in the three tables, a paused thread resumes
on another instance, and a growing list is never stored as an append to ciphertext."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from checkpoint_graphs import approval_graph, reply_chat, request
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import MessagesState
from langgraph.types import Command

from agboss_sql.sql._base import identity_hash
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints

SECRET = "card 4111 1111 1111 1111"


class _Xor:
    """A stand-in for a cipher (LangGraph's `CipherProtocol`): what the saver must not
    depend on is the bytes' form, which this changes as AES would."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(b ^ 0x5A for b in ciphertext)


def _chat(saver: SqlCheckpointSaver) -> Any:
    return reply_chat(saver, MessagesState, "a")


async def test_nothing_readable_is_stored_and_the_thread_resumes_elsewhere(
    sql: SqlConnection, new_connection: Any
) -> None:
    serde = EncryptedSerializer(_Xor())
    saver = SqlCheckpointSaver(sql, serde=serde)
    paused, chat = f"paused-{uuid.uuid4()}", f"chat-{uuid.uuid4()}"
    approval_graph().compile(checkpointer=saver).invoke(request(SECRET), _config(paused))
    # A long first message, then short ones: the list grows by appends, were the bytes the
    # serializer's own.
    for turn in range(4):
        text = f"{SECRET} " + "." * 4000 if turn == 0 else f"turn {turn}"
        _chat(saver).invoke({"messages": [HumanMessage(text, id=f"h{turn}")]}, _config(chat))

    stored: list[tuple[str, bytes]] = []
    for thread_id in (paused, chat):
        thread_hash = identity_hash(thread_id)
        for table, kind, data in (
            (checkpoints, checkpoints.c.checkpoint_type, checkpoints.c.checkpoint),
            (checkpoint_blobs, checkpoint_blobs.c.value_type, checkpoint_blobs.c.value),
            (checkpoint_writes, checkpoint_writes.c.value_type, checkpoint_writes.c.value),
        ):
            found = await sql.execute(
                sa.select(kind, data).where(table.c.thread_hash == thread_hash)
            )
            stored += [(str(t), bytes(v)) for t, v in found.rows if v is not None]
    assert len(stored) > 20
    for kind, data in stored:
        assert kind.endswith("+xor"), kind
        assert SECRET.encode() not in data and b"4111" not in data
    appends = await sql.execute(
        sa.select(sa.func.count())
        .select_from(checkpoint_blobs)
        .where(
            checkpoint_blobs.c.thread_hash == identity_hash(chat),
            checkpoint_blobs.c.base_version.is_not(None),
        )
    )
    assert appends.scalar() == 0, "no append to ciphertext"

    elsewhere = SqlCheckpointSaver(new_connection(), serde=serde)
    done = (
        await approval_graph()
        .compile(checkpointer=elsewhere)
        .ainvoke(Command(resume="yes"), _config(paused))
    )
    assert done["messages"][0].content == SECRET
    assert done["decision"] == "yes" and done["total"] == 101
    state = await _chat(elsewhere).aget_state(_config(chat))
    assert [m.id for m in state.values["messages"]] == [
        "h0", "a1", "h1", "a3", "h2", "a5", "h3", "a7"
    ]  # fmt: skip
    assert state.values["messages"][0].content.startswith(SECRET)


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}
