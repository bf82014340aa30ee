"""The LangGraph agent example (examples/langgraph_agent) run as its README says, on each
database: its schema command, two `agboss-sql worker` processes of
`langgraph_agent.app:app`, threads driven through its client; from the agent's table: an
approved thread charges once and answers; two approvals at once resume it once; a thread
cancelled while it waits for approval charges nothing; a worker SIGKILLed in the middle of
the charging step (after the charge committed, before the checkpoint) leaves the thread to
the other worker, which re-runs the step and does not charge again."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from saga_support import CLIENT_S, LEASE_MS, START_S, Worker, takeovers

from agboss_sql.contracts.errors import NotPausedError
from agboss_sql.runtime import Engine, WorkflowState
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import sync_url

pytest.importorskip("langgraph.graph")

from agboss_sql.runtime.graphs import thread_state

AGENT = Path(__file__).resolve().parents[2] / "examples" / "langgraph_agent"
"""The example's directory: the README runs every command from there."""

if str(AGENT) not in sys.path:
    sys.path.insert(0, str(AGENT))

RECEIPT_MS = 1_500
"""The charging step's tail after its charge (a slow receipt) in the kill test: long
enough that the kill, sent the moment the charge's event is read, lands inside the step."""

WAIT_S = 90.0
"""Bound of a thread's wait for the workers: a lease and a sweep (seconds) on an idle
machine; the bound is for a loaded CI runner, never a synchronisation."""


