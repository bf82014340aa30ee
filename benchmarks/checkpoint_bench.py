"""Checkpoint savers, ours against LangGraph's official one, on one database.

    python benchmarks/checkpoint_bench.py --url postgresql://postgres@127.0.0.1:5432/bench
    python benchmarks/checkpoint_bench.py --url mysql://root@127.0.0.1:3306/bench
    python benchmarks/checkpoint_bench.py --url sqlite:////tmp/bench/bench.sqlite

In one process and on one database it runs `SqlCheckpointSaver` and the official saver
for that database when it is installed (`langgraph-checkpoint-postgres`,
`langgraph-checkpoint-sqlite`, the community `langgraph-checkpoint-mysql`). One
operation is what a graph step costs its checkpointer: `aput` of a realistic checkpoint
(3 channels of a few hundred bytes each, all three at a new version, parent = the
previous checkpoint) then `aget_tuple` of the thread's latest checkpoint. Scenarios:
every operation on one thread (its history grows), round robin over 100 threads, a chat
path (the whole conversation in a `messages` channel that grows two messages a turn, turns
round robin over 10 threads), and history paging (pages of 10 checkpoints newest first with
`alist(limit=10, before=…)`, as `aget_state_history` reads, over a thread of 200).
One client, operations in sequence; the savers take turns in slices (`--rounds`) so a
change in the machine's load falls on both. Prints a table, then one JSON line per
measurement and per comparison; a measurement's line holds its time per operation in each
slice (`slice_ms`), where a burst of load on the machine that fell on one saver's slice
shows.

`--floor` adds a third contestant to the put/get scenarios, taking its turns with the
savers: what a saver that stores and decodes every value whole cannot avoid per
operation. Its put serialises the checkpoint's new values and body with LangGraph's serde
and commits one small row in autocommit (one round trip, one durable commit); its get is
one round trip (`SELECT 1`) and deserialises what the put serialised into the checkpoint
it answers. Its row's ratio column shows floor ops/s over theirs in that run: what our
saver would reach if it cost only the floor (on the chat path ours decodes less than the
floor, and may pass it).

Our tables are created if absent (`metadata.create_all`; deployments run the
migrations); the official saver's `setup()` creates its own. Every thread the run wrote
is deleted at the end, by each saver.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    Checkpoint,
    CheckpointTuple,
    empty_checkpoint,
)

from agboss_sql.sql._base import identity_hash
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints
from agboss_sql.testing.database import sync_url

T = TypeVar("T")

SCENARIOS = (("1 thread", 1), ("100 threads", 100), ("chat", 10))
"""(name, threads): "chat" is a chat graph's path: each turn adds two messages to a
`messages` channel that holds the whole conversation (LangGraph's `add_messages`), so the
value written per checkpoint grows with the thread (turns go round robin over the threads)."""

HISTORY_CHECKPOINTS = 200
"""Checkpoints of the thread whose history the "history" scenario pages through."""
HISTORY_PAGE = 10
"""Checkpoints per page of the "history" scenario (`alist(limit=…, before=…)`, what
`graph.aget_state_history` reads)."""


def channel_values(step: int) -> dict[str, Any]:
    """Three channels of a few hundred bytes each, as a support agent's state would hold."""
    return {
        "messages": [
            HumanMessage(
                content=f"Step {step}: my order #48213 arrived damaged, the box was crushed "
                "and two of the glasses are broken. Can I get a refund or a replacement?",
                id=f"human-{step}",
            ),
            AIMessage(
                content="I'm sorry to hear that. I can offer a replacement shipped today at no "
                "cost, or a full refund to your card within 3-5 business days. Which do you prefer?",
                id=f"ai-{step}",
            ),
        ],
        "context": {
            "customer_id": "cus_8f2a91c4",
            "plan": "premium",
            "order": {"id": 48213, "items": ["glass set (6)", "coasters"], "total_cents": 8499},
            "sentiment": "frustrated",
            "open_tickets": [1182, 1190],
            "step": step,
        },
        "summary": (
            f"[{step}] Customer reports a damaged delivery (order 48213, premium plan). "
            "Two glasses broken on arrival; packaging crushed. Offered replacement or refund; "
            "awaiting the customer's choice before issuing a shipping label or refund."
        ),
    }


def chat_values(turn: int, conversation: list[Any]) -> dict[str, Any]:
    """A chat graph's state after `turn` turns: the whole conversation in `messages` (two
    messages more than the turn before: appended to `conversation`, the thread's list, as
    `add_messages` appends to the channel's), and a small `turn` counter; both change every
    turn."""
    conversation.append(
        HumanMessage(
            content=f"Turn {turn}: here is what I tried and what went wrong. " * 3, id=f"h{turn}"
        )
    )
    conversation.append(
        AIMessage(
            content=f"Turn {turn}: thanks, let us go through it step by step. " * 3,
            id=f"a{turn}",
        )
    )
    return {"messages": list(conversation), "turn": turn}


def checkpoint_of(
    saver: BaseCheckpointSaver[Any],
    step: int,
    versions: dict[str, Any],
    *,
    turn: int | None = None,
    conversation: list[Any] | None = None,
) -> Checkpoint:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = (
        channel_values(step)
        if turn is None
        else chat_values(turn, conversation if conversation is not None else [])
    )
    for channel in checkpoint["channel_values"]:
        versions[channel] = saver.get_next_version(versions.get(channel), None)
    checkpoint["channel_versions"] = dict(versions)
    checkpoint["versions_seen"] = {"agent": dict(versions), "tools": dict(versions)}
    return checkpoint


@dataclass
class Measurement:
    database: str
    scenario: str
    saver: str
    ops: int
    seconds: float
    ops_per_s: float
    put_ms: float
    get_ms: float
    slice_ms: list[float]
    """ms per operation in each slice, in the order the slices ran (`--rounds`)."""


class Workload:
    """One saver's operations on its threads; run in slices, the history carries on."""

    def __init__(
        self,
        saver: BaseCheckpointSaver[Any],
        name: str,
        threads: int,
        run_id: str,
        tag: str,
        *,
        chat: bool = False,
    ) -> None:
        self.saver, self.name, self.chat = saver, name, chat
        self.thread_ids = [f"bench-{run_id}-{tag}-{i}" for i in range(threads)]
        self.parents: dict[str, str | None] = dict.fromkeys(self.thread_ids)
        self.versions: dict[str, dict[str, Any]] = {t: {} for t in self.thread_ids}
        self.conversations: dict[str, list[Any]] = {t: [] for t in self.thread_ids}
        self.step = 0
        self.ops = 0
        self.seconds = self.put_s = self.get_s = 0.0
        self.slice_ms: list[float] = []

    async def run(self, ops: int, *, timed: bool = True) -> None:
        saver = self.saver
        started = time.perf_counter()
        put_s = get_s = 0.0
        for _ in range(ops):
            step = self.step
            self.step += 1
            thread_id = self.thread_ids[step % len(self.thread_ids)]
            configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
            if self.parents[thread_id] is not None:
                configurable["checkpoint_id"] = self.parents[thread_id]
            turn = step // len(self.thread_ids) if self.chat else None
            checkpoint = checkpoint_of(
                saver,
                step,
                self.versions[thread_id],
                turn=turn,
                conversation=self.conversations[thread_id],
            )
            metadata: Any = {"source": "loop", "step": step, "parents": {}}
            t0 = time.perf_counter()
            stored = await saver.aput(
                {"configurable": configurable}, checkpoint, metadata, checkpoint["channel_versions"]
            )
            t1 = time.perf_counter()
            latest = await saver.aget_tuple(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            )
            t2 = time.perf_counter()
            put_s += t1 - t0
            get_s += t2 - t1
            if latest is None or latest.checkpoint["id"] != checkpoint["id"]:
                raise AssertionError(
                    f"{self.name}: the latest checkpoint of {thread_id} is not the one just put"
                )
            self.parents[thread_id] = stored["configurable"]["checkpoint_id"]
        if timed:
            spent = time.perf_counter() - started
            self.seconds += spent
            self.slice_ms.append(round(spent * 1000 / ops, 4))
            self.put_s += put_s
            self.get_s += get_s
            self.ops += ops

    def measurement(self, database: str, scenario: str) -> Measurement:
        return Measurement(
            database=database,
            scenario=scenario,
            saver=self.name,
            ops=self.ops,
            seconds=round(self.seconds, 4),
            ops_per_s=round(self.ops / self.seconds, 1),
            put_ms=round(self.put_s * 1000 / self.ops, 3),
            get_ms=round(self.get_s * 1000 / self.ops, 3),
            slice_ms=self.slice_ms,
        )


FLOOR = "floor"
"""The `--floor` contestant's name in the table."""

floor_rows = sa.Table(
    "bench_floor_rows",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("value", sa.String(64), nullable=False),
)
"""The table of the floor's one-row commits (created and dropped by the run)."""


class FloorSaver(BaseCheckpointSaver[str]):
    """What a saver storing and decoding values whole pays per operation: LangGraph's serde
    both ways, one durable single-row commit on put, one round trip on get (see `--floor`).
    Not a saver: it keeps the serialised checkpoint in memory to hand it back."""

    def __init__(self, connection: SqlConnection) -> None:
        super().__init__()
        self.connection = connection
        self.insert = sa.insert(floor_rows).values(value=sa.bindparam("value", type_=sa.String))
        self.ping = sa.select(sa.literal(1))
        self.latest: dict[str, tuple[Any, dict[str, tuple[str, bytes]], tuple[str, bytes]]] = {}

    async def aput(
        self, config: Any, checkpoint: Checkpoint, metadata: Any, new_versions: Any
    ) -> Any:
        values = checkpoint["channel_values"]
        dumped = {k: self.serde.dumps_typed(values[k]) for k in new_versions if k in values}
        body = self.serde.dumps_typed({**checkpoint, "channel_values": {}})
        await self.connection.execute(self.insert, {"value": checkpoint["id"]})
        thread_id = config["configurable"]["thread_id"]
        self.latest[thread_id] = (checkpoint["id"], dumped, body)
        return {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        await self.connection.execute(self.ping)
        found = self.latest.get(config["configurable"]["thread_id"])
        if found is None:
            return None
        _, dumped, body = found
        checkpoint = self.serde.loads_typed(body)
        # The values go back in the checkpoint, as a saver's do: the caller holds them (and
        # the garbage collector walks them) until it lets the tuple go.
        checkpoint["channel_values"] = {k: self.serde.loads_typed(v) for k, v in dumped.items()}
        return CheckpointTuple(config, checkpoint, {}, None, [])

    async def adelete_thread(self, thread_id: str) -> None:
        self.latest.pop(thread_id, None)


@contextlib.asynccontextmanager
async def official_saver(
    url: sa.URL,
) -> AsyncIterator[tuple[str, BaseCheckpointSaver[Any] | None, str]]:
    """LangGraph's saver for this database: (name, saver or None, why not)."""
    backend = url.get_backend_name()
    if backend == "postgresql":
        try:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        except ImportError:
            yield "AsyncPostgresSaver", None, "langgraph-checkpoint-postgres is not installed"
            return
        conn_string = url.set(drivername="postgresql").render_as_string(hide_password=False)
        async with AsyncPostgresSaver.from_conn_string(conn_string) as saver:
            await saver.setup()
            yield "AsyncPostgresSaver", saver, ""
    elif backend == "sqlite":
        try:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        except ImportError:
            yield "AsyncSqliteSaver", None, "langgraph-checkpoint-sqlite is not installed"
            return
        async with AsyncSqliteSaver.from_conn_string(url.database or "") as sqlite_saver:
            await sqlite_saver.setup()
            yield "AsyncSqliteSaver", sqlite_saver, ""
    else:
        try:
            from langgraph.checkpoint.mysql.aio import AIOMySQLSaver
        except ImportError:
            yield "AIOMySQLSaver", None, "langgraph-checkpoint-mysql is not installed"
            return
        conn_string = url.set(drivername="mysql").render_as_string(hide_password=False)
        async with AIOMySQLSaver.from_conn_string(conn_string) as mysql_saver:
            await mysql_saver.setup()
            yield "AIOMySQLSaver", mysql_saver, ""


def ensure_our_tables(url: str) -> None:
    engine = sa.create_engine(sync_url(url))
    try:
        tables = [checkpoints, checkpoint_blobs, checkpoint_writes]
        checkpoints.metadata.create_all(engine, tables=tables, checkfirst=True)
    finally:
        engine.dispose()


STORED_VALUES = {
    "SqlCheckpointSaver": (
        "SELECT sum(length(value)) FROM agboss_checkpoint_blobs WHERE thread_hash IN :threads"
    ),
    "AsyncPostgresSaver": (
        "SELECT sum(length(blob)) FROM checkpoint_blobs WHERE thread_id IN :threads"
    ),
    "AIOMySQLSaver": "SELECT sum(length(`blob`)) FROM checkpoint_blobs WHERE thread_id IN :threads",
    # Its checkpoints hold their channel values.
    "AsyncSqliteSaver": "SELECT sum(length(checkpoint)) FROM checkpoints WHERE thread_id IN :threads",
}
"""Per saver, the bytes of serialised channel values its threads hold."""


def stored_bytes(url: str, saver: str, thread_ids: list[str]) -> int | None:
    """The bytes of channel values `saver` stored for `thread_ids` (None: not a saver)."""
    query = STORED_VALUES.get(saver)
    if query is None:
        return None
    keys = [identity_hash(t) for t in thread_ids] if saver == "SqlCheckpointSaver" else thread_ids
    statement = sa.text(query).bindparams(sa.bindparam("threads", expanding=True))
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            return int(connection.execute(statement, {"threads": keys}).scalar() or 0)
    finally:
        engine.dispose()


def slices(total: int, rounds: int) -> list[int]:
    base, extra = divmod(total, max(1, rounds))
    return [base + (1 if i < extra else 0) for i in range(max(1, rounds)) if base or i < extra]


def rotated(items: list[T], turn: int) -> list[T]:
    """`items` starting at `turn` (modulo their number)."""
    start = turn % len(items) if items else 0
    return items[start:] + items[:start]


async def benchmark(
    url: str,
    ops: int,
    warmup: int,
    rounds: int,
    floor: bool = False,
    only: frozenset[str] | None = None,
) -> list[Measurement]:
    ensure_our_tables(url)
    if floor:
        engine = sa.create_engine(sync_url(url))
        try:
            floor_rows.metadata.drop_all(engine, checkfirst=True)
            floor_rows.metadata.create_all(engine)
        finally:
            engine.dispose()
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    connection = SqlConnection(url)
    await connection.ping()
    database = connection.dialect_name
    run_id = uuid.uuid4().hex[:8]
    measurements: list[Measurement] = []
    written: list[tuple[BaseCheckpointSaver[Any], list[str]]] = []
    try:
        ours = SqlCheckpointSaver(connection)
        async with official_saver(parsed) as (their_name, theirs, why_not):
            if theirs is None:
                print(f"# {their_name}: not measured ({why_not})", file=sys.stderr)
            savers: list[tuple[str, BaseCheckpointSaver[Any]]] = [("SqlCheckpointSaver", ours)]
            if theirs is not None:
                savers.append((their_name, theirs))
            contestants = [*savers, (FLOOR, FloorSaver(connection))] if floor else savers
            for scenario, threads in SCENARIOS:
                if only is not None and scenario not in only:
                    continue
                tag = scenario.replace(" ", "")
                loads = [
                    Workload(saver, name, threads, run_id, f"{i}{tag}", chat=scenario == "chat")
                    for i, (name, saver) in enumerate(contestants)
                ]
                written += [(w.saver, w.thread_ids) for w in loads]
                for load in loads:
                    await load.run(warmup, timed=False)
                # The savers take turns, slice by slice: a change in the machine's load
                # falls on both, and their ratio stays fair. Who goes first rotates, so
                # none always follows the same one (and the work it left the server).
                for turn, slice_ops in enumerate(slices(ops, rounds)):
                    for load in rotated(loads, turn):
                        await load.run(slice_ops)
                measurements += [load.measurement(database, scenario) for load in loads]
                if scenario == "chat":
                    for load in loads:
                        stored = stored_bytes(url, load.name, load.thread_ids)
                        if stored is not None:
                            print(
                                json.dumps(
                                    {
                                        "kind": "stored",
                                        "database": database,
                                        "scenario": scenario,
                                        "saver": load.name,
                                        "threads": len(load.thread_ids),
                                        "checkpoints": load.step,
                                        "value_bytes": stored,
                                    }
                                )
                            )
            if only is None or "history" in only:
                measurements += await history(savers, database, run_id, ops, rounds, written)
            for saver, thread_ids in written:
                for thread_id in thread_ids:
                    await saver.adelete_thread(thread_id)
    finally:
        await connection.close()
        if floor:
            engine = sa.create_engine(sync_url(url))
            try:
                floor_rows.metadata.drop_all(engine, checkfirst=True)
            finally:
                engine.dispose()
    return measurements


async def history(
    savers: list[tuple[str, BaseCheckpointSaver[Any]]],
    database: str,
    run_id: str,
    ops: int,
    rounds: int,
    written: list[tuple[BaseCheckpointSaver[Any], list[str]]],
) -> list[Measurement]:
    """The "history" scenario: one thread of `HISTORY_CHECKPOINTS` checkpoints per saver, then
    `ops` pages of `HISTORY_PAGE` read newest first with `alist(limit, before)` (from the
    latest again once the history is read through). One op is one page."""
    loads = []
    for i, (name, saver) in enumerate(savers):
        load = Workload(saver, name, 1, run_id, f"{i}history")
        await load.run(HISTORY_CHECKPOINTS, timed=False)
        written.append((saver, load.thread_ids))
        loads.append(load)
    cursors: dict[str, str | None] = {load.name: None for load in loads}
    seconds = dict.fromkeys(cursors, 0.0)
    sliced: dict[str, list[float]] = {name: [] for name in cursors}
    for turn, slice_ops in enumerate(slices(ops, rounds)):
        for load in rotated(loads, turn):
            config: Any = {"configurable": {"thread_id": load.thread_ids[0], "checkpoint_ns": ""}}
            started = time.perf_counter()
            for _ in range(slice_ops):
                cursor = cursors[load.name]
                before: Any = (
                    None
                    if cursor is None
                    else {"configurable": {**config["configurable"], "checkpoint_id": cursor}}
                )
                page = [
                    t async for t in load.saver.alist(config, before=before, limit=HISTORY_PAGE)
                ]
                if not page:
                    # Read through (the history is a whole number of pages): from the latest.
                    page = [t async for t in load.saver.alist(config, limit=HISTORY_PAGE)]
                last = page[-1].config["configurable"]["checkpoint_id"]
                cursors[load.name] = last if len(page) == HISTORY_PAGE else None
            spent = time.perf_counter() - started
            seconds[load.name] += spent
            sliced[load.name].append(round(spent * 1000 / slice_ops, 4))
    return [
        Measurement(
            database=database,
            scenario="history",
            saver=name,
            ops=ops,
            seconds=round(spent, 4),
            ops_per_s=round(ops / spent, 1),
            put_ms=0.0,
            get_ms=round(spent * 1000 / ops, 3),
            slice_ms=sliced[name],
        )
        for name, spent in seconds.items()
    ]


def report(measurements: list[Measurement]) -> None:
    by_key = {(m.scenario, m.saver): m for m in measurements}
    scenarios = [*(s for s, _ in SCENARIOS), "history"]
    theirs_names = sorted({m.saver for m in measurements} - {"SqlCheckpointSaver", FLOOR})
    header = f"{'database':<10} {'scenario':<12} {'saver':<20} {'ops/s':>9} {'put ms':>8} {'get ms':>8} {'ours/theirs':>12} {'saver time':>11}"
    print(header)
    print("-" * len(header))
    comparisons: list[dict[str, Any]] = []
    for scenario in scenarios:
        ours = by_key.get((scenario, "SqlCheckpointSaver"))
        for m in [x for x in measurements if x.scenario == scenario]:
            ratio = in_saver = ""
            theirs = [x for x in measurements if x.scenario == scenario and x.saver in theirs_names]
            if m.saver == FLOOR:
                # The ceiling of ours/theirs: our saver at the floor.
                if theirs:
                    ceiling = m.ops_per_s / theirs[0].ops_per_s
                    saver_ceiling = (theirs[0].put_ms + theirs[0].get_ms) / (m.put_ms + m.get_ms)
                    ratio, in_saver = f"<={ceiling:.2f}x", f"<={saver_ceiling:.2f}x"
                    comparisons.append(
                        {
                            "kind": "ceiling",
                            "database": m.database,
                            "scenario": scenario,
                            "theirs": theirs[0].saver,
                            "ceiling": round(ceiling, 2),
                            "saver_time_ceiling": round(saver_ceiling, 2),
                        }
                    )
            elif ours is not None and m.saver != "SqlCheckpointSaver":
                ratio = f"{ours.ops_per_s / m.ops_per_s:.2f}x"
                # The savers' own time (put + get), without the benchmark building its inputs.
                saver_ratio = (m.put_ms + m.get_ms) / (ours.put_ms + ours.get_ms)
                in_saver = f"{saver_ratio:.2f}x"
                comparisons.append(
                    {
                        "database": m.database,
                        "scenario": scenario,
                        "ours": ours.saver,
                        "theirs": m.saver,
                        "ours_ops_per_s": ours.ops_per_s,
                        "theirs_ops_per_s": m.ops_per_s,
                        "ratio": round(ours.ops_per_s / m.ops_per_s, 2),
                        "saver_time_ratio": round(saver_ratio, 2),
                    }
                )
            print(
                f"{m.database:<10} {scenario:<12} {m.saver:<20} {m.ops_per_s:>9.1f} {m.put_ms:>8.3f} {m.get_ms:>8.3f} {ratio:>12} {in_saver:>11}"
            )
    if not theirs_names:
        print("(no official saver measured: ratio not available)")
    print()
    for m in measurements:
        print(json.dumps({"kind": "measurement", **asdict(m)}))
    for c in comparisons:
        print(json.dumps({"kind": "comparison", **c}))


async def flatness(url: str, checkpoints: int) -> None:
    """The latest-checkpoint read (`aget_tuple`, p50 of 200) of a thread of 10 checkpoints and
    of one of `checkpoints`, per saver: it should not grow with the history. The two threads'
    reads alternate, so a change in the machine's load falls on both."""
    parsed = sa.make_url(url)
    connection = SqlConnection(url)
    try:
        ours = SqlCheckpointSaver(connection)
        async with official_saver(parsed) as (their_name, theirs, _):
            savers: list[tuple[str, BaseCheckpointSaver[Any]]] = [("SqlCheckpointSaver", ours)]
            if theirs is not None:
                savers.append((their_name, theirs))
            run_id = uuid.uuid4().hex[:8]
            for i, (name, saver) in enumerate(savers):
                short = Workload(saver, name, 1, run_id, f"{i}flat10")
                long = Workload(saver, name, 1, run_id, f"{i}flat{checkpoints}")
                await short.run(10, timed=False)
                await long.run(checkpoints, timed=False)
                early, late = await _latest_p50_ms(
                    saver, [_latest_config(short), _latest_config(long)]
                )
                print(
                    json.dumps(
                        {
                            "kind": "latest_read",
                            "database": connection.dialect_name,
                            "saver": name,
                            "p50_ms_at_10": round(early, 3),
                            f"p50_ms_at_{checkpoints}": round(late, 3),
                            "growth": round(late / early, 2),
                        }
                    )
                )
                for load in (short, long):
                    await saver.adelete_thread(load.thread_ids[0])
    finally:
        await connection.close()


def _latest_config(load: Workload) -> Any:
    return {"configurable": {"thread_id": load.thread_ids[0], "checkpoint_ns": ""}}


async def _latest_p50_ms(
    saver: BaseCheckpointSaver[Any], configs: list[Any], reads: int = 200
) -> list[float]:
    """p50 of `reads` latest reads of each config, the configs' reads alternating."""
    spent: list[list[float]] = [[] for _ in configs]
    for _ in range(reads):
        for config, times in zip(configs, spent, strict=True):
            started = time.perf_counter()
            await saver.aget_tuple(config)
            times.append(time.perf_counter() - started)
    return [sorted(times)[len(times) // 2] * 1000 for times in spent]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="sqlite:///…, postgresql://…, mysql://…")
    parser.add_argument("--ops", type=int, default=1000, help="operations per saver and scenario")
    parser.add_argument("--warmup", type=int, default=50, help="untimed operations before each run")
    parser.add_argument("--rounds", type=int, default=10, help="slices the savers take turns in")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure the floor any saver pays per put/get (serde, one commit, round trips)",
    )
    parser.add_argument(
        "--flat",
        type=int,
        metavar="N",
        help="instead: the latest-checkpoint read of a thread of 10 and of one of N checkpoints",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[*(name for name, _ in SCENARIOS), "history"],
        help="run only this scenario (repeatable; default: all)",
    )
    args = parser.parse_args()
    if args.flat:
        ensure_our_tables(args.url)
        asyncio.run(flatness(args.url, args.flat))
        return
    only = frozenset(args.scenario) if args.scenario else None
    report(asyncio.run(benchmark(args.url, args.ops, args.warmup, args.rounds, args.floor, only)))


if __name__ == "__main__":
    main()
