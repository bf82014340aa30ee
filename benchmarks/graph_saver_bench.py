"""Checkpoint savers measured through real compiled LangGraph graphs: ours against the
official savers, in one run, on each database given.

    python benchmarks/graph_saver_bench.py --url sqlite:////tmp/bench/bench.sqlite \
        --url postgresql://postgres@127.0.0.1:5432/bench --url mysql://root@127.0.0.1:3306/bench

(`tox -e bench-saver` runs it on the three local databases.) What a user's graph runs, timed
from outside the saver:

- `invoke 300 threads`: a 4-node graph (`a → b → c → d`, a small state) invoked once on
  each of 300 threads, sync (`invoke`) and async (`ainvoke`);
- `chat 60 turns`: a chat graph (`messages` under `add_messages`, one reply node) on one
  thread, 60 turns, sync and async;
- `delta chat 60 turns`: the same chat with `messages` a `DeltaChannel` (LangGraph's
  `_messages_delta_reducer`, a snapshot every 100 updates): each checkpoint stores the turn's
  messages as pending writes only, and each turn's load rebuilds the list from the nearest
  snapshot and the writes since (`get_delta_channel_history`), sync and async;
- `history cold`: a thread of about 210 checkpoints (the chat graph, and the small
  4-node graph) written by one saver, then read back whole by `get_state_history` /
  `aget_state_history` through a new saver instance on a new connection (what a new
  process reads), opening it included;
- `20 tasks x 30 ainvoke`: 20 asyncio tasks each invoking the 4-node graph 30 times.

Contestants: `SqlCheckpointSaver` (sync paths: `from_conn_string` + `with`; async: `async
with`) against `SqliteSaver` / `AsyncSqliteSaver` on SQLite (at their default durability,
`synchronous=FULL`, and at ours, `synchronous=NORMAL`, both shown), `PostgresSaver` /
`AsyncPostgresSaver` on PostgreSQL, and the community `PyMySQLSaver` / `AIOMySQLSaver`
(`langgraph-checkpoint-mysql`) on MySQL/MariaDB, each when installed; and *the graph alone*:
a saver that costs nothing (`FreeSaver` keeps the very objects it is given in a dict and
hands them back, with no serializer and no database; a new instance over the same dict
reads the cold history). The official saver's time over the graph alone is printed as the
path's *ceiling*: the most any saver could reach there, since the graph's own work is left
when the saver costs nothing. On the two sync write paths, *the durable floor* too
(`DurableFloorSaver`, `graph_saver_floor.py`): one raw `INSERT` committed per write call,
what it was given serialized as the official savers do, reads from memory. The official
saver's time over it is the path's *durable ceiling*: the most a saver that commits each
call before it returns could reach there (`--no-ceiling` leaves both out). Each repetition
starts from empty tables (a new file on SQLite), and the contestants take turns in an order
that alternates between repetitions. Each timed part starts after a full collection of the
garbage collector, and a row says how many full collections each contestant met while timed
when any did: one takes some 100 ms in this process, more than a whole chat turn, and
without the collection first a contestant could pay for one its predecessor made due. Ratio = their time / ours (above 1: ours is faster);
the table gives the median over the repetitions and the range. `uptime`'s load is printed
first: figures taken on a loaded machine say so.

`--costs N` first makes the saver calls of one sync invoke again N times apart from the graph,
for each saver: CPU per kind of call and, on SQLite, the log frames (pages) each commit
writes; and times the graph with a saver that stores nothing (what no saver can go under).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import gc
import itertools
import operator
import os
import shutil
import sqlite3
import statistics
import struct
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import sqlalchemy as sa
from graph_saver_floor import FLOOR_TABLE, DurableFloorSaver, FreeSaver
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer, add_messages
from sqlalchemy.engine import URL, make_url

from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints
from agboss_sql.testing.database import sync_url

OURS = "SqlCheckpointSaver"
# A saver that costs nothing (FreeSaver): the graph's own time. The official saver's time
# over it is the most any saver could reach on a path.
ALONE = "graph alone"
# The least a saver that commits each call before it returns does (DurableFloorSaver), on
# the sync write paths: the official saver's time over it is the most such a saver could
# reach there.
FLOOR = "durable floor"


# --- the graphs ------------------------------------------------------------------------


class Small(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]
    note: str


def small_graph() -> StateGraph:
    builder = StateGraph(Small)
    names = ["a", "b", "c", "d"]
    for name in names:
        builder.add_node(
            name,
            lambda state, name=name: {
                "n": state["n"] + 1,
                "log": [name],
                "note": f"{name} saw {state['n']} " * 8,
            },
        )
    builder.add_edge(START, "a")
    for first, then in itertools.pairwise(names):
        builder.add_edge(first, then)
    builder.add_edge("d", END)
    return builder


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


class DeltaChat(TypedDict):
    messages: Annotated[list[Any], DeltaChannel(_messages_delta_reducer)]


def chat_graph(delta: bool = False) -> StateGraph:
    # `Any`: LangGraph would take an annotated state as the node's input schema.
    def reply(state: Any) -> dict[str, Any]:
        last = state["messages"][-1].content
        return {
            "messages": [
                AIMessage(content=f"About '{last[:40]}': here is what I found, step by step. " * 3)
            ]
        }

    builder = StateGraph(DeltaChat if delta else Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder


def small_input() -> dict[str, Any]:
    return {"n": 0, "log": [], "note": ""}


def chat_input(turn: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=f"Turn {turn}: my order arrived damaged. " * 3)]}


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


# --- the contestants ---------------------------------------------------------------------


class Contestant:
    """One saver kind on one database: opens a sync or async saver on a fresh database."""

    def __init__(self, name: str, url: URL, *, normal: bool = False) -> None:
        self.name = name
        self.url = url
        self.normal = normal  # SQLite official savers at synchronous=NORMAL
        # ALONE: this repetition's tuples, which every FreeSaver of it shares (a new
        # instance reads what an earlier one kept, as a new saver reads a database)
        self.kept: dict[tuple[str, str], dict[str, Any]] = {}

    @property
    def label(self) -> str:
        return f"{self.name} (NORMAL)" if self.normal else self.name

    def conn_string(self) -> str:
        backend = self.url.get_backend_name()
        plain = self.url.set(drivername=backend)
        if backend == "sqlite":
            return self.url.database or ""
        return plain.render_as_string(hide_password=False)

    @contextlib.contextmanager
    def sync_saver(self) -> Iterator[Any]:
        backend = self.url.get_backend_name()
        if self.name == OURS:
            with SqlCheckpointSaver.from_conn_string(self.url) as saver:
                yield saver
        elif self.name == ALONE:
            yield FreeSaver(self.kept)
        elif self.name == FLOOR:
            floor = DurableFloorSaver(self.url, self.kept)
            try:
                yield floor
            finally:
                floor.close()
        elif backend == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite3.connect(self.conn_string(), check_same_thread=False)
            if self.normal:
                conn.execute("PRAGMA synchronous=NORMAL")
            try:
                saver = SqliteSaver(conn)
                saver.setup()
                yield saver
            finally:
                conn.close()
        elif backend == "postgresql":
            from langgraph.checkpoint.postgres import PostgresSaver

            with PostgresSaver.from_conn_string(self.conn_string()) as saver:
                saver.setup()
                yield saver
        else:
            from langgraph.checkpoint.mysql.pymysql import PyMySQLSaver

            with PyMySQLSaver.from_conn_string(self.conn_string()) as saver:
                saver.setup()
                yield saver

    @contextlib.asynccontextmanager
    async def async_saver(self) -> AsyncIterator[Any]:
        backend = self.url.get_backend_name()
        if self.name == OURS:
            async with SqlCheckpointSaver.from_conn_string(self.url) as saver:
                yield saver
        elif self.name == ALONE:
            yield FreeSaver(self.kept)
        elif backend == "sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            conn = await aiosqlite.connect(self.conn_string())
            if self.normal:
                await conn.execute("PRAGMA synchronous=NORMAL")
            try:
                saver = AsyncSqliteSaver(conn)
                await saver.setup()
                yield saver
            finally:
                await conn.close()
        elif backend == "postgresql":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            async with AsyncPostgresSaver.from_conn_string(self.conn_string()) as saver:
                await saver.setup()
                yield saver
        else:
            from langgraph.checkpoint.mysql.aio import AIOMySQLSaver

            async with AIOMySQLSaver.from_conn_string(self.conn_string()) as saver:
                await saver.setup()
                yield saver


def official_names(url: URL) -> list[tuple[str, str]]:
    """(name, module) of the official savers of the database, to import."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        return [("SqliteSaver", "langgraph.checkpoint.sqlite")]
    if backend == "postgresql":
        return [("PostgresSaver", "langgraph.checkpoint.postgres")]
    return [("PyMySQLSaver", "langgraph.checkpoint.mysql.pymysql")]


