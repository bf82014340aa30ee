"""LangGraph threads run durably by the runtime, against the same graph invoked directly
on LangGraph's official saver, on one database.

    python benchmarks/graph_bench.py --url postgresql://postgres@127.0.0.1:5432/agboss_bench
    python benchmarks/graph_bench.py --url sqlite:////tmp/bench/graphs.sqlite

The graph: a 5-node agent loop (`plan`, then `model` -> `tools` twice round the loop, then
`review` and `answer`: 8 super-steps, each a checkpoint), nodes that do no work of their
own, a `messages` list that grows a few entries a step. `--threads` threads (100) a round,
`--concurrency` (10) in flight, each contestant's turn interleaved with the other's for
`--rounds` rounds (who goes first alternates), a few untimed threads warming each up first:

- `durable`: `add_graph(app, "agent", graph)` on an `Engine(app, url=URL)` that works the
  runs itself: `engine.start(...)` then `handle.result()`. Each thread is a run under its
  own lease; every checkpoint and pending write is fenced by it (`SqlCheckpointSaver(
  fenced=True)`), the run's record, input and close are stored, the lease finished.
- `official`: the same graph compiled with LangGraph's saver for the database
  (`AsyncPostgresSaver` on an `AsyncConnectionPool` of `--concurrency` connections,
  `AsyncSqliteSaver`), invoked directly with `graph.ainvoke(input, thread config)`: no
  lease, no record, nothing fenced.

Both run with `durability="sync"` (each super-step's checkpoint stored before the next
starts: what resuming elsewhere needs). Equal durability on SQLite: our connection runs WAL
with `synchronous=NORMAL`; the official saver's connection is given the same (left alone,
aiosqlite runs a rollback journal with `synchronous=FULL`).

Prints one JSON line per round and contestant (`"kind": "round"`: threads/s), then a
summary (`"kind": "summary"`): each contestant's median threads/s and the median of the
per-round ratios durable / official.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import operator
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, TypedDict

import sqlalchemy as sa
from langgraph.graph import END, START, StateGraph

from agboss_sql.runtime import Engine, Workflows
from agboss_sql.runtime.graphs import add_graph
from agboss_sql.sql.migrate import upgrade


class AgentState(TypedDict, total=False):
    question: str
    turns: int
    messages: Annotated[list[str], operator.add]


def plan(state: AgentState) -> dict[str, Any]:
    return {"messages": [f"plan: {state['question']}"], "turns": 0}


def model(state: AgentState) -> dict[str, Any]:
    return {"messages": [f"model: call tool {state.get('turns', 0)}"]}


def tools(state: AgentState) -> dict[str, Any]:
    turns = int(state.get("turns", 0)) + 1
    return {"messages": [f"tool: result {turns}"], "turns": turns}


def route(state: AgentState) -> str:
    return "model" if int(state.get("turns", 0)) < 2 else "review"


def review(state: AgentState) -> dict[str, Any]:
    return {"messages": [f"review: {len(state['messages'])} messages"]}


def answer(state: AgentState) -> dict[str, Any]:
    return {"messages": ["answer: done"]}


def agent_graph() -> StateGraph:
    graph = StateGraph(AgentState)
    for name, node in (
        ("plan", plan),
        ("model", model),
        ("tools", tools),
        ("review", review),
        ("answer", answer),
    ):
        graph.add_node(name, node)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "model")
    graph.add_edge("model", "tools")
    graph.add_conditional_edges("tools", route, ["model", "review"])
    graph.add_edge("review", "answer")
    graph.add_edge("answer", END)
    return graph


Contestant = Callable[[str], Awaitable[Any]]


@contextlib.asynccontextmanager
async def durable(url: str) -> AsyncIterator[Contestant]:
    app = Workflows("graph-bench")
    add_graph(app, "agent", agent_graph())
    async with Engine(app, url=url) as engine:

        async def one(thread: str) -> Any:
            handle = await engine.start("agent", {"question": thread}, id=thread)
            return await handle.result(timeout_s=120)

        yield one


@contextlib.asynccontextmanager
async def official(url: sa.URL, concurrency: int) -> AsyncIterator[Contestant]:
    backend = url.get_backend_name()
    if backend == "postgresql":
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        async with AsyncConnectionPool(
            conninfo,
            min_size=concurrency,
            max_size=concurrency,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        ) as pool:
            saver: Any = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
            await saver.setup()
            yield _invoker(saver)
    elif backend == "sqlite":
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        path = (url.database or "") + ".official"
        async with aiosqlite.connect(path) as connection:
            await connection.execute("PRAGMA journal_mode=WAL")
            await connection.execute("PRAGMA synchronous=NORMAL")
            saver = AsyncSqliteSaver(connection)
            await saver.setup()
            settings = {
                "journal_mode": (
                    await (await connection.execute("PRAGMA journal_mode")).fetchone()
                ),
                "synchronous": (await (await connection.execute("PRAGMA synchronous")).fetchone()),
            }
            print(json.dumps({"kind": "settings", "official": str(settings)}), flush=True)
            yield _invoker(saver)
    else:
        raise SystemExit(f"no official LangGraph saver for {backend}: use PostgreSQL or SQLite")


def _invoker(saver: Any) -> Contestant:
    graph = agent_graph().compile(checkpointer=saver)

    async def one(thread: str) -> Any:
        config = {"configurable": {"thread_id": thread}}
        return await graph.ainvoke({"question": thread}, config, durability="sync")

    return one


async def timed(one: Contestant, ids: list[str], concurrency: int) -> float:
    """Threads per second: `ids` run through `one`, `concurrency` at once."""
    queue = list(reversed(ids))

    async def worker() -> None:
        while queue:
            await one(queue.pop())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(ids) / (time.perf_counter() - started)


async def main(args: argparse.Namespace) -> None:
    url = sa.make_url(args.url)
    await asyncio.to_thread(upgrade, args.url)
    tag = uuid.uuid4().hex[:6]
    rates: dict[str, list[float]] = {"durable": [], "official": []}
    ratios: list[float] = []
    async with durable(args.url) as ours, official(url, args.concurrency) as theirs:
        contestants = {"durable": ours, "official": theirs}
        for name, one in contestants.items():
            await timed(one, [f"{tag}-warm-{name}-{i}" for i in range(args.warmup)], 2)
        for round_ in range(args.rounds):
            order = ["durable", "official"] if round_ % 2 == 0 else ["official", "durable"]
            this: dict[str, float] = {}
            for name in order:
                ids = [f"{tag}-{name}-{round_}-{i}" for i in range(args.threads)]
                this[name] = await timed(contestants[name], ids, args.concurrency)
                rates[name].append(this[name])
                print(
                    json.dumps(
                        {
                            "kind": "round",
                            "round": round_,
                            "contestant": name,
                            "threads": args.threads,
                            "concurrency": args.concurrency,
                            "threads_per_s": round(this[name], 1),
                        }
                    ),
                    flush=True,
                )
            ratios.append(this["durable"] / this["official"])
    summary = {
        "kind": "summary",
        "database": url.get_backend_name(),
        "threads": args.threads,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "durable_threads_per_s": round(statistics.median(rates["durable"]), 1),
        "official_threads_per_s": round(statistics.median(rates["official"]), 1),
        "ratio_median": round(statistics.median(ratios), 2),
        "ratio_min": round(min(ratios), 2),
        "ratio_max": round(max(ratios), 2),
    }
    print(json.dumps(summary), flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/graph_bench.py")
    parser.add_argument("--url", required=True)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
