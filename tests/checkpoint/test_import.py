"""Threads brought over from another saver (`import_threads`): every checkpoint of every
namespace with its pending writes, as the source answers them, on the database under test;
a thread paused there resumes here; an import run again changes nothing; a target that
loses what it is given is caught by the check after each thread."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import sqlalchemy as sa
from checkpoint_graphs import approval_graph, reply_chat, request
from langchain_core.messages import HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import _messages_delta_reducer
from langgraph.types import Command, interrupt

from agboss_sql.sql.checkpoint import (
    ImportMismatchError,
    ImportReport,
    SqlCheckpointSaver,
    aimport_threads,
    import_threads,
)
from agboss_sql.sql.connection import SqlConnection


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


class _Outer(TypedDict, total=False):
    asked: str
    answer: str
    done: bool


def _nested_graph() -> StateGraph[_Outer]:
    """A parent whose one node is a subgraph that pauses: its checkpoints live in a
    namespace of their own, which a resume needs."""

    def ask(state: _Outer) -> dict[str, Any]:
        return {"answer": str(interrupt({"asked": state["asked"]}))}

    inner = StateGraph(_Outer)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")

    def finish(state: _Outer) -> dict[str, Any]:
        return {"done": True}

    outer = StateGraph(_Outer)
    outer.add_node("inner", inner.compile())
    outer.add_node("finish", finish)
    outer.add_edge(START, "inner")
    outer.add_edge("inner", "finish")
    return outer


def _written_by(saver: BaseCheckpointSaver[Any]) -> dict[str, str]:
    """Threads of every kind on `saver`: paused on an interrupt, a forked history, a
    subgraph paused in its namespace. Answers their ids by kind."""
    threads = {kind: f"{kind}-{uuid.uuid4()}" for kind in ("paused", "forked", "nested")}
    approval = approval_graph().compile(checkpointer=saver)
    approval.invoke(request("refund order 42"), _config(threads["paused"]))

    forked = _config(threads["forked"])
    approval.invoke(request("close ticket 7"), forked)
    approval.invoke(Command(resume="no"), forked)
    first = list(approval.get_state_history(forked))[-2]  # after the input
    approval.update_state(first.config, {"messages": [HumanMessage("again", id="again")]})

    _nested_graph().compile(checkpointer=saver).invoke(
        {"asked": "which plan?"}, _config(threads["nested"])
    )
    return threads


def _facts(serde: Any, found: CheckpointTuple) -> tuple[Any, ...]:
    parent = found.parent_config["configurable"]["checkpoint_id"] if found.parent_config else None
    return (
        found.config["configurable"].get("checkpoint_ns", ""),
        found.checkpoint["id"],
        parent,
        sorted((k, serde.dumps_typed(v)) for k, v in found.checkpoint["channel_values"].items()),
        found.checkpoint["channel_versions"],
        found.checkpoint["versions_seen"],
        sorted((k, serde.dumps_typed(v)) for k, v in found.metadata.items()),
        sorted((t, c, serde.dumps_typed(v)) for t, c, v in found.pending_writes or ()),
    )


def _history(saver: BaseCheckpointSaver[Any], serde: Any, thread_id: str) -> list[Any]:
    return sorted(_facts(serde, t) for t in saver.list(_config(thread_id)))


@pytest.fixture
def official(tmp_path: Path) -> Iterator[SqliteSaver]:
    conn = sqlite3.connect(tmp_path / "official.sqlite", check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


async def test_every_thread_of_another_saver_comes_over_and_resumes_here(
    sql: SqlConnection, official: SqliteSaver
) -> None:
    threads = _written_by(official)
    target = SqlCheckpointSaver(sql)

    report = import_threads(official, target)

    serde = target.serde
    everything = list(official.list(None))
    assert report.threads >= len(threads)  # the database's earlier tests' threads too
    assert report.checkpoints == len(everything)
    assert report.writes == sum(len(t.pending_writes or ()) for t in everything)
    for kind, thread_id in threads.items():
        assert _history(target, serde, thread_id) == _history(official, serde, thread_id), kind
    assert {
        t.config["configurable"].get("checkpoint_ns", "")
        for t in target.list(_config(threads["nested"]))
    } - {""}, "the subgraph's namespace came over"

    # Run again: nothing changes, nothing is refused.
    assert import_threads(official, target, threads.values()) == ImportReport(
        3,
        sum(len(list(official.list(_config(t)))) for t in threads.values()),
        sum(
            len(t.pending_writes or ()) for i in threads.values() for t in official.list(_config(i))
        ),
    )
    for thread_id in threads.values():
        assert _history(target, serde, thread_id) == _history(official, serde, thread_id)

    # The paused threads resume on the target, from where the source left them.
    approval = approval_graph().compile(checkpointer=target)
    done = approval.invoke(Command(resume="yes"), _config(threads["paused"]))
    assert done["steps"] == ["draft", "approve", "send"]
    assert done["total"] == 101
    nested = _nested_graph().compile(checkpointer=target)
    assert nested.invoke(Command(resume="pro"), _config(threads["nested"])) == {
        "asked": "which plan?",
        "answer": "pro",
        "done": True,
    }
    forked = approval.get_state(_config(threads["forked"]))
    assert [m.content for m in forked.values["messages"]] == ["close ticket 7", "again"]


class _DeltaChat(TypedDict, total=False):
    messages: Annotated[list[Any], DeltaChannel(_messages_delta_reducer, snapshot_frequency=4)]


def _delta_chat(saver: BaseCheckpointSaver[Any]) -> Any:
    return reply_chat(saver, _DeltaChat, "reply-")


async def test_a_thread_whose_messages_are_a_delta_channel_comes_over_and_goes_on(
    sql: SqlConnection, official: SqliteSaver
) -> None:
    """A `DeltaChannel` stores its value only at snapshots: the rest is rebuilt from the
    pending writes since, which come over checkpoint by checkpoint."""
    thread_id = f"delta-{uuid.uuid4()}"
    there = _delta_chat(official)
    for turn in range(7):
        there.invoke(
            {"messages": [HumanMessage(f"turn {turn}", id=f"h{turn}")]}, _config(thread_id)
        )
    target = SqlCheckpointSaver(sql)

    import_threads(official, target, [thread_id])

    here = _delta_chat(target)
    assert here.get_state(_config(thread_id)).values == there.get_state(_config(thread_id)).values
    assert [s.values for s in here.get_state_history(_config(thread_id))] == [
        s.values for s in there.get_state_history(_config(thread_id))
    ]
    inputs = {"messages": [HumanMessage("one more", id="h7")]}
    assert here.invoke(inputs, _config(thread_id)) == there.invoke(inputs, _config(thread_id))
    assert len(here.get_state(_config(thread_id)).values["messages"]) == 16


async def test_an_async_source_comes_over_through_the_async_methods(sql: SqlConnection) -> None:
    source = InMemorySaver()
    thread_id = f"async-{uuid.uuid4()}"
    await (
        approval_graph()
        .compile(checkpointer=source)
        .ainvoke(request("refund order 9"), _config(thread_id))
    )
    target = SqlCheckpointSaver(sql)

    report = await aimport_threads(source, target)

    assert report == ImportReport(1, len(list(source.list(None))), report.writes)
    assert report.writes > 0  # the interrupt is a pending write
    assert _history(target, target.serde, thread_id) == _history(source, target.serde, thread_id)
    graph = approval_graph().compile(checkpointer=target)
    done = await graph.ainvoke(Command(resume="yes"), _config(thread_id))
    assert done["steps"] == ["draft", "approve", "send"]


async def test_the_embedded_file_moves_to_the_database_under_test(
    sql: SqlConnection, tmp_path: Path
) -> None:
    """From the project's own saver on a SQLite file, as a team outgrowing it would."""
    with SqlCheckpointSaver.from_conn_string(f"sqlite:///{tmp_path / 'embedded.sqlite'}") as old:
        old.setup()
        threads = _written_by(old)
        target = SqlCheckpointSaver(sql)
        import_threads(old, target, threads.values())
        for thread_id in threads.values():
            assert _history(target, old.serde, thread_id) == _history(old, old.serde, thread_id)


