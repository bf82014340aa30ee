"""The fenced checkpoint saver's cases of the fence: a late writer refused after a takeover
(put, put_writes and their sync forms), every closed lease refused, a forged holder refused,
nothing of a refused write left behind, the lease check and the write in one step, and a
graph stopped at its first write after a takeover."""

from __future__ import annotations

import dataclasses
import operator
from typing import Annotated, Any, TypedDict

from agboss_sql.contracts.types import ExecutionLease
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing._saver_support import (
    CONTRACT,
    LEASE,
    LEASE_MS,
    TENANT,
    SaverOptions,
    Thread,
    as_dict,
    checkpoint,
    config,
    grow,
    ids_of,
    in_thread,
    latest_of,
    new_execution,
    new_thread,
    put,
    read_back,
    reader,
    refused,
    rows_of,
)


async def late_writer_refused(ctx: CaseContext, options: SaverOptions) -> None:
    """A frozen instance wakes after a takeover: its new checkpoint, its overwrite of the
    new holder's checkpoint and its pending writes are refused as superseded; the new
    holder's thread reads as it wrote it, and nothing of the refused writes is stored."""
    leases_a, leases_b = ctx.store(LEASE, 0), ctx.store(LEASE, 1)
    a, b = ctx.store(CONTRACT, 0), ctx.store(CONTRACT, 1)
    execution, thread = new_execution(), new_thread()
    lease_a = await leases_a.acquire(TENANT, execution, LEASE_MS)
    assert lease_a is not None and lease_a.lease_epoch == 1
    first = await put(a, config(thread, lease_a), {"answer": ["from a, step 1"]})

    await ctx.clock.advance(LEASE_MS + 1)
    lease_b = await leases_b.acquire(TENANT, execution, LEASE_MS)
    assert lease_b is not None and lease_b.lease_epoch == 2
    second = await put(b, config(thread, as_dict(lease_b), first), {"answer": ["from b"]})
    rows = await rows_of(options, thread)

    error = await refused(
        put(a, config(thread, lease_a, first), {"answer": ["late"]}), "a late put"
    )
    assert error.reason == "superseded" and error.token == 1, (error.reason, error.token)
    stale = checkpoint({"answer": ["from a, overwrite"]})
    stale["id"] = second
    await refused(
        a.aput(config(thread, lease_a, first), stale, {"source": "loop", "step": 2}, {}),
        "a late overwrite of the new holder's checkpoint",
    )
    await refused(
        a.aput_writes(config(thread, lease_a, second), [("answer", "late")], "task-1"),
        "a late put_writes",
    )

    latest = await latest_of(reader(ctx), thread)
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == second
    assert latest.checkpoint["channel_values"] == {"answer": ["from b"]}, latest.checkpoint
    assert latest.pending_writes == [], f"[fence] refused writes stored: {latest.pending_writes}"
    assert await ids_of(a, thread) == [second, first]
    assert await rows_of(options, thread) == rows, "[fence] a refused write left rows behind"

    # B keeps writing; a retried task adds nothing; A's write under B's task is refused.
    for _ in range(2):
        await b.aput_writes(config(thread, lease_b, second), [("answer", "b's")], "task-2")
    await refused(
        a.aput_writes(config(thread, lease_a, second), [("answer", "b's")], "task-2"),
        "a late put_writes under the new holder's task",
    )
    found = await reader(ctx).aget_tuple(config(thread, parent=second))
    assert found is not None and found.pending_writes == [("task-2", "answer", "b's")]
    third = await put(b, config(thread, lease_b, second), {"answer": "from b, step 3"})
    latest = await latest_of(a, thread)
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == third


