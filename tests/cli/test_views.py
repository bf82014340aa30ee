"""`agboss-sql trees`, `show` and `queue` on a database that a working engine left trees in:
each run once as a user runs it (a process of its own, output to a pipe, and on a
terminal), its variants through `main` in this process; what they print, as JSON and as
tables, their exit statuses, and that they never create a database."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agboss_sql.cli import main
from agboss_sql.lab.database import truncate_all
from agboss_sql.runtime import Engine
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from views_app import app  # noqa: E402

RUN_S = 60.0
"""A command's bound: a fresh interpreter, SQLAlchemy imported, a few reads (seconds)."""

WAIT_S = 30.0
"""The trees' runs on one engine: milliseconds each, seconds on a loaded machine."""


def agboss(*argv: str) -> subprocess.CompletedProcess[str]:
    """`agboss-sql ARGV` in a process of its own, its output captured (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "agboss_sql.cli", *argv],
        capture_output=True,
        text=True,
        timeout=RUN_S,
        stdin=subprocess.DEVNULL,
    )


def here(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`agboss-sql ARGV` run in this process (`main`, as the console script calls it): its
    exit status, standard output and standard error. A process of its own costs seconds
    on a loaded machine: each command runs once that way (`agboss`), its variants here."""
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def document(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    status, out, err = here(capsys, *argv, "--json")
    assert status == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def trees(sql_url: str) -> str:
    """Three trees an engine left (made once for the module's tests, which only read):
    `t-paused` waiting for approval after its two children, `t-done` approved and
    succeeded, `t-cancelled` cancelled while it waited (its step's undo run)."""
    asyncio.run(_leave_trees(sql_url))
    return sql_url


async def _leave_trees(sql_url: str) -> None:
    async with SqlConnection(sql_url) as connection:
        await truncate_all(connection)
    paused: dict[str, asyncio.Event] = {}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("kind") == "paused":
            paused.setdefault(event["tree"], asyncio.Event()).set()

    async with Engine(app, url=sql_url, lease_ms=3_000, on_event=on_event) as engine:
        for tree in ("t-paused", "t-done"):
            paused.setdefault(tree, asyncio.Event())
            await engine.start("tree", 2, id=tree)
        for tree in ("t-paused", "t-done"):
            await asyncio.wait_for(paused[tree].wait(), WAIT_S)
        await engine.resume("t-done", {"approved": True})
        assert (await engine.result("t-done", timeout_s=WAIT_S))["decision"] == {"approved": True}
        cancelled = await engine.start("tree", 3, id="t-cancelled")
        await asyncio.wait_for(paused.setdefault("t-cancelled", asyncio.Event()).wait(), WAIT_S)
        assert await engine.cancel("t-cancelled")
        with pytest.raises(Exception, match="cancel"):
            await cancelled.result(timeout_s=WAIT_S)


def test_trees_lists_each_tree_with_its_holder_and_waits(
    trees: str, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = document(capsys, "trees", "--url", trees)
    by_id = {row["tree"]: row for row in listed["trees"]}
    assert set(by_id) == {"t-paused", "t-done", "t-cancelled"}
    waiting = by_id["t-paused"]
    assert waiting["status"] == "paused" and waiting["workflow"] == "tree"
    assert waiting["pauses"] == ["t-paused:approval#1"]
    assert waiting["children_pending"] == 0
    assert waiting["holder"] and waiting["lease"] == "released" and waiting["epoch"] >= 2
    assert by_id["t-done"]["status"] == "succeeded" and by_id["t-done"]["lease"] == "finished"
    assert by_id["t-done"]["pauses"] == []
    assert by_id["t-cancelled"]["status"] == "cancelled"
    assert all(0 <= row["age_ms"] < 3_600_000 for row in listed["trees"])  # made just now
    # Most recently changed first.
    updated = [row["updated_at"] for row in listed["trees"]]
    assert updated == sorted(updated, reverse=True)

    only = document(capsys, "trees", "--url", trees, "--status", "succeeded")
    assert [row["tree"] for row in only["trees"]] == ["t-done"]
    assert document(capsys, "trees", "--url", trees, "--tenant", "nobody")["trees"] == []
    assert len(document(capsys, "trees", "--url", trees, "--limit", "1")["trees"]) == 1

    text = agboss("trees", "--url", trees)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[1] == "3 trees, most recently changed first"
    assert lines[2].split() == [
        "tenant", "tree", "workflow", "status", "holder", "epoch", "lease", "age",
        "children", "pending", "pauses", "pending",
    ]  # fmt: skip
    row = next(line.split() for line in lines if " t-paused " in line)
    assert row[:4] == ["default", "t-paused", "tree", "paused"]
    assert row[-1] == "t-paused:approval#1"


def test_show_puts_a_tree_in_one_timeline(trees: str, capsys: pytest.CaptureFixture[str]) -> None:
    view = document(capsys, "show", "--url", trees, "t-cancelled")
    assert view["status"] == "cancelled" and view["input"] == 3
    assert [(s["key"], s["name"], s["kind"], s["result"]) for s in view["steps"]][:1] == [
        ("double#1", "double", "step", 6)
    ]
    root_step = next(s for s in view["steps"] if s["execution"] == "t-cancelled")
    # The root yielded for its children and came back at a later epoch, which answered
    # its step from the store.
    assert root_step["epoch"] == 1 and root_step["replays"] >= 1
    assert sorted(c["id"] for c in view["children"]) == [
        f"t-cancelled/leaves#1.{i}" for i in range(3)
    ]
    assert {c["status"] for c in view["children"]} == {"finished"}
    assert [(p["id"], p["status"]) for p in view["pauses"]] == [
        ("t-cancelled:approval#1", "cancelled")
    ]
    assert [(u["undo"], u["done"]) for u in view["compensations"]] == [
        ("undo/t-cancelled/double#1", True)
    ]
    kinds = [(m["execution"], m["kind"]) for m in view["lease_moves"]]
    assert ("t-cancelled", "acquired") in kinds and ("t-cancelled", "yielded") in kinds
    assert view["leases"]["t-cancelled"]["state"] == "finished"
    assert ("t-cancelled/leaves#1.0", "acquired") in kinds
    times = [moment["at"] for moment in view["timeline"]]
    assert times == sorted(times)
    what = [moment["what"] for moment in view["timeline"]]
    assert "created" in what  # not always first: rows are stamped by more than one clock
    for expected in ("step", "child queued", "child claimed", "child finished", "paused",
                     "lease yielded", "undo", "cancelled"):  # fmt: skip
        assert expected in what, (expected, what)

    text = agboss("show", "--url", trees, "t-paused")
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert out.startswith("tree default/t-paused: tree, paused\n")
    assert "  input: 2\n" in out
    assert "2 children (2 finished), 1 pauses (1 pending)" in out
    assert "time  " in out and " since start " in out
    assert "paused " in out and "t-paused:approval#1" in out


def test_show_of_a_tree_that_is_not_there_says_how_to_list_them(
    trees: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = here(capsys, "show", "--url", trees, "t-never")
    assert status == 1 and out == ""
    assert err.startswith("agboss-sql show: no tree 't-never' of tenant 'default' in ")
    assert "`agboss-sql trees --url " in err and len(err.splitlines()) == 1
    status, _out, err = here(capsys, "show", "--url", trees, "t-done", "--tenant", "another")
    assert status == 1 and "of tenant 'another'" in err


def test_queue_counts_children_by_state_and_instance(
    trees: str, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = document(capsys, "queue", "--url", trees)
    assert queue["depth"] == {"queued": 0, "running": 0, "waiting": 0, "finished": 7}
    assert queue["oldest_queued"] is None and queue["oldest_queued_ms"] is None
    assert queue["wakes_owed"] == 0
    (instance,) = queue["claims"]
    assert queue["claims"][instance] == {"finished": 7}
    assert queue["trees"] == {"cancelled": 1, "paused": 1, "succeeded": 1}
    text = agboss("queue", "--url", trees)
    assert text.returncode == 0, text.stderr
    assert "oldest waiting: none (no child is queued)" in text.stdout
    assert any(line.split() == ["finished", "7"] for line in text.stdout.splitlines())
    assert any(line.split() == [instance, "7"] for line in text.stdout.splitlines())


def test_the_views_never_create_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nothing.sqlite"
    done = agboss("trees", "--url", f"sqlite:///{missing}")
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr == (
        f"agboss-sql trees: no database at {missing} (this command never creates one): "
        f"`agboss-sql upgrade --url sqlite:///{missing}` creates and migrates it\n"
    )
    for argv in (["queue"], ["show", "t-1"]):
        status, _out, err = here(capsys, *argv, "--url", f"sqlite:///{missing}")
        assert status == 1, err
        assert f"no database at {missing} (this command never creates one)" in err
    assert not missing.exists()
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    status, _out, err = here(capsys, "trees", "--url", f"sqlite:///{empty}")
    assert status == 1 and "has no agboss schema revision recorded" in err
    assert migrate.current(f"sqlite:///{empty}") is None  # nothing was made
    with pytest.raises(SystemExit) as misused:
        main(["trees", "--limit", "0", "--url", f"sqlite:///{empty}"])
    assert misused.value.code == 2


def in_terminal(code: str) -> str:
    """What `python -c code` prints on a terminal (a pseudo-terminal of 200 columns)."""
    parent, child = pty.openpty()
    env = {**os.environ, "COLUMNS": "200", "LINES": "50", "TERM": "xterm"}
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=child, stderr=child, env=env
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # the terminal closed: the process is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(parent)
    assert process.wait(timeout=RUN_S) == 0, b"".join(chunks)
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # the colours and bold


def test_on_a_terminal_the_tables_are_drawn_with_rich_or_plain_without_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'views.sqlite'}"
    migrate.upgrade(url)
    run = (
        f"import sys; from agboss_sql.cli import main; sys.exit(main(['queue', '--url', {url!r}]))"
    )
    drawn = in_terminal(run)
    assert "┃ state    ┃ children ┃" in drawn and "│ queued   │ 0        │" in drawn
    plain = in_terminal("import sys; sys.modules['rich'] = None; " + run)
    assert "┃" not in plain and "│" not in plain
    assert "state     children" in plain and "queued    0" in plain