# --- workloads: each answers seconds (and how many units it ran) -------------------------

_clock = {"full": 0}


def start_clock() -> float:
    """Where a workload's timed part starts: after a full collection of the cyclic garbage
    collector, so that no contestant pays for one its predecessor made due (in this process,
    with LangGraph's imports, a full collection walks about 160,000 objects and takes some
    100 ms; reading a chat history back starts one every few hundred checkpoints)."""
    gc.collect()
    _clock["full"] = gc.get_stats()[2]["collections"]
    return time.perf_counter()


def full_collections() -> int:
    """The full collections since the latest `start_clock`."""
    return gc.get_stats()[2]["collections"] - _clock["full"]


def invoke_threads(c: Contestant, threads: int) -> tuple[float, int]:
    with c.sync_saver() as saver:
        graph = small_graph().compile(checkpointer=saver)
        started = start_clock()
        for _ in range(threads):
            graph.invoke(small_input(), config(str(uuid.uuid4())))
        return time.perf_counter() - started, threads


def ainvoke_threads(c: Contestant, threads: int) -> tuple[float, int]:
    async def go() -> float:
        async with c.async_saver() as saver:
            graph = small_graph().compile(checkpointer=saver)
            started = start_clock()
            for _ in range(threads):
                await graph.ainvoke(small_input(), config(str(uuid.uuid4())))
            return time.perf_counter() - started

    return asyncio.run(go()), threads