async def late_sync_writer_refused(ctx: CaseContext, options: SaverOptions) -> None:
    """The same through the sync `put` and `put_writes` (a sync graph's calls)."""
    leases_a, leases_b = ctx.store(LEASE, 0), ctx.store(LEASE, 1)
    a, b = ctx.store(CONTRACT, 0), ctx.store(CONTRACT, 1)
    execution, thread = new_execution(), new_thread()
    lease_a = await leases_a.acquire(TENANT, execution, LEASE_MS)
    assert lease_a is not None
    made = checkpoint({"n": [1]})
    meta = {"source": "loop", "step": 1}
    stored = await in_thread(a.put, config(thread, lease_a), made, meta, made["channel_versions"])
    first = stored["configurable"]["checkpoint_id"]
    await in_thread(a.put_writes, config(thread, lease_a, first), [("n", 1)], "task-1")

    await ctx.clock.advance(LEASE_MS + 1)
    lease_b = await leases_b.acquire(TENANT, execution, LEASE_MS)
    assert lease_b is not None
    rows = await rows_of(options, thread)
    late = checkpoint({"n": [2]})
    error = await refused(
        in_thread(a.put, config(thread, lease_a, first), late, meta, late["channel_versions"]),
        "a late sync put",
    )
    assert error.reason == "superseded", error.reason
    await refused(
        in_thread(a.put_writes, config(thread, lease_a, first), [("n", 3)], "task-2"),
        "a late sync put_writes",
    )
    found = await reader(ctx).aget_tuple(config(thread))
    assert found is not None and found.config["configurable"]["checkpoint_id"] == first
    assert found.checkpoint["channel_values"] == {"n": [1]}
    assert found.pending_writes == [("task-1", "n", 1)], found.pending_writes
    assert await rows_of(options, thread) == rows, "[fence] a refused write left rows behind"
    await in_thread(b.put_writes, config(thread, lease_b, first), [("n", 4)], "task-3")


async def fence_at_expiry(ctx: CaseContext, options: SaverOptions) -> None:
    """The fence decides by the store's time: held 1 ms before the lease's expiry, over at
    it (though nobody took it); the lease taken again writes, its old epoch never again."""
    leases, a = ctx.store(LEASE, 0), ctx.store(CONTRACT, 0)
    execution, thread = new_execution(), new_thread()
    lease = await leases.acquire(TENANT, execution, LEASE_MS)
    assert lease is not None
    await ctx.clock.advance(LEASE_MS - 1)
    first = await put(a, config(thread, lease), {"n": 1})
    await ctx.clock.advance(1)
    error = await refused(put(a, config(thread, lease, first), {"n": 2}), "a put at expiry")
    assert error.reason == "expired", error.reason
    await refused(
        a.aput_writes(config(thread, lease, first), [("n", 3)], "task-1"), "writes at expiry"
    )
    renewed = await leases.acquire(TENANT, execution, LEASE_MS)
    assert renewed is not None and renewed.lease_epoch == 2
    await put(a, config(thread, renewed, first), {"n": 2})
    await refused(put(a, config(thread, lease, first), {"n": 4}), "a put at the old epoch")


async def closed_leases_refused(ctx: CaseContext, options: SaverOptions) -> None:
    """A released, yielded, finished or never-granted lease writes nothing, each refused
    with its reason."""
    leases, a = ctx.store(LEASE, 0), ctx.store(CONTRACT, 0)
    thread = new_thread()
    released = await leases.acquire(TENANT, new_execution(), LEASE_MS)
    assert released is not None and await leases.release(released)
    yielded = await leases.acquire(TENANT, new_execution(), LEASE_MS)
    assert yielded is not None and await leases.yield_lease(yielded)
    finished = await leases.acquire(TENANT, new_execution(), LEASE_MS)
    assert finished is not None and await leases.finish(finished)
    absent = ExecutionLease(TENANT, "never-taken", ctx.instance_id(0), 1, LEASE_MS)
    for lease, reason in [
        (released, "released"),
        (yielded, "yielded"),
        (finished, "finished"),
        (absent, "lease-absent"),
    ]:
        error = await refused(put(a, config(thread, lease), {"n": 1}), f"a put at a {reason} lease")
        assert error.reason == reason, (reason, error.reason)
    assert await ids_of(reader(ctx), thread) == []


