"""`agboss-sql import-threads`: threads of LangGraph's SqliteSaver brought over into the
checkpoint saver on the database under test, resumed there; a source that is not there, or
not readable, refused before anything is written, naming it."""

from __future__ import annotations

import socket
import sqlite3
import sys
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from agboss_sql.cli import main
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection

CHECKPOINT_TESTS = Path(__file__).resolve().parents[1] / "checkpoint"
if str(CHECKPOINT_TESTS) not in sys.path:
    sys.path.insert(0, str(CHECKPOINT_TESTS))

from checkpoint_graphs import approval_graph  # noqa: E402
from test_import import _config, _history, _nested_graph, _written_by  # noqa: E402


def _official_file(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        threads = _written_by(SqliteSaver(conn))
        conn.commit()
    finally:
        conn.close()
    return threads


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["import-threads", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


async def test_threads_of_a_sqlite_saver_file_come_over_and_resume(
    sql: SqlConnection, sql_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    official = tmp_path / "checkpoints.sqlite"
    threads = _official_file(official)

    status, out, err = _run(capsys, "--from", f"sqlite:///{official}", "--url", sql_url)

    assert (status, err) == (0, "")
    assert out.startswith(f"imported 3 threads from sqlite:///{official} into ")
    assert "13 checkpoints, 26 pending writes; each thread's newest checkpoints checked" in out
    target = SqlCheckpointSaver(sql)
    conn = sqlite3.connect(official, check_same_thread=False)
    try:
        source = SqliteSaver(conn)
        for thread_id in threads.values():
            assert _history(target, target.serde, thread_id) == _history(
                source, target.serde, thread_id
            )
    finally:
        conn.close()
    done = (
        approval_graph()
        .compile(checkpointer=target)
        .invoke(Command(resume="yes"), _config(threads["paused"]))
    )
    assert done["steps"] == ["draft", "approve", "send"]
    nested = _nested_graph().compile(checkpointer=target)
    assert nested.invoke(Command(resume="pro"), _config(threads["nested"]))["done"] is True

    # One thread again, unchecked: written as it was.
    status, out, _ = _run(
        capsys,
        "--from", f"sqlite:///{official}", "--url", sql_url,
        "--thread", threads["forked"], "--no-verify",
    )  # fmt: skip
    assert status == 0
    assert out.startswith("imported 1 threads") and out.rstrip().endswith("pending writes")


def test_a_source_that_is_not_there_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "target.sqlite"
    status, out, err = _run(
        capsys, "--from", f"sqlite:///{tmp_path / 'nope.sqlite'}", "--url", f"sqlite:///{target}"
    )
    assert (status, out) == (1, "")
    assert f"--from sqlite:///{tmp_path / 'nope.sqlite'}: no SQLite file there" in err
    assert not target.exists()


def test_a_source_without_the_savers_tables_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    target = tmp_path / "target.sqlite"
    status, out, err = _run(capsys, "--from", f"sqlite:///{empty}", "--url", f"sqlite:///{target}")
    assert (status, out) == (1, "")
    assert f"cannot read the threads on --from sqlite:///{empty}: OperationalError" in err
    assert not target.exists()


def test_a_source_url_of_another_database_kind_is_a_misuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = _run(
        capsys, "--from", "oracle://host/db", "--url", f"sqlite:///{tmp_path / 't'}"
    )
    assert status == 2
    assert "--from oracle://host/db: not a SQLite, PostgreSQL or MySQL URL" in err


def test_a_server_source_that_never_answers_ends_within_the_connect_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A listener that accepts the connection and says nothing: the source's connect is
    bounded by `Timeouts.connect_ms` (LangGraph's own `from_conn_string` would wait on)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        status, out, err = _run(
            capsys,
            "--from", f"postgresql://nobody@127.0.0.1:{port}/db",
            "--url", f"sqlite:///{tmp_path / 'target.sqlite'}",
        )  # fmt: skip
    assert (status, out) == (1, "")
    assert f"cannot read the threads on --from postgresql://nobody@127.0.0.1:{port}/db" in err
    assert "StoreTimeoutError" in err and "Timeouts.connect_ms" in err
    assert not (tmp_path / "target.sqlite").exists()