async def test_a_target_that_loses_pending_writes_is_caught_by_the_check(
    sql: SqlConnection, official: SqliteSaver
) -> None:
    thread_id = f"lossy-{uuid.uuid4()}"
    approval_graph().compile(checkpointer=official).invoke(
        request("refund order 5"), _config(thread_id)
    )
    target = SqlCheckpointSaver(sql)
    target.put_writes = lambda *args, **kwargs: None  # type: ignore[method-assign]

    with pytest.raises(ImportMismatchError, match=thread_id):
        import_threads(official, target, [thread_id])
    assert import_threads(official, target, [thread_id], verify=False).writes > 0


async def test_threads_of_postgres_saver_come_over_and_resume_here(
    sql: SqlConnection, sql_url: str
) -> None:
    """From the official saver a PostgreSQL team is most likely to leave, on a schema of its
    own (dropped after)."""
    url = sa.make_url(sql_url)
    if url.get_backend_name() != "postgresql":
        pytest.skip("PostgresSaver, the official saver imported from here, runs on PostgreSQL")
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    dsn = url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
    schema = f"official_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        with psycopg.connect(
            dsn,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={schema}",
        ) as conn:
            source = PostgresSaver(conn)  # type: ignore[arg-type]
            source.setup()
            threads = _written_by(source)
            target = SqlCheckpointSaver(sql)

            report = import_threads(source, target)

            assert report.threads == len(threads)
            serde = target.serde
            for kind, thread_id in threads.items():
                assert _history(target, serde, thread_id) == _history(source, serde, thread_id), (
                    kind
                )
        approval = approval_graph().compile(checkpointer=target)
        done = approval.invoke(Command(resume="yes"), _config(threads["paused"]))
        assert done["steps"] == ["draft", "approve", "send"]
        nested = _nested_graph().compile(checkpointer=target)
        assert nested.invoke(Command(resume="pro"), _config(threads["nested"]))["done"] is True
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def test_one_thread_id_given_as_a_string_is_refused_and_unknown_threads_are_not_counted(
    sql: SqlConnection, official: SqliteSaver
) -> None:
    target = SqlCheckpointSaver(sql)
    with pytest.raises(TypeError, match="an iterable of thread ids"):
        import_threads(official, target, "support-1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="an iterable of thread ids"):
        await aimport_threads(official, target, "support-1")  # type: ignore[arg-type]
    assert import_threads(official, target, ["nobody"]) == ImportReport(0, 0, 0)
