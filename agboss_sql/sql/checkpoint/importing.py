"""Threads brought over from another LangGraph saver: `import_threads`, `aimport_threads`.

A team switching savers in production has threads in flight: paused on an `interrupt()`,
halfway through a super-step, with a history their users page through. These functions
read each thread from the saver it lives in (any `BaseCheckpointSaver`: `SqliteSaver`,
`PostgresSaver`, the community MySQL savers, `InMemorySaver`, or another
`SqlCheckpointSaver`, on another database, say) through LangGraph's public methods, and
write it into a `SqlCheckpointSaver` as LangGraph itself would have: every checkpoint
oldest first, through `put`, with the channel versions new since its parent, then its
pending writes through `put_writes`, task by task. Every namespace of a thread (its
subgraphs') comes with it, forks included (a checkpoint's new versions are counted from its
own parent).

Safe to run again: a checkpoint or a write already in the target is written again as it
was, so a run that stopped halfway (a source that failed, a process killed) is finished
by running it again. Stopped halfway, a thread in the target holds a prefix of its history,
oldest first: a state it had, never a mix. So run it before the instances that will
write those threads move to the target, not while another saver still writes them.

What cannot come over: the task path of a pending write (LangGraph's savers do not
answer it; LangGraph orders a super-step's writes by its tasks' paths when it applies
them, not by the order a saver answers them), and anything a saver keeps beyond
LangGraph's methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from agboss_sql.contracts.errors import AgbossError
from agboss_sql.sql.checkpoint.saver import SqlCheckpointSaver


@dataclass(frozen=True)
class ImportReport:
    """What an import wrote: threads, checkpoints (every namespace) and pending writes."""

    threads: int = 0
    checkpoints: int = 0
    writes: int = 0

    def __add__(self, other: ImportReport) -> ImportReport:
        return ImportReport(
            self.threads + other.threads,
            self.checkpoints + other.checkpoints,
            self.writes + other.writes,
        )


class ImportMismatchError(AgbossError):
    """After a thread was imported, the target answers its latest checkpoint of a namespace
    otherwise than the source: another checkpoint, other values, versions, metadata or
    pending writes (compared as the target's serializer writes them)."""

    code = "agboss.checkpoint_import_mismatch"


@dataclass(frozen=True)
class _Put:
    config: RunnableConfig
    found: CheckpointTuple
    new_versions: dict[str, Any]
    writes: list[tuple[str, list[tuple[str, Any]]]]


def _thread_config(
    thread_id: str, ns: str | None = None, checkpoint_id: str | None = None
) -> RunnableConfig:
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        configurable["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _ns(found: CheckpointTuple) -> str:
    return str(found.config["configurable"].get("checkpoint_ns", ""))


def _parent_id(found: CheckpointTuple) -> str | None:
    if found.parent_config is None:
        return None
    parent = found.parent_config["configurable"].get("checkpoint_id")
    return str(parent) if parent else None


def _plan(thread_id: str, found: Sequence[CheckpointTuple]) -> list[_Put]:
    """The puts that write a thread's checkpoints (every namespace) as LangGraph would:
    oldest first in each namespace, each with the versions new since its parent (all of
    them when the parent is not among `found`), then its pending writes, task by task in
    the order the source answered them."""
    ordered = sorted(found, key=lambda t: (_ns(t), str(t.checkpoint["id"])))
    versions: dict[tuple[str, str], dict[str, Any]] = {}
    puts = []
    for each in ordered:
        ns, parent = _ns(each), _parent_id(each)
        before = versions.get((ns, parent), {}) if parent is not None else {}
        current = dict(each.checkpoint["channel_versions"])
        versions[(ns, str(each.checkpoint["id"]))] = current
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in each.pending_writes or ():
            by_task.setdefault(str(task_id), []).append((channel, value))
        puts.append(
            _Put(
                _thread_config(thread_id, ns, parent),
                each,
                {channel: v for channel, v in current.items() if before.get(channel) != v},
                list(by_task.items()),
            )
        )
    return puts


def _written(puts: Sequence[_Put]) -> ImportReport:
    """What the puts wrote; a thread the source has no checkpoint of is not counted."""
    return ImportReport(
        1 if puts else 0, len(puts), sum(len(writes) for p in puts for _, writes in p.writes)
    )


def _threads_given(thread_ids: Iterable[str]) -> list[str]:
    if isinstance(thread_ids, str | bytes):
        raise TypeError(f"thread_ids: an iterable of thread ids, not one ({thread_ids!r})")
    return list(dict.fromkeys(thread_ids))


def _target_config(thread_id: str, put: _Put) -> RunnableConfig:
    return _thread_config(thread_id, _ns(put.found), str(put.found.checkpoint["id"]))


def _threads_in(found: Iterable[CheckpointTuple]) -> list[str]:
    threads: dict[str, None] = {}
    for each in found:
        threads.setdefault(str(each.config["configurable"]["thread_id"]), None)
    return list(threads)


async def _athreads_in(found: AsyncIterator[CheckpointTuple]) -> list[str]:
    threads: dict[str, None] = {}
    async for each in found:
        threads.setdefault(str(each.config["configurable"]["thread_id"]), None)
    return list(threads)


def _latest(found: Iterable[CheckpointTuple]) -> dict[str, CheckpointTuple]:
    """Per namespace, its newest checkpoint."""
    latest: dict[str, CheckpointTuple] = {}
    for each in found:
        ns = _ns(each)
        if ns not in latest or str(each.checkpoint["id"]) > str(latest[ns].checkpoint["id"]):
            latest[ns] = each
    return latest


def _facts(serde: Any, found: CheckpointTuple) -> tuple[Any, ...]:
    """What must match, each value serialized by one serializer (so values compare
    whatever their types' `__eq__`), in dicts (so whatever order a saver answers keys in)."""
    checkpoint = found.checkpoint
    writes = sorted(
        (str(task), channel, serde.dumps_typed(value))
        for task, channel, value in found.pending_writes or ()
    )
    return (
        str(checkpoint["id"]),
        _parent_id(found),
        {k: serde.dumps_typed(v) for k, v in checkpoint["channel_values"].items()},
        dict(checkpoint["channel_versions"]),
        {k: dict(v) for k, v in checkpoint["versions_seen"].items()},
        {k: serde.dumps_typed(v) for k, v in found.metadata.items()},
        writes,
    )


def _check(
    target: SqlCheckpointSaver,
    thread_id: str,
    ns: str,
    source: CheckpointTuple,
    ours: CheckpointTuple | None,
) -> None:
    if ours is None or _facts(target.serde, source) != _facts(target.serde, ours):
        raise ImportMismatchError(
            f"thread {thread_id!r}, namespace {ns!r}: the target's latest checkpoint "
            f"({ours.checkpoint['id'] if ours else 'none'}) does not match the source's "
            f"({source.checkpoint['id']}) after the import"
        )


def _import_one(
    source: BaseCheckpointSaver[Any], target: SqlCheckpointSaver, thread_id: str, verify: bool
) -> ImportReport:
    found = list(source.list(_thread_config(thread_id)))
    puts = _plan(thread_id, found)
    for put in puts:
        target.put(put.config, put.found.checkpoint, put.found.metadata, put.new_versions)
        for task_id, writes in put.writes:
            target.put_writes(_target_config(thread_id, put), writes, task_id)
    if verify:
        for ns, latest in _latest(found).items():
            _check(target, thread_id, ns, latest, target.get_tuple(_thread_config(thread_id, ns)))
    return _written(puts)


def import_threads(
    source: BaseCheckpointSaver[Any],
    target: SqlCheckpointSaver,
    thread_ids: Iterable[str] | None = None,
    *,
    verify: bool = True,
) -> ImportReport:
    """Write the threads `thread_ids` of `source` (every thread it lists when None, read in
    a first pass over `source.list(None)`) into `target`: every checkpoint of every
    namespace, oldest first, with its pending writes (see the module's docstring). Safe to
    run again; a run that stopped halfway is finished by the next.

    With `verify`, each thread's newest checkpoint of each namespace is read back from
    `target` and compared with the source's: `ImportMismatchError` if they differ. Errors
    of either saver propagate as they are raised; the threads written before stay written.
    One thread's checkpoints are held in memory at a time; a thread the source has none of
    is not counted. `thread_ids` given as one string is a `TypeError`, before anything is read."""
    threads = (
        _threads_given(thread_ids) if thread_ids is not None else _threads_in(source.list(None))
    )
    report = ImportReport()
    for thread_id in threads:
        report += _import_one(source, target, thread_id, verify)
    return report


async def _aimport_one(
    source: BaseCheckpointSaver[Any], target: SqlCheckpointSaver, thread_id: str, verify: bool
) -> ImportReport:
    found = [each async for each in source.alist(_thread_config(thread_id))]
    puts = _plan(thread_id, found)
    for put in puts:
        await target.aput(put.config, put.found.checkpoint, put.found.metadata, put.new_versions)
        for task_id, writes in put.writes:
            await target.aput_writes(_target_config(thread_id, put), writes, task_id)
    if verify:
        for ns, latest in _latest(found).items():
            _check(
                target,
                thread_id,
                ns,
                latest,
                await target.aget_tuple(_thread_config(thread_id, ns)),
            )
    return _written(puts)


async def aimport_threads(
    source: BaseCheckpointSaver[Any],
    target: SqlCheckpointSaver,
    thread_ids: Iterable[str] | None = None,
    *,
    verify: bool = True,
) -> ImportReport:
    """`import_threads` through the savers' async methods (`AsyncPostgresSaver`,
    `AsyncSqliteSaver`, the community `AIOMySQLSaver`, ...)."""
    threads = (
        _threads_given(thread_ids)
        if thread_ids is not None
        else await _athreads_in(source.alist(None))
    )
    report = ImportReport()
    for thread_id in threads:
        report += await _aimport_one(source, target, thread_id, verify)
    return report