def chat_turns(c: Contestant, turns: int, delta: bool = False) -> tuple[float, int]:
    with c.sync_saver() as saver:
        graph = chat_graph(delta).compile(checkpointer=saver)
        cfg = config(str(uuid.uuid4()))
        started = start_clock()
        for turn in range(turns):
            graph.invoke(chat_input(turn), cfg)
        return time.perf_counter() - started, turns


def achat_turns(c: Contestant, turns: int, delta: bool = False) -> tuple[float, int]:
    async def go() -> float:
        async with c.async_saver() as saver:
            graph = chat_graph(delta).compile(checkpointer=saver)
            cfg = config(str(uuid.uuid4()))
            started = start_clock()
            for turn in range(turns):
                await graph.ainvoke(chat_input(turn), cfg)
            return time.perf_counter() - started

    return asyncio.run(go()), turns


def _write_history(c: Contestant, chat: bool, checkpoints_wanted: int) -> str:
    thread = str(uuid.uuid4())
    with c.sync_saver() as saver:
        graph = (chat_graph() if chat else small_graph()).compile(checkpointer=saver)
        # A chat turn adds 2 checkpoints, an invoke of the 4-node graph 6.
        for turn in range(checkpoints_wanted // (2 if chat else 6)):
            graph.invoke(chat_input(turn) if chat else small_input(), config(thread))
    return thread


def history_cold(c: Contestant, chat: bool, wanted: int) -> tuple[float, int]:
    thread = _write_history(c, chat, wanted)
    started = start_clock()
    with c.sync_saver() as saver:
        graph = (chat_graph() if chat else small_graph()).compile(checkpointer=saver)
        count = sum(1 for _ in graph.get_state_history(config(thread)))
    return time.perf_counter() - started, count


def ahistory_cold(c: Contestant, chat: bool, wanted: int) -> tuple[float, int]:
    thread = _write_history(c, chat, wanted)

    async def go() -> tuple[float, int]:
        started = start_clock()
        async with c.async_saver() as saver:
            graph = (chat_graph() if chat else small_graph()).compile(checkpointer=saver)
            count = 0
            async for _ in graph.aget_state_history(config(thread)):
                count += 1
        return time.perf_counter() - started, count

    return asyncio.run(go())


def tasks_ainvoke(c: Contestant, tasks: int, each: int) -> tuple[float, int]:
    async def go() -> float:
        async with c.async_saver() as saver:
            graph = small_graph().compile(checkpointer=saver)

            async def task() -> None:
                for _ in range(each):
                    await graph.ainvoke(small_input(), config(str(uuid.uuid4())))

            started = start_clock()
            await asyncio.gather(*(task() for _ in range(tasks)))
            return time.perf_counter() - started

    return asyncio.run(go()), tasks * each


Workload = Callable[[Contestant], tuple[float, int]]


def durable_path(path: str) -> bool:
    """A sync write path, where the durable floor is measured: its calls are sync, and
    its time is the writes' (a cold history's is the reads', which the floor answers from
    memory as the graph alone does)."""
    return path.startswith(("invoke,", "chat ")) and path.endswith("(sync)")


def workloads(scale: float) -> list[tuple[str, str, Workload]]:
    """(path, unit, run) of every path measured."""
    threads = max(1, int(600 * scale))
    turns = max(1, int(120 * scale))
    history = max(12, min(210, int(420 * scale)))
    tasks, each = 20, max(1, int(60 * scale))
    return [
        (f"invoke, 4-node graph x {threads} threads (sync)", "invoke", lambda c: invoke_threads(c, threads)),
        (f"ainvoke, 4-node graph x {threads} threads", "invoke", lambda c: ainvoke_threads(c, threads)),
        (f"chat add_messages, {turns} turns (sync)", "turn", lambda c: chat_turns(c, turns)),
        (f"chat add_messages, {turns} turns (async)", "turn", lambda c: achat_turns(c, turns)),
        (f"delta chat DeltaChannel, {turns} turns (sync)", "turn", lambda c: chat_turns(c, turns, True)),
        (f"delta chat DeltaChannel, {turns} turns (async)", "turn", lambda c: achat_turns(c, turns, True)),
        (f"get_state_history cold, chat ~{history} (sync)", "checkpoint", lambda c: history_cold(c, True, history)),
        (f"get_state_history cold, small ~{history} (sync)", "checkpoint", lambda c: history_cold(c, False, history)),
        (f"aget_state_history cold, chat ~{history}", "checkpoint", lambda c: ahistory_cold(c, True, history)),
        (f"aget_state_history cold, small ~{history}", "checkpoint", lambda c: ahistory_cold(c, False, history)),
        (f"{tasks} tasks x {each} ainvoke", "invoke", lambda c: tasks_ainvoke(c, tasks, each)),
    ]  # fmt: skip


# --- fresh databases ----------------------------------------------------------------------

OFFICIAL_TABLES = ("checkpoint_writes", "checkpoint_blobs", "checkpoints", "writes", FLOOR_TABLE)


def fresh(url: URL, repetition: int, contestant: Contestant) -> URL:
    """Empty tables for one repetition of one contestant: a new SQLite file, or the server
    tables emptied (ours created if absent)."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        base = Path(url.database or "bench.sqlite")
        folder = base.parent / f"run-{repetition}-{contestant.label.replace(' ', '_')}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        url = url.set(database=str(folder / base.name))
    engine = sa.create_engine(sync_url(url.render_as_string(hide_password=False)))
    try:
        ours = [checkpoints, checkpoint_blobs, checkpoint_writes]
        checkpoints.metadata.create_all(engine, tables=ours, checkfirst=True)
        if backend != "sqlite":
            present = set(sa.inspect(engine).get_table_names())
            with engine.begin() as conn:
                for table in [t.name for t in reversed(ours)] + list(OFFICIAL_TABLES):
                    if table in present:
                        conn.exec_driver_sql(f"DELETE FROM {table}")
    finally:
        engine.dispose()
    return url


def installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


# --- the run ------------------------------------------------------------------------------


def measure(
    urls: list[URL],
    repetitions: int,
    scale: float,
    *,
    ceiling: bool = True,
    paths: list[str] | None = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for url in urls:
        backend = url.get_backend_name()
        theirs: list[Contestant] = []
        for name, module in official_names(url):
            if not installed(module):
                print(f"# {backend}: {name} not installed ({module}); ours alone")
                continue
            theirs.append(Contestant(name, url))
            if backend == "sqlite":
                theirs.append(Contestant(name, url, normal=True))
        if ceiling:
            theirs.append(Contestant(ALONE, url))
            theirs.append(Contestant(FLOOR, url))
        ours = Contestant(OURS, url)
        for path, unit, run in workloads(scale):
            if paths and not any(p in path for p in paths):
                continue
            here = [c for c in theirs if c.name != FLOOR or durable_path(path)]
            times: dict[str, list[float]] = {c.label: [] for c in [ours, *here]}
            full: dict[str, list[int]] = {c.label: [] for c in [ours, *here]}
            units = 0
            for repetition in range(repetitions):
                order = [ours, *here] if repetition % 2 == 0 else [*here, ours]
                for contestant in order:
                    if contestant.name in (ALONE, FLOOR):
                        contestant.kept = {}
                    if contestant.name != ALONE:
                        contestant.url = fresh(url, repetition, contestant)
                    seconds, ran = run(contestant)
                    full[contestant.label].append(full_collections())
                    if units and ran != units:
                        # Per-unit times of different work would not compare.
                        raise RuntimeError(
                            f"{path}: {contestant.label} ran {ran} units, not {units}"
                        )
                    units = ran
                    times[contestant.label].append(seconds)
            row = {
                "database": backend,
                "path": path,
                "unit": unit,
                "units": units,
                "times": times,
                "full collections": full,
            }
            rows.append(row)
            print_row(row)
    return rows


def print_row(row: dict[str, Any]) -> None:
    times: dict[str, list[float]] = row["times"]
    ours = times[OURS]
    ours_ms = statistics.median(ours) * 1000 / row["units"]
    cells = [f"{row['database']:<10} {row['path']:<48} ours {ours_ms:8.3f} ms/{row['unit']}"]
    for label, theirs in times.items():
        if label == OURS:
            continue
        ratios = sorted(t / o for t, o in zip(theirs, ours, strict=True))
        cells.append(
            f"| {label}: {statistics.median(theirs) * 1000 / row['units']:8.3f} ms, ratio "
            f"{statistics.median(ratios):5.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
        )
    for under, heading in (
        (ALONE, "ceiling (theirs / graph alone)"),
        (FLOOR, "durable ceiling (theirs / durable floor)"),
    ):
        if under not in times:
            continue
        ceilings = []
        for label, theirs in times.items():
            if label in (OURS, ALONE, FLOOR):
                continue
            each = sorted(t / f for t, f in zip(theirs, times[under], strict=True))
            ceilings.append(f"{label} {statistics.median(each):.2f} ({each[0]:.2f}-{each[-1]:.2f})")
        if ceilings:
            cells.append(f"| {heading}: " + ", ".join(ceilings))
    full: dict[str, list[int]] = row.get("full collections", {})
    if any(any(counts) for counts in full.values()):
        cells.append(
            "| full collections (each repetition): "
            + ", ".join(f"{label} {'/'.join(map(str, counts))}" for label, counts in full.items())
        )
    print(" ".join(cells), flush=True)


FRAMING = ("BEGIN", "BEGIN IMMEDIATE", "COMMIT")


def statements_per_invoke(url: URL) -> str:
    """What our saver sends for one sync `invoke` of the 4-node graph on a new thread, counted,
    not assumed: the saver's calls (a `put` per super-step, the input's included; a
    `put_writes` per task; the `get_tuple` that starts the run), and the texts the
    connection's listener sees during each kind of call (BEGIN/COMMIT sent alone and scripts
    counted apart). A super-step is its `put` and the `put_writes` of its tasks; on a server
    each text is one round trip."""
    url = fresh(url, 0, Contestant(OURS, url))
    calls: dict[str, int] = dict.fromkeys(("put", "put_writes", "get_tuple"), 0)
    texts: dict[str, list[str]] = {name: [] for name in (*calls, "outside a call")}
    current = threading.local()
    with SqlCheckpointSaver.from_conn_string(url) as saver:
        saver.connection.add_statement_listener(
            lambda sql, _: texts[getattr(current, "call", None) or "outside a call"].append(sql)
        )
        for name in calls:
            method = getattr(saver, name)

            def counted(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
                current.call = _name
                calls[_name] += 1
                try:
                    return _method(*args, **kw)
                finally:
                    current.call = None

            setattr(saver, name, counted)
        graph = small_graph().compile(checkpointer=saver)
        graph.invoke(small_input(), config(str(uuid.uuid4())))

    def described(name: str) -> str:
        sent = texts[name]
        framing = sum(1 for sql in sent if sql.strip().upper() in FRAMING)
        scripts = sum(1 for sql in sent if sql.startswith("BEGIN;"))
        each = len(sent) / max(calls[name], 1)
        return (
            f"{calls[name]} {name}: {len(sent)} texts ({each:.1f} each; "
            f"{framing} BEGIN/COMMIT alone, {scripts} scripts)"
        )

    steps = max(calls["put"], 1)
    writes = len(texts["put"]) + len(texts["put_writes"])
    return (
        f"{url.get_backend_name()}: one invoke: "
        + "; ".join(described(name) for name in ("put", "put_writes", "get_tuple"))
        + f"; per super-step (a put and its tasks' put_writes) {writes / steps:.1f} texts"
        + (f"; {len(texts['outside a call'])} outside a call" if texts["outside a call"] else "")
    )


# --- costs: what one invoke's saver calls cost, apart from the graph -----------------------


def _wal_frames(database: str) -> int | None:
    """The frames in a SQLite database's write-ahead log: `mxFrame` of the WAL-index header
    (bytes 16-20 of the `-shm` file, native byte order; sqlite.org/walformat.html)."""
    try:
        with open(database + "-shm", "rb") as shm:
            header = shm.read(20)
    except FileNotFoundError:
        return None
    return struct.unpack("=I", header[16:20])[0] if len(header) == 20 else None


def call_costs(c: Contestant, invokes: int) -> str:
    """The saver calls of one sync `invoke` of the 4-node graph, recorded, then made again
    on `invokes` new threads in one thread with no graph around them: CPU per call of each
    kind (this thread's) and the wall time of an invoke's calls, and on SQLite the log
    frames each writes (a frame is a page written by a commit; the ones a log checkpoint
    resets are left out)."""
    recorded: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    cpu: dict[str, float] = {}
    frames: dict[str, list[int]] = {}
    counts: dict[str, int] = {}
    wall = 0.0
    database = c.url.database if c.url.get_backend_name() == "sqlite" else None
    with c.sync_saver() as saver:
        originals = {name: getattr(saver, name) for name in ("get_tuple", "put", "put_writes")}
        for name, method in originals.items():

            def record(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
                recorded.append((_name, copy.deepcopy(args), copy.deepcopy(kw)))
                return _method(*args, **kw)

            setattr(saver, name, record)
        small_graph().compile(checkpointer=saver).invoke(small_input(), config("recorded"))
        for name, method in originals.items():
            setattr(saver, name, method)
        for _ in range(invokes):
            thread = str(uuid.uuid4())
            for name, args, kw in recorded:
                given = {
                    **args[0],
                    "configurable": {**args[0]["configurable"], "thread_id": thread},
                }
                before = _wal_frames(database) if database else None
                started, waited = time.thread_time(), time.perf_counter()
                originals[name](given, *args[1:], **kw)
                cpu[name] = cpu.get(name, 0.0) + time.thread_time() - started
                wall += time.perf_counter() - waited
                counts[name] = counts.get(name, 0) + 1
                after = _wal_frames(database) if database else None
                if before is not None and after is not None and after >= before:
                    frames.setdefault(name, []).append(after - before)
    cells = []
    for name in ("get_tuple", "put", "put_writes"):
        cell = f"{name} {cpu[name] * 1e6 / counts[name]:.0f} us"
        if frames.get(name):
            cell += f", {statistics.mean(frames[name]):.1f} frames"
        cells.append(cell)
    per_invoke = sum(cpu.values()) * 1000 / invokes
    return (
        f"{c.label}: CPU per call: {'; '.join(cells)}; per invoke {per_invoke:.3f} ms of CPU, "
        f"{wall * 1000 / invokes:.3f} ms of wall time"
    )


def graph_floor(invokes: int) -> str:
    """The 4-node graph's own time per sync invoke with a checkpointer that stores nothing."""
    graph = small_graph().compile(checkpointer=FreeSaver())
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(invokes):
        graph.invoke(small_input(), config(str(uuid.uuid4())))
    wall = (time.perf_counter() - started) * 1000 / invokes
    spent = (time.process_time() - cpu) * 1000 / invokes
    return f"the graph alone (a saver storing nothing): {wall:.3f} ms/invoke, CPU {spent:.3f} ms"


def costs(urls: list[URL], invokes: int) -> None:
    print("# costs: " + graph_floor(invokes))
    for url in urls:
        contestants = [Contestant(OURS, url)]
        for name, module in official_names(url):
            if installed(module):
                contestants.append(Contestant(name, url, normal=url.get_backend_name() == "sqlite"))
        contestants.append(Contestant(FLOOR, url))
        for c in contestants:
            c.url = fresh(url, 0, c)
            print(f"# costs: {url.get_backend_name()} {call_costs(c, invokes)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", action="append", required=True, help="a database URL; repeat")
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument(
        "--scale",
        type=float,
        default=0.5,
        help="workload size: 0.5 (the default) runs 300 threads, 60 turns, histories of 210; "
        "1.0 twice that; 0.1 a smoke run",
    )
    parser.add_argument(
        "--costs",
        type=int,
        default=0,
        metavar="INVOKES",
        help="first, the saver calls of one invoke made again INVOKES times apart from the "
        "graph (CPU per call, SQLite log frames), and the graph's own time (0: skip)",
    )
    parser.add_argument(
        "--no-ceiling",
        action="store_true",
        help="leave out the graph alone (a saver that costs nothing) and the durable floor (one "
        "raw INSERT committed per write call), whose times give each path's ceiling and, on "
        "the sync write paths, its durable ceiling: the official saver's time over theirs",
    )
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="TEXT",
        help="measure only the paths whose name holds TEXT (repeat for more; e.g. 'delta')",
    )
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"# load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print("# ratio = their time / ours, median over repetitions (range); above 1: ours faster")
    started = time.perf_counter()
    urls = [make_url(u) for u in args.url]
    for url in urls:
        print("# " + statements_per_invoke(url))
    if args.costs:
        costs(urls, args.costs)
    measure(urls, args.repetitions, args.scale, ceiling=not args.no_ceiling, paths=args.path)
    print(f"# {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