async def no_lease_refused(ctx: CaseContext, options: SaverOptions) -> None:
    """A fenced saver's write without a lease, or with one that names no holder, raises
    `ValueError` and writes nothing."""
    leases, a = ctx.store(LEASE, 0), ctx.store(CONTRACT, 0)
    thread = new_thread()
    lease = await leases.acquire(TENANT, new_execution(), LEASE_MS)
    assert lease is not None
    no_holder = {"tenant_id": TENANT, "execution_id": lease.execution_id, "lease_epoch": 1}
    for bad in (None, no_holder, dataclasses.replace(lease, holder_instance_id="")):
        for kind in ("put", "put_writes"):
            try:
                if kind == "put":
                    await put(a, config(thread, bad), {"n": 1})
                else:
                    await a.aput_writes(config(thread, bad, "c-1"), [("n", 1)], "task-1")
            except ValueError:
                continue
            raise AssertionError(f"[fence] a {kind} under {bad!r} was not refused (ValueError)")
    assert await ids_of(reader(ctx), thread) == []


async def forged_holder_refused(ctx: CaseContext, options: SaverOptions) -> None:
    """A lease built by hand under another instance's name at the holder's live epoch is
    refused as superseded (the fence checks the holder, not the epoch alone)."""
    leases, a = ctx.store(LEASE, 0), ctx.store(CONTRACT, 0)
    thread = new_thread()
    lease = await leases.acquire(TENANT, new_execution(), LEASE_MS)
    assert lease is not None
    first = await put(a, config(thread, lease), {"n": 1})
    other = ctx.instance_id(1)
    for forged in (dataclasses.replace(lease, holder_instance_id=other), as_dict(lease, other)):
        error = await refused(
            put(a, config(thread, forged, first), {"n": "forged"}), f"a put under {forged!r}"
        )
        assert error.reason == "superseded", error.reason
        await refused(
            a.aput_writes(config(thread, forged, first), [("n", 2)], "task-1"),
            f"pending writes under {forged!r}",
        )
    latest = await latest_of(reader(ctx), thread)
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == first
    assert latest.pending_writes == [], latest.pending_writes


async def appends_only_while_held(ctx: CaseContext, options: SaverOptions) -> None:
    """A growing conversation: the put that would grow it after a takeover is refused and
    stores nothing, and is not remembered either: the new holder's conversation, and the
    old instance's own once it holds the lease again, read back whole."""
    leases_a, leases_b = ctx.store(LEASE, 0), ctx.store(LEASE, 1)
    a, b = ctx.store(CONTRACT, 0), ctx.store(CONTRACT, 1)
    execution, thread_id = new_execution(), new_thread()
    lease_a = await leases_a.acquire(TENANT, execution, LEASE_MS)
    assert lease_a is not None
    thread = Thread(a, thread_id, lease_a)
    ids, states = await grow(thread, [], range(12))

    await ctx.clock.advance(LEASE_MS + 1)
    lease_b = await leases_b.acquire(TENANT, execution, LEASE_MS)
    assert lease_b is not None
    rows = await rows_of(options, thread_id)
    error = await refused(grow(thread, states[-1], range(12, 13), tag="late "), "a late append")
    assert error.reason == "superseded", error.reason
    assert await rows_of(options, thread_id) == rows, "[fence] a refused append left rows"

    # B goes on from the thread as it reads it.
    other = Thread(b, thread_id, lease_b)
    latest = await latest_of(b, thread_id)
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == ids[-1]
    other.values = dict(latest.checkpoint["channel_values"])
    other.versions, other.last = dict(latest.checkpoint["channel_versions"]), ids[-1]
    more_ids, more_states = await grow(other, states[-1], range(12, 15), tag="b ")
    ids, states = ids + more_ids, states + more_states
    await read_back(reader(ctx), thread_id, ids, states)

    # B gives the lease back; A takes it again and goes on from the thread as it reads.
    assert await leases_b.release(lease_b)
    lease_again = await leases_a.acquire(TENANT, execution, LEASE_MS)
    assert lease_again is not None
    latest = await latest_of(a, thread_id)
    assert latest is not None
    thread.lease, thread.last = lease_again, latest.config["configurable"]["checkpoint_id"]
    thread.values = dict(latest.checkpoint["channel_values"])
    thread.versions = dict(latest.checkpoint["channel_versions"])
    again_ids, again_states = await grow(thread, states[-1], range(15, 18), tag="a ")
    await read_back(reader(ctx), thread_id, ids + again_ids, states + again_states)