class AgentWorker(Worker):
    """An `agboss-sql worker` of the agent's app (the order saga's worker, another app)."""

    def __init__(self, url: str, stderr_path: Path, env: dict[str, str] | None = None) -> None:
        self.stderr_path = stderr_path
        self.events_path = stderr_path.with_suffix(".events.jsonl")
        self.events = []
        self.on_event = None
        self._changed = threading.Condition()
        command = [sys.executable, "-m", "agboss_sql.cli", "worker", "--url", url]
        command += ["--app", "langgraph_agent.app:app", "--lease-ms", str(LEASE_MS), "--events"]
        with open(stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                command,
                cwd=AGENT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def run_agent(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m <args>` from the example's directory, as the README runs it."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=AGENT,
        capture_output=True,
        text=True,
        timeout=CLIENT_S,
        check=False,
    )


def client(url: str, *args: str) -> str:
    """`python -m langgraph_agent.client --url URL <args>`'s output, once it exited 0."""
    done = run_agent("langgraph_agent.client", "--url", url, *args)
    assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def charges(url: str) -> list[tuple[str, int, str]]:
    """Every row of the agent's table: `(thread, cents, charged by)`."""
    from langgraph_agent.schema import charges as table

    engine = sa.create_engine(sync_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(table.c.thread_id, table.c.cents, table.c.charged_by).order_by(table.c.id)
            )
            return [(str(t), int(c), str(b)) for t, c, b in rows]
    finally:
        engine.dispose()


@pytest.fixture
def agent_url(sql: SqlConnection, sql_url: str) -> str:
    """The database under test: the agboss tables empty, the agent's table dropped and made
    again by `python -m langgraph_agent.schema URL`, as the README does."""
    from langgraph_agent.schema import metadata

    engine = sa.create_engine(sync_url(sql_url), poolclass=sa.NullPool)
    try:
        metadata.drop_all(engine)
    finally:
        engine.dispose()
    done = run_agent("langgraph_agent.schema", sql_url)
    assert done.returncode == 0 and done.stdout.strip() == "agent tables ready", done.stderr
    return sql_url


def start_workers(url: str, tmp_path: Path, env: dict[str, str] | None = None) -> list[Worker]:
    started: list[Worker] = []
    try:
        for index in range(2):
            started.append(AgentWorker(url, tmp_path / f"agent{index}.err", env))
        for worker in started:
            worker.wait_for(lambda e: e.get("kind") == "ready", START_S, "ready event")
    except BaseException:
        for worker in started:
            worker.stop()
        raise
    return started


@pytest.fixture
def workers(agent_url: str, tmp_path: Path) -> Iterator[list[Worker]]:
    """Two workers of the example's app, ready; stopped after the test."""
    started = start_workers(agent_url, tmp_path)
    try:
        yield started
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture
async def agent_client(agent_url: str) -> AsyncIterator[Engine]:
    """A client in this process (`Engine(app, work=False)`): starts and reads, runs nothing."""
    from langgraph_agent.app import app

    async with Engine(app, url=agent_url, work=False) as engine:
        yield engine


async def wait_state(engine: Engine, thread: str, state: WorkflowState) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while (await engine.status(thread)).state is not state:
        assert loop.time() < deadline, f"{thread} not {state.value} within {WAIT_S:.0f} s"
        await asyncio.sleep(0.05)


async def test_a_thread_approved_from_a_client_charges_once_on_a_worker(
    workers: list[Worker], agent_client: Engine, agent_url: str
) -> None:
    assert client(agent_url, "start", "t-1", "--items", "book,pen") == "started t-1\n"
    await wait_state(agent_client, "t-1", WorkflowState.PAUSED)
    pause = (await agent_client.status("t-1")).pending_pause
    assert pause is not None and pause.request == {"charge_cents": 1500}
    assert charges(agent_url) == []
    assert client(agent_url, "approve", "t-1") == "approved t-1\n"
    result = client(agent_url, "result", "t-1", "--timeout", str(WAIT_S))
    assert json.loads(result) == "Done: charged 1500 cents."
    [(thread, cents, by)] = charges(agent_url)
    assert (thread, cents) == ("t-1", 1500)
    assert by in {worker.instance_id for worker in workers}
    messages = (await thread_state(agent_client, "t-1")).values["messages"]
    assert messages[0].content == "buy book, pen"
    assert messages[-1].content == "Done: charged 1500 cents."


async def test_two_approvals_at_once_resume_the_thread_once_and_a_cancel_charges_nothing(
    workers: list[Worker], agent_client: Engine, agent_url: str
) -> None:
    from langgraph_agent.app import app

    await agent_client.start("agent", {"messages": ["buy lamp"], "items": ["lamp"]}, id="t-2")
    await agent_client.start("agent", {"messages": ["buy pen"], "items": ["pen"]}, id="t-3")
    await wait_state(agent_client, "t-2", WorkflowState.PAUSED)
    await wait_state(agent_client, "t-3", WorkflowState.PAUSED)
    async with Engine(app, url=agent_url, work=False) as other:
        answers = await asyncio.gather(
            agent_client.resume("t-2", {"approved": True}),
            other.resume("t-2", {"approved": True}),
            return_exceptions=True,
        )
        assert sorted(type(a).__name__ for a in answers) == ["NoneType", "NotPausedError"]
        assert await other.cancel("t-3")
    assert await agent_client.result("t-2", timeout_s=WAIT_S) == "Done: charged 4500 cents."
    await wait_state(agent_client, "t-3", WorkflowState.CANCELLED)
    assert [(t, c) for t, c, _by in charges(agent_url)] == [("t-2", 4500)]
    with pytest.raises(NotPausedError):
        await agent_client.resume("t-2", {"approved": True})


async def test_a_worker_killed_mid_charge_leaves_the_thread_to_the_other_and_charges_once(
    agent_url: str, agent_client: Engine, tmp_path: Path
) -> None:
    workers = start_workers(agent_url, tmp_path, {"AGENT_RECEIPT_MS": str(RECEIPT_MS)})
    try:
        killed: list[str] = []

        def kill_after_the_charge(worker: Worker, event: dict[str, Any]) -> None:
            step = str(event.get("step", ""))
            if event.get("kind") == "effect" and step.endswith("/charge") and not killed:
                killed.append(worker.instance_id)
                worker.kill()  # the charge committed; the step's writes never will

        for worker in workers:
            worker.on_event = kill_after_the_charge
        await agent_client.start("agent", {"messages": ["buy book"], "items": ["book"]}, id="t-4")
        await wait_state(agent_client, "t-4", WorkflowState.PAUSED)
        await agent_client.resume("t-4", {"approved": True})
        assert await agent_client.result("t-4", timeout_s=WAIT_S) == "Done: charged 1200 cents."
        [dead] = killed
        [survivor] = [w.instance_id for w in workers if w.instance_id != dead]
        # Charged once, by the worker that died; the survivor took the thread over from it,
        # ran the charging step again and found the charge stored.
        assert charges(agent_url) == [("t-4", 1200, dead)]
        assert ("t-4", survivor, dead) in takeovers(agent_url)
        replayed = [
            e
            for w in workers
            if w.instance_id == survivor
            for e in w.snapshot()
            if e.get("kind") == "effect" and str(e.get("step", "")).endswith("/charge")
        ]
        assert [e["replayed"] for e in replayed] == [True]
    finally:
        for worker in workers:
            worker.stop()
