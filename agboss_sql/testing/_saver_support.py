"""What the fenced checkpoint saver's cases share: their options, configs, checkpoints, a
thread put the way a graph puts it, refusals and read-backs (`checkpoint_saver`).

LangGraph is imported only when a case runs, so this package imports without it."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.types import ExecutionLease
from agboss_sql.testing._case import CaseContext

CONTRACT = "checkpoint_saver"
"""The contract key of the cases, and of the saver's factory in their `CaseContext`."""
READER = "checkpoint_reader"
"""The factory of a saver that keeps no value (every read goes to the backing store)."""
UNFENCED = "checkpoint_unfenced"
"""The factory of the same saver used without a lease, as LangGraph uses a checkpointer."""
LEASE = "execution_lease"

LEASE_KEY = "agboss_lease"
"""The `configurable` key a fenced saver reads the writer's lease from: an `ExecutionLease`,
or a dict of `tenant_id`, `execution_id`, `lease_epoch` and `holder_instance_id`."""

TENANT = "tenant-1"
LEASE_MS = 30_000


@dataclass(frozen=True)
class SaverStatements:
    """How the suite sees what a saver sends, for the cases that check a write's steps:
    `record(saver)` is a context manager whose list collects the text of every statement
    the saver sends while it is open (`BEGIN…`, `COMMIT` and `ROLLBACK` included), and
    `is_lease_check(text)` tells the statement that checks the writer's lease (alone, or
    folded into the write's one statement)."""

    record: Callable[[Any], AbstractContextManager[list[str]]]
    is_lease_check: Callable[[str], bool]


@dataclass(frozen=True)
class SaverOptions:
    """What the cases may look at beside the saver's own answers."""

    stored_rows: Callable[[str], Awaitable[int]] | None = None
    statements: SaverStatements | None = None


def new_thread() -> str:
    return f"thread-{uuid.uuid4()}"


def new_execution() -> str:
    return f"run-{uuid.uuid4()}"


def config(
    thread_id: str, lease: Any = None, parent: str | None = None, ns: str = ""
) -> dict[str, Any]:
    """A write's (or read's) config: the thread, its namespace, the checkpoint it follows
    (`parent`) and, given one, the writer's lease."""
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if lease is not None:
        configurable[LEASE_KEY] = lease
    if parent is not None:
        configurable["checkpoint_id"] = parent
    return {"configurable": configurable}


def as_dict(lease: ExecutionLease, holder: str | None = None) -> dict[str, Any]:
    """The lease as a dict, the form a config read back from JSON carries."""
    return {
        "tenant_id": lease.tenant_id,
        "execution_id": lease.execution_id,
        "lease_epoch": lease.lease_epoch,
        "holder_instance_id": holder or lease.holder_instance_id,
    }


def checkpoint(values: Mapping[str, Any]) -> Any:
    """A checkpoint holding `values`, each at a version of the form `get_next_version`
    makes (a counter and a random fraction)."""
    from langgraph.checkpoint.base import empty_checkpoint

    made = empty_checkpoint()
    made["channel_values"] = dict(values)
    made["channel_versions"] = {name: f"{1:032}.{random.random():016}" for name in values}
    return made


async def put(saver: Any, cfg: dict[str, Any], values: Mapping[str, Any]) -> str:
    """`aput` a checkpoint of `values`: the id it was stored under."""
    made = checkpoint(values)
    stored = await saver.aput(cfg, made, {"source": "loop", "step": 1}, made["channel_versions"])
    return str(stored["configurable"]["checkpoint_id"])


class Thread:
    """Puts checkpoints on one thread the way a graph does, under one lease: each with its
    parent, every channel's version, and new versions for the channels it changed."""

    def __init__(self, saver: Any, thread_id: str, lease: Any) -> None:
        self.saver, self.thread_id, self.lease = saver, thread_id, lease
        self.values: dict[str, Any] = {}
        self.versions: dict[str, Any] = {}
        self.last: str | None = None

    async def put(
        self, changes: Mapping[str, Any], metadata: Mapping[str, Any] | None = None
    ) -> str:
        from langgraph.checkpoint.base import empty_checkpoint

        new = {n: self.saver.get_next_version(self.versions.get(n), None) for n in changes}
        self.values.update(changes)
        self.versions.update(new)
        made = empty_checkpoint()
        made["channel_values"] = dict(self.values)
        made["channel_versions"] = dict(self.versions)
        made["versions_seen"] = {"node": dict(self.versions)}
        stored = await self.saver.aput(
            config(self.thread_id, self.lease, self.last),
            made,
            dict(metadata or {"source": "loop", "step": 0}),
            new,
        )
        self.last = str(stored["configurable"]["checkpoint_id"])
        return self.last


def turn(n: int, tag: str = "") -> str:
    """One turn of a conversation: long enough that a list of them is stored as appends."""
    return f"{tag}turn {n}: " + "words " * 150


async def grow(
    thread: Thread, conversation: list[str], turns: range, *, tag: str = ""
) -> tuple[list[str], list[list[str]]]:
    """A checkpoint per turn, each with the conversation grown by that turn: their ids and
    conversations."""
    ids, states = [], []
    for n in turns:
        conversation = [*conversation, turn(n, tag)]
        ids.append(await thread.put({"messages": conversation}))
        states.append(conversation)
    return ids, states


async def refused(call: Awaitable[Any], what: str) -> ExecutionFencedError:
    """The `ExecutionFencedError` `call` raised; an `AssertionError` when it wrote."""
    try:
        await call
    except ExecutionFencedError as error:
        return error
    raise AssertionError(f"[fence] {what} was written, not refused with ExecutionFencedError")


async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """A sync method of the saver, run in a worker thread as a sync graph would run it."""
    return await asyncio.to_thread(function, *args)


def reader(ctx: CaseContext) -> Any:
    """A saver that reads what the backing store holds (the set's reader, else the other
    instance's saver, which wrote nothing of the case)."""
    return ctx.store(READER, 0) if ctx.has(READER) else ctx.store(CONTRACT, 1)


async def latest_of(saver: Any, thread_id: str) -> Any:
    return await saver.aget_tuple(config(thread_id))


async def ids_of(saver: Any, thread_id: str) -> list[str]:
    """The thread's checkpoint ids, newest first."""
    return [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(config(thread_id))]


async def read_back(saver: Any, thread_id: str, ids: list[str], states: list[list[str]]) -> None:
    """Every checkpoint of `ids`, read by id and through `alist`, holds its conversation."""
    for checkpoint_id, state in zip(ids, states, strict=True):
        found = await saver.aget_tuple(config(thread_id, parent=checkpoint_id))
        assert found is not None, f"[read-back] checkpoint {checkpoint_id} is gone"
        got = found.checkpoint["channel_values"].get("messages")
        assert got == state, (
            f"[read-back] checkpoint {checkpoint_id} reads {len(got or [])} turns, "
            f"{len(state)} were written"
        )
    listed = {
        t.config["configurable"]["checkpoint_id"]: t async for t in saver.alist(config(thread_id))
    }
    for checkpoint_id, state in zip(ids, states, strict=True):
        got = listed[checkpoint_id].checkpoint["channel_values"].get("messages")
        assert got == state, f"[read-back] alist reads checkpoint {checkpoint_id} wrong"


async def rows_of(options: SaverOptions, thread_id: str) -> int | None:
    """The rows the backing store holds for the thread, when the set can count them."""
    if options.stored_rows is None:
        return None
    return await options.stored_rows(thread_id)