def _steps(sent: list[str], is_check: Any, end: str, what: str) -> None:
    """`sent` is one statement holding the lease check, or a transaction whose first
    statement is the lease check, ended by `end`."""
    if len(sent) == 1 and end == "COMMIT":
        assert is_check(sent[0]), f"[one-step] {what}: its one statement checks no lease: {sent}"
        return
    assert sent and sent[0].upper().startswith("BEGIN"), f"[one-step] {what}: {sent}"
    assert len(sent) >= 3 and is_check(sent[1]), (
        f"[one-step] {what}: the lease check is not the first statement of its transaction: {sent}"
    )
    assert sent[-1].upper() == end, f"[one-step] {what}: does not end with {end}: {sent}"
    assert not any(s.upper() == "COMMIT" for s in sent[:-1]), f"[one-step] {what}: {sent}"


async def one_step(ctx: CaseContext, options: SaverOptions) -> None:
    """The fenced put and put_writes are each one step: one statement with the lease check
    folded in, or a transaction whose first statement checks the lease (taking its row's
    lock before any write) and that commits the write with it; a refusal rolls back."""
    if options.statements is None:
        import pytest

        pytest.skip("no `statements=` given: the saver's steps cannot be seen")
    record, is_check = options.statements.record, options.statements.is_lease_check
    leases, a = ctx.store(LEASE, 0), ctx.store(CONTRACT, 0)
    thread = new_thread()
    lease = await leases.acquire(TENANT, new_execution(), LEASE_MS)
    assert lease is not None
    with record(a) as sent:
        first = await put(a, config(thread, lease), {"n": [1]})
    _steps(list(sent), is_check, "COMMIT", "a fenced put")
    with record(a) as sent:
        await a.aput_writes(config(thread, lease, first), [("n", 2)], "task-1")
    _steps(list(sent), is_check, "COMMIT", "a fenced put_writes")
    await ctx.clock.advance(LEASE_MS)
    with record(a) as sent:
        await refused(put(a, config(thread, lease, first), {"n": 3}), "a put at expiry")
    refusal = list(sent)
    if len(refusal) > 1 and is_check(refusal[0]) and not refusal[0].upper().startswith("BEGIN"):
        refusal = refusal[1:]  # the folded statement matched nothing; its reason is read after
    _steps(refusal, is_check, "ROLLBACK", "a refused put")


class ApprovalState(TypedDict, total=False):
    steps: Annotated[list[str], operator.add]
    decision: str


def _approval_graph() -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def draft(state: ApprovalState) -> dict[str, Any]:
        return {"steps": ["draft"]}

    def approve(state: ApprovalState) -> dict[str, Any]:
        return {"decision": str(interrupt("send?")), "steps": ["approve"]}

    def send(state: ApprovalState) -> dict[str, Any]:
        return {"steps": ["send" if state["decision"] == "yes" else "dropped"]}

    graph = StateGraph(ApprovalState)
    for node in (draft, approve, send):
        graph.add_node(node.__name__, node)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "approve")
    graph.add_edge("approve", "send")
    graph.add_edge("send", END)
    return graph


async def graph_stops_after_takeover(ctx: CaseContext, options: SaverOptions) -> None:
    """A graph on the fenced saver runs while its lease is held; the zombie's resume after
    a takeover is refused at its first write, and the new holder resumes the pause."""
    from langgraph.types import Command

    leases_a, leases_b = ctx.store(LEASE, 0), ctx.store(LEASE, 1)
    execution, thread = new_execution(), new_thread()
    lease_a = await leases_a.acquire(TENANT, execution, LEASE_MS)
    assert lease_a is not None
    graph_a = _approval_graph().compile(checkpointer=ctx.store(CONTRACT, 0))
    paused = await graph_a.ainvoke({"steps": []}, config(thread, lease_a))
    assert paused["steps"] == ["draft"], paused
    await ctx.clock.advance(LEASE_MS)
    lease_b = await leases_b.acquire(TENANT, execution, LEASE_MS)
    assert lease_b is not None
    await refused(graph_a.ainvoke(Command(resume="no"), config(thread, lease_a)), "a zombie's step")
    graph_b = _approval_graph().compile(checkpointer=ctx.store(CONTRACT, 1))
    done = await graph_b.ainvoke(Command(resume="yes"), config(thread, lease_b))
    assert done["steps"] == ["draft", "approve", "send"], done
