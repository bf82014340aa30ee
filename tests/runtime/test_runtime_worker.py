"""The worker's behaviours on the database under test, each with two or three workers in
this process on one database: a parent yields while its children run and is woken by
whoever finishes the last one; the sweep leaves a waiting parent alone; a resume raced from
two workers runs the branch once; a cancel from another worker unwinds once, last first;
durable steps replay and a zombie's step write is refused; readiness and the sweep follow
the step slots; a graceful stop releases the leases it held."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from agboss_sql.application import HealthStatus
from agboss_sql.contracts.errors import ExecutionFencedError, NotPausedError
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.stores import CANCEL_REQUEST_KEY, COMPENSATED_PREFIX, UNWINDING_KEY
from agboss_sql.contracts.types import ExecutionRecordStatus, PauseStatus
from agboss_sql.lab.business import committed_business_rows
from agboss_sql.lab.tree_worker import (
    END_DECISION_KEY,
    STEP_EFFECT,
    TreeSpec,
    Worker,
    WorkerConfig,
    _Run,
    descendants_of,
    end_decision,
    leaves_of,
    pause_id_of,
    submit_tree,
)
from agboss_sql.runtime.slots import StepKind
from agboss_sql.runtime.unwind import Unwinder
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import execution_lease_events, fenced_effect_results

Event = dict[str, Any]
WAIT_S = 30.0
"""Bound of every wait for the workers (they take well under a second on an idle machine;
the bound is for a loaded CI runner)."""


async def until(
    check: Callable[[], Awaitable[bool]],
    what: str | Callable[[], str],
    timeout_s: float = WAIT_S,
) -> None:
    """Poll `check` until it is true; fail naming `what` (a callable: built at the
    failure, to show the state then) past the bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"waited {timeout_s:.0f} s for {said}")
        await asyncio.sleep(0.02)


class Workers:
    """Workers made by a test, each with its event list, all stopped after it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[Worker] = []
        self.events: dict[str, list[Event]] = {}
        self.tenant = f"t-{uuid.uuid4().hex[:8]}"

    async def __call__(self, name: str, *, background: bool = False, **settings: Any) -> Worker:
        events: list[Event] = []
        config = WorkerConfig(
            url=self.url,
            instance_id=name,
            lease_ms=settings.pop("lease_ms", 3_000),
            step_ms=settings.pop("step_ms", 0),
            **settings,
        )
        worker = Worker(config, emit=events.append)
        await worker.start(background=background)
        self.made.append(worker)
        self.events[name] = events
        return worker

    def of(self, kind: str, **match: Any) -> list[Event]:
        return [
            {**e, "worker": w}
            for w, events in self.events.items()
            for e in events
            if e.get("kind") == kind and all(e.get(k) == v for k, v in match.items())
        ]


@pytest.fixture
async def workers(sql: SqlConnection, sql_url: str) -> AsyncIterator[Workers]:
    made = Workers(sql_url)
    yield made
    for worker in made.made:
        await worker.stop()


async def status_of(worker: Worker, tenant: str, tree: str) -> ExecutionRecordStatus | None:
    record = await worker.records.get(tenant, tree)
    return None if record is None else record.status


def is_status(
    worker: Worker, tenant: str, tree: str, status: ExecutionRecordStatus
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await status_of(worker, tenant, tree) is status

    return check


async def lease_log(sql: SqlConnection, tenant: str, execution: str) -> list[tuple[str, int, str]]:
    """`(instance, epoch, kind)` of the execution's lease events, in save order."""
    t = execution_lease_events
    result = await sql.execute(
        sa.select(t.c.instance_id, t.c.lease_epoch, t.c.kind)
        .where(t.c.tenant_id == tenant, t.c.execution_id == execution)
        .order_by(t.c.id)
    )
    return [(str(r[0]), int(r[1]), str(r[2])) for r in result.rows]


async def stored_steps(sql: SqlConnection, execution: str, step: str) -> int:
    t = fenced_effect_results
    result = await sql.execute(
        sa.select(sa.func.count()).where(
            t.c.step_execution_id == execution, t.c.step_idempotency_key == step
        )
    )
    return int(result.rows[0][0])


async def run_to_the_wait(workers: Workers, a: Worker, tree: str, spec: TreeSpec) -> None:
    """Submit a tree on `a` and let it run until it waits for its children."""
    await a.submit(workers.tenant, tree, spec)

    async def waiting() -> bool:
        return bool(workers.of("yielded", tree=tree))

    await until(waiting, f"{tree} waiting for its children (its lease yielded)")

    async def run_ended() -> bool:
        # After its yield the run still reads the record and the children (a wake seen
        # there is reclaimed by `a`): the wait is reached when that run has ended.
        return tree not in a._roots

    await until(run_ended, f"{tree}'s run on {a.instance_id} ending at its wait")
    assert await status_of(a, workers.tenant, tree) is ExecutionRecordStatus.QUEUED


async def test_a_parent_yields_while_its_children_run_and_the_last_finisher_wakes_it(
    workers: Workers, sql: SqlConnection
) -> None:
    a, b = await workers("wa"), await workers("wb")
    tenant, tree = workers.tenant, "tree-yield"
    await run_to_the_wait(workers, a, tree, TreeSpec(fan_out=2, depth=1))
    # Waiting: the record left `running`, the lease is yielded, the slot is free.
    assert await lease_log(sql, tenant, tree) == [("wa", 1, "acquired"), ("wa", 1, "yielded")]
    assert a.slots.busy == 0
    assert [c.status for c in await a.queue.children(workers.tenant, tree)] == ["queued", "queued"]
    # Another worker runs both children; the one finishing the last wakes the tree and runs
    # it on from its stored steps.
    assert await b.child_worker.run_once()
    assert await status_of(b, tenant, tree) is ExecutionRecordStatus.QUEUED
    assert await b.child_worker.run_once()
    await until(is_status(b, tenant, tree, ExecutionRecordStatus.SUCCEEDED), f"{tree} to end")

    async def lease_finished() -> bool:
        return (await lease_log(sql, tenant, tree))[-1][2] == "finished"

    await until(lease_finished, f"the lease of {tree} finished")
    assert workers.of("woke", tree=tree, moved=True) == [
        {**workers.of("woke", tree=tree)[0], "worker": "wb"}
    ]
    assert [e["worker"] for e in workers.of("tree-end", tree=tree)] == ["wb"]
    log = await lease_log(sql, tenant, tree)
    assert log[2:] == [("wb", 2, "acquired"), ("wb", 2, "finished")]
    # The steps finished before the wait replayed on wb; the branch closed once.
    replays = [e["step"] for e in workers.of("step", execution=tree, replayed=True)]
    assert set(replays) == {"plan", "reserve"}
    assert await stored_steps(sql, tree, "close") == 1


async def test_a_mid_level_parent_yields_and_the_finish_of_its_last_child_makes_it_claimable(
    workers: Workers, sql: SqlConnection
) -> None:
    a, b, c = await workers("wa"), await workers("wb"), await workers("wc")
    tenant, tree = workers.tenant, "tree-mid"
    mid, leaf = f"{tree}.c0", f"{tree}.c0.c0"
    await run_to_the_wait(workers, a, tree, TreeSpec(fan_out=1, depth=2))
    # wb runs the mid-level child: it queues its leaf and waits without lease or slot.
    assert await b.child_worker.run_once()
    assert await lease_log(sql, tenant, mid) == [("wb", 1, "acquired"), ("wb", 1, "yielded")]
    assert b.slots.busy == 0
    [row] = await b.queue.children(tenant, tree)
    assert (row.child_execution_id, row.status, row.attempt) == (mid, "waiting", 1)
    # Its lease is yielded (anyone could take it), yet no rescue takes it, and the only
    # claimable child is the leaf.
    assert await c.child_worker.rescue_once() == 0
    assert [k for i, _, k in await lease_log(sql, tenant, mid) if i == "wc"] == []
    assert await a.child_worker.run_once()
    assert workers.of("child-run", child=leaf)[0]["worker"] == "wa"
    # The leaf's finish made the parent claimable again, in the same step.
    [row] = await c.queue.children(tenant, tree)
    assert (row.status, row.attempt) == ("queued", 1)
    assert await c.child_worker.run_once()
    await until(is_status(c, tenant, tree, ExecutionRecordStatus.SUCCEEDED), f"{tree} to end")
    assert await lease_log(sql, tenant, mid) == [
        ("wb", 1, "acquired"),
        ("wb", 1, "yielded"),
        ("wc", 2, "acquired"),
        ("wc", 2, "finished"),
    ]
    [row] = await c.queue.children(tenant, tree)
    assert (row.status, row.attempt) == ("finished", 2)
    split = [(e["worker"], e["replayed"]) for e in workers.of("step", execution=mid, step="split")]
    assert split == [("wb", False), ("wc", True)]
    assert await stored_steps(sql, mid, "split") == 1
    assert await stored_steps(sql, mid, "merge") == 1
    assert (await committed_business_rows(sql)).count(f"{leaf}|charge") == 1


async def test_a_one_slot_worker_runs_depth_two_trees_to_the_end(
    workers: Workers, sql: SqlConnection
) -> None:
    """Every slot taken, parents at every level waiting on children: nothing deadlocks,
    because a waiting parent (root or child) yields its slot and its lease."""
    a = await workers("wa", background=True, max_concurrent_steps=1, lease_ms=2_000)
    tenant, spec = workers.tenant, TreeSpec(fan_out=2, depth=2)
    trees = [f"tree-full-{i}" for i in range(3)]
    for tree in trees:
        await a.submit(tenant, tree, spec)
    for tree in trees:
        await until(is_status(a, tenant, tree, ExecutionRecordStatus.SUCCEEDED), f"{tree} to end")
    mids = [child for tree in trees for child, depth in descendants_of(tree, spec) if depth == 1]
    assert {e["tree"] for e in workers.of("yielded")} >= set(mids)
    rows = await committed_business_rows(sql)
    assert sorted(r for r in rows if r.endswith("|charge")) == sorted(
        f"{leaf}|charge" for tree in trees for leaf in leaves_of(tree, spec)
    )


async def test_the_sweep_leaves_a_waiting_parent_alone(
    workers: Workers, sql: SqlConnection
) -> None:
    a, c = await workers("wa"), await workers("wc")
    tenant, tree = workers.tenant, "tree-waiting"
    await run_to_the_wait(workers, a, tree, TreeSpec(fan_out=1, depth=1))
    # Its lease is yielded (anyone could take it), but its record is not `running`.
    claimed = await c.sweep.run_once()
    assert all(lease.execution_id != tree for lease in claimed)
    assert [k for i, _, k in await lease_log(sql, tenant, tree) if i == "wc"] == []


async def test_a_resume_raced_from_two_workers_runs_the_branch_once(
    workers: Workers, sql: SqlConnection
) -> None:
    a, b = await workers("wa"), await workers("wb")
    tenant, tree = workers.tenant, "tree-paused"
    await a.submit(tenant, tree, TreeSpec(fan_out=1, depth=1, pause=True))
    await until(is_status(a, tenant, tree, ExecutionRecordStatus.PAUSED), f"{tree} paused")
    # Paused: no lease held (the record moves first, then the lease is released).

    async def released() -> bool:
        return (await lease_log(sql, tenant, tree))[-1] == ("wa", 1, "released")

    await until(released, f"{tree} released while paused")
    answers = await asyncio.gather(
        a.resume(tenant, tree, {"approved": True, "by": "wa"}),
        b.resume(tenant, tree, {"approved": True, "by": "wb"}),
        return_exceptions=True,
    )
    assert sorted(type(x).__name__ for x in answers) == ["NotPausedError", "bool"]
    assert [x for x in answers if not isinstance(x, BaseException)] == [True]
    with pytest.raises(NotPausedError):
        await a.resume(tenant, tree, {"approved": True})
    await until(is_status(a, tenant, tree, ExecutionRecordStatus.QUEUED), f"{tree} waiting")
    assert await a.child_worker.run_once()
    await until(is_status(a, tenant, tree, ExecutionRecordStatus.SUCCEEDED), f"{tree} to end")
    pause = await a.pauses.get(tenant, pause_id_of(tree))
    assert pause is not None and pause.status is PauseStatus.TAKEN
    assert len(workers.of("pause-taken", tree=tree)) == 1
    children = await a.queue.children(workers.tenant, tree)
    assert [(c.status, c.attempt) for c in children] == [("finished", 1)]
    rows = await committed_business_rows(sql)
    assert rows.count(f"{tree}|reserve") == 1
    assert rows.count(f"{tree}.c0|charge") == 1
    assert await stored_steps(sql, tree, "close") == 1


async def test_a_cancel_from_another_worker_unwinds_once_last_first(
    workers: Workers, sql: SqlConnection
) -> None:
    spec = TreeSpec(fan_out=2, depth=1)
    # One slot and 300 ms steps: the second leaf charges at least 600 ms after the first,
    # so the cancel (sent once the first charged) lands while the tree is still running.
    a = await workers("wa", background=True, step_ms=300, lease_ms=1_500, max_concurrent_steps=1)
    b = await workers("wb")
    tenant, tree = workers.tenant, "tree-cancel"
    await a.submit(tenant, tree, spec)
    first = f"{tree}.c0|charge"

    async def charged() -> bool:
        return first in await committed_business_rows(sql)

    await until(charged, f"{first} charged")
    assert await b.cancel(tenant, tree) is True
    await until(is_status(a, tenant, tree, ExecutionRecordStatus.CANCELLED), f"{tree} cancelled")
    rows = await committed_business_rows(sql)
    undos = [r for r in rows if r.startswith(f"{tree}|undo:")]
    charged_leaves = [leaf for leaf in leaves_of(tree, spec) if f"{leaf}|charge" in rows]
    assert f"{tree}.c0" in charged_leaves
    # Each charge refunded once and the reserve undone once, last done first.
    assert undos == [
        *(f"{tree}|undo:charge:{leaf}" for leaf in reversed(charged_leaves)),
        f"{tree}|undo:reserve",
    ]
    keys = set(await a.tree.list(tenant, tree))
    assert UNWINDING_KEY in keys
    assert f"{COMPENSATED_PREFIX}reserve" in keys
    assert len(workers.of("unwound", tree=tree)) == 1
    record = await a.records.get(tenant, tree)
    assert record is not None and isinstance(record.outcome, dict)
    assert record.outcome["reason"] == "cancelled by request"
    # Every child ended (each finished once); none was charged after the undo.
    assert {c.status for c in await a.queue.children(workers.tenant, tree)} == {"finished"}


async def cancel_between_the_close_decision_and_the_end(
    workers: Workers, sql: SqlConnection, tree: str, *, deciding: bool = True
) -> bool:
    """Run a tree whose close is interrupted, right after it decided to close, by a cancel
    from another worker; wait for the tree to end. The cancel's answer. With
    `deciding=False` the root is BROKEN on purpose: it only reads for a cancel request
    before its close (a check, then the close: two steps), as the worker once did."""
    spec = TreeSpec(fan_out=1, depth=1)
    # Long leases: no renewal (which reads the cancel request) falls inside the few
    # milliseconds between the cancel and the end, so the broken root's race is certain.
    a, b, c = [await workers(name, lease_ms=60_000) for name in ("wa", "wb", "wc")]
    tenant = workers.tenant
    answers: list[bool] = []
    for worker in (a, b):
        decide = worker._decide_close if deciding else worker._cancel_requested

        async def decide_then_cancel(run: _Run, decide: Any = decide) -> bool:
            went_on = await decide(run) if deciding else not await decide(run)
            answers.append(await c.cancel(tenant, tree))
            return bool(went_on)

        worker._decide_close = decide_then_cancel  # type: ignore[method-assign]
    await run_to_the_wait(workers, a, tree, spec)
    assert await b.child_worker.run_once()

    async def ended() -> bool:
        return await status_of(a, tenant, tree) in (
            ExecutionRecordStatus.SUCCEEDED,
            ExecutionRecordStatus.CANCELLED,
        )

    await until(ended, f"{tree} to end")
    assert len(answers) == 1
    return answers[0]


async def test_a_cancel_after_the_close_decision_is_refused_and_the_tree_succeeds(
    workers: Workers, sql: SqlConnection
) -> None:
    tree = "tree-late-cancel"
    accepted = await cancel_between_the_close_decision_and_the_end(workers, sql, tree)
    tenant = workers.tenant
    assert accepted is False
    assert await status_of(workers.made[0], tenant, tree) is ExecutionRecordStatus.SUCCEEDED
    assert len(workers.of("cancel-too-late", tree=tree)) == 1
    assert not workers.of("cancel-requested", tree=tree)
    keys = await workers.made[0].tree.list(tenant, tree)
    assert CANCEL_REQUEST_KEY not in keys
    assert end_decision(keys[END_DECISION_KEY]) == "close"
    assert not [r for r in await committed_business_rows(sql) if r.startswith(f"{tree}|undo:")]


async def test_the_late_cancel_test_catches_a_close_that_checks_then_ends(
    workers: Workers, sql: SqlConnection
) -> None:
    tree = "tree-late-cancel-broken"
    accepted = await cancel_between_the_close_decision_and_the_end(
        workers, sql, tree, deciding=False
    )
    # The cancel was accepted, and the tree succeeded all the same: the promise broken.
    assert accepted is True
    assert await status_of(workers.made[0], workers.tenant, tree) is ExecutionRecordStatus.SUCCEEDED


async def test_a_cancel_whose_request_was_never_written_still_wins_over_the_close(
    workers: Workers, sql: SqlConnection
) -> None:
    # The canceller died between its decision and its request: no holder ever sees the
    # request, and the root still unwinds when it comes to its close.
    spec = TreeSpec(fan_out=2, depth=1)
    a, b = await workers("wa"), await workers("wb")
    tenant, tree = workers.tenant, "tree-half-cancel"
    await run_to_the_wait(workers, a, tree, spec)
    decision = {"decision": "cancel", "by": "dead", "at": a.clock.now()}
    assert await a.tree.save_if_absent(tenant, tree, END_DECISION_KEY, decision)
    assert await b.child_worker.run_once()
    assert await b.child_worker.run_once()
    await until(is_status(b, tenant, tree, ExecutionRecordStatus.CANCELLED), f"{tree} cancelled")
    rows = await committed_business_rows(sql)
    # The children read the decision too (they charge nothing); whatever was charged was
    # refunded, once.
    for leaf in leaves_of(tree, spec):
        assert rows.count(f"{leaf}|charge") == rows.count(f"{tree}|undo:charge:{leaf}") <= 1
    assert rows.count(f"{tree}|undo:reserve") == 1
    assert UNWINDING_KEY in await b.tree.list(tenant, tree)
    # Another cancel of a tree a cancel already won: accepted again, and harmless.
    assert await b.cancel(tenant, tree) is True
    assert await status_of(b, tenant, tree) is ExecutionRecordStatus.CANCELLED


async def test_a_takeover_replays_finished_steps_and_the_zombies_step_write_is_refused(
    workers: Workers, sql: SqlConnection
) -> None:
    a = await workers("wa", lease_ms=1_000)
    b = await workers("wb", lease_ms=1_000)
    tenant, tree = workers.tenant, "tree-zombie"
    spec = TreeSpec(fan_out=1, depth=1)
    await submit_tree(a.tree, a.records, a.leases, tenant, tree, spec, a.clock)
    keeper = a._keeper(tree)
    assert await keeper.take(tenant, tree) is not None
    run = _Run(tenant, tree, tree, 0, keeper, spec)
    assert await a._step(run, "plan", StepKind.ROOT, lambda: a._work({"n": 1})) == {"n": 1}
    # wa freezes: nothing renews its lease; wb takes the tree over once it ran out.
    await keeper.stop()

    async def taken() -> bool:
        return await b.start_tree(tenant, tree, StepKind.DEEPER)

    await until(taken, f"wb taking {tree} over")
    await until(is_status(b, tenant, tree, ExecutionRecordStatus.QUEUED), f"{tree} waiting")
    plans = workers.of("step", execution=tree, step="plan")
    assert [(e["worker"], e["replayed"]) for e in plans] == [("wa", False), ("wb", True)]
    assert await stored_steps(sql, tree, "plan") == 1
    # The zombie wakes and writes its next step at its old epoch: the store refuses it.
    key = fenced_effect_key_of(a._context(run, "reserve"), STEP_EFFECT)
    with pytest.raises(ExecutionFencedError):
        await a._store_step(run, key, "reserve", {"late": True}, 0, False)
    lost = [
        k for i, e, k in await lease_log(sql, tenant, tree) if i == "wa" and e == 1 and k == "lost"
    ]
    assert lost == ["lost"]
    assert len(workers.of("refused", execution=tree)) == 1
    assert (await committed_business_rows(sql)).count(f"{tree}|reserve") == 1


async def test_readiness_and_the_sweep_follow_the_step_slots(
    workers: Workers, sql: SqlConnection
) -> None:
    a = await workers("wa", max_concurrent_steps=1)
    tenant, tree = workers.tenant, "tree-orphan"
    await submit_tree(
        a.tree, a.records, a.leases, tenant, tree, TreeSpec(fan_out=1, depth=1), a.clock
    )
    await a.slots.acquire(StepKind.ROOT)
    report = await a.check_readiness()
    slots = [c for c in report.components if c.name == "step-slots"]
    assert report.status is HealthStatus.DEGRADED
    assert [c.status for c in slots] == [HealthStatus.DEGRADED]
    # Every slot busy: the sweep claims nothing, though an orphan is there.
    assert await a.sweep.run_once() == []
    a.slots.release()
    report = await a.check_readiness()
    assert report.status is HealthStatus.UP, str(report)
    claimed = await a.sweep.run_once()
    assert [lease.execution_id for lease in claimed] == [tree]


async def test_a_graceful_stop_releases_every_lease_it_holds(
    workers: Workers, sql: SqlConnection
) -> None:
    a = await workers("wa", background=True, step_ms=1_000, shutdown_ms=5_000)
    tenant, tree = workers.tenant, "tree-stop"
    await a.submit(tenant, tree, TreeSpec(fan_out=1, depth=2))
    leaf = f"{tree}.c0.c0"

    async def leaf_runs() -> bool:
        return bool(
            workers.of("child-run", child=leaf) and workers.of("yielded", tree=f"{tree}.c0")
        )

    await until(leaf_runs, f"{leaf} running, its parent waiting")
    await a.stop()
    workers.made.remove(a)
    # The leaf (mid-step) was held and is released; its parent and the root wait for their
    # children with their leases yielded.
    assert (await lease_log(sql, tenant, leaf))[-1][2] == "released"
    for execution in (f"{tree}.c0", tree):
        assert (await lease_log(sql, tenant, execution))[-1][2] == "yielded", execution
    assert [e["leases"] for e in workers.of("released") if e["worker"] == "wa"] == [1]


async def test_a_graceful_stop_leaves_a_task_stuck_in_its_clean_up_and_releases_all_the_same(
    workers: Workers, sql: SqlConnection
) -> None:
    """A task that outlives its cancellation (a clean-up waiting on something that does not
    answer) no longer holds the stop past its bound: past the runs' share of the bound it is
    reported (`stop-stuck`, its stack on standard error), cancelled again, and the leases
    are released all the same. The 10 s bound leaves a loaded machine 6 s for the
    releases."""
    a = await workers("wa", background=True, step_ms=60_000, shutdown_ms=10_000)
    tenant, tree = workers.tenant, "tree-stuck-stop"
    await a.submit(tenant, tree, TreeSpec(fan_out=1, depth=1))

    async def planning() -> bool:
        return bool(await lease_log(sql, tenant, tree)) and a.slots.busy == 1

    await until(planning, f"{tree} in its first step")
    forever = asyncio.Event()
    swallowed: list[bool] = []

    async def stuck_clean_up() -> None:
        try:
            await forever.wait()
        except asyncio.CancelledError:
            swallowed.append(True)
            await forever.wait()  # a clean-up that never answers: only a second cancel ends it

    a._spawn(stuck_clean_up())
    await asyncio.sleep(0)
    await a.stop()  # no TimeoutError: the stop kept its bound
    workers.made.remove(a)
    assert swallowed == [True]
    assert [(e["phase"], e["tasks"]) for e in workers.of("stop-stuck")] == [("runs", 1)]
    assert workers.of("stop-timeout") == []
    assert (await lease_log(sql, tenant, tree))[-1] == ("wa", 1, "released"), await lease_log(
        sql, tenant, tree
    )


async def test_a_stop_whose_cancellation_a_library_turns_into_an_error_never_fails_the_tree(
    workers: Workers, sql: SqlConnection
) -> None:
    """SQLAlchemy turns a cancellation that lands in an engine's first connect into
    `ResourceClosedError`: a tree run stopped there must be released for another worker,
    not ended `failed`."""
    a = await workers("wa", background=True, shutdown_ms=10_000)
    b = await workers("wb")
    tenant, tree = workers.tenant, "tree-stop-error"
    working = asyncio.Event()

    async def work(_value: object) -> object:
        working.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("This Connection is closed") from None
        return None

    a._work = work  # type: ignore[method-assign,assignment]
    await a.submit(tenant, tree, TreeSpec(fan_out=1, depth=1))
    await asyncio.wait_for(working.wait(), WAIT_S)
    await a.stop()
    workers.made.remove(a)
    assert (await lease_log(sql, tenant, tree))[-1] == ("wa", 1, "released")
    assert await status_of(b, tenant, tree) is ExecutionRecordStatus.RUNNING
    assert workers.of("tree-end", tree=tree) == []


async def test_a_step_whose_store_keeps_failing_hands_the_tree_over_after_a_lease(
    workers: Workers, sql: SqlConnection
) -> None:
    from agboss_sql.lab.faults.fixture import InjectedOutageError

    a = await workers("wa", lease_ms=1_500)
    b = await workers("wb", lease_ms=1_500)
    tenant, tree = workers.tenant, "tree-outage"
    assert a.app is not None
    (connection,) = a.app._owned_connections

    def refuse(statement: str, _params: Any) -> None:
        # Only this worker's step writes fail; its lease renewals go on.
        if "agboss_fenced_effect_results" in statement:
            raise InjectedOutageError("injected: the effect table is unreachable from wa")

    connection.add_statement_listener(refuse)
    await a.submit(tenant, tree, TreeSpec(fan_out=1, depth=1))

    async def handed_over() -> bool:
        return bool(workers.of("handover", tree=tree))

    await until(handed_over, f"wa handing {tree} over")
    assert workers.of("handover", tree=tree)[0]["error"] == "StoreGaveUpError"
    assert len(workers.of("retry")) >= 2

    async def released() -> bool:
        return (await lease_log(sql, tenant, tree))[-1] == ("wa", 1, "released")

    await until(released, f"wa releasing {tree}")
    # Another worker, whose store works, takes the tree on from there.
    assert await b.sweep.run_once() != []
    await until(is_status(b, tenant, tree, ExecutionRecordStatus.QUEUED), f"{tree} on wb")


class ForgetfulUnwinder(Unwinder):
    """BROKEN on purpose: forgets which compensations finished (as if their marks were
    not durable): a holder that takes an unwind over runs every compensator again."""

    async def compensated(self, tenant_id: str, root_execution_id: str) -> set[str]:
        return set()


async def unwind_taken_over_mid_undo(
    workers: Workers, sql: SqlConnection, tree: str
) -> list[tuple[str, str, bool]]:
    """A cancelled tree's unwind on wb is frozen between two compensations (its lease no
    longer renewed: a SIGSTOP as the worker sees it); wc takes the tree over once the lease
    ran out and finishes the unwind; then wb thaws. Every undo step run (not the no-op
    undo of a leaf that never charged), in order: `(worker, step, replayed)`."""
    spec = TreeSpec(fan_out=2, depth=1)
    c0, c1 = leaves_of(tree, spec)
    # Leases of 2 s: short for the takeover, long enough that wb's unwind keeps its lease
    # up to the freeze on a loaded machine.
    a = await workers("wa", lease_ms=2_000)
    b = await workers("wb", lease_ms=2_000)
    c = await workers("wc", lease_ms=2_000)
    tenant = workers.tenant
    await run_to_the_wait(workers, a, tree, spec)
    assert await b.child_worker.run_once()  # c0 charges
    assert await a.cancel(tenant, tree) is True
    frozen, thaw = asyncio.Event(), asyncio.Event()
    undo_of = b._undo

    def held(run: _Run, what: str, leaf: str | None) -> Callable[[], Awaitable[None]]:
        undo = undo_of(run, what, leaf)
        if what != "reserve":
            return undo

        async def frozen_then_undo() -> None:
            # Past the first compensations (done and marked), before this one: frozen.
            await run.keeper.stop()
            frozen.set()
            await thaw.wait()
            await undo()

        return frozen_then_undo

    b._undo = held  # type: ignore[method-assign]
    # c1 sees the cancel (it charges nothing) and finishes last: wb wakes the tree, which
    # unwinds there.
    assert await b.child_worker.run_once()

    async def is_frozen() -> bool:
        return frozen.is_set()

    await until(
        is_frozen, lambda: f"wb frozen before its last compensation; events: {workers.events}"
    )

    async def taken_over() -> bool:
        return any(lease.execution_id == tree for lease in await c.sweep.run_once())

    await until(taken_over, f"wc taking the unwinding {tree} over")
    await until(is_status(c, tenant, tree, ExecutionRecordStatus.CANCELLED), f"{tree} cancelled")
    thaw.set()

    async def handed_over() -> bool:
        return bool(workers.of("handover", tree=tree))

    await until(handed_over, f"wb, thawed, handing {tree} over")
    # The tree's own charges and undos were made by wb and wc only once each.
    rows = await committed_business_rows(sql)
    assert rows.count(f"{c0}|charge") == 1 and f"{c1}|charge" not in rows
    record = await c.records.get(tenant, tree)
    assert record is not None and isinstance(record.outcome, dict)
    assert record.outcome["by"] == "wc"
    assert [e["worker"] for e in workers.of("unwound", tree=tree)] == ["wc"]
    return [
        (e["worker"], e["step"], e["replayed"])
        for e in workers.of("step", execution=tree)
        if str(e["step"]).startswith("undo:")
    ]


async def test_an_unwind_taken_over_mid_undo_runs_every_compensation_once_last_first(
    workers: Workers, sql: SqlConnection
) -> None:
    tree = "tree-undo-takeover"
    c0 = f"{tree}.c0"
    ran = await unwind_taken_over_mid_undo(workers, sql, tree)
    # wb refunded c0 (the last charge first), then froze; wc undid the reserve and did not
    # run wb's compensation again: durable, once each, last first.
    assert ran == [("wb", f"undo:charge:{c0}", False), ("wc", "undo:reserve", False)]
    rows = await committed_business_rows(sql)
    assert [r for r in rows if r.startswith(f"{tree}|undo:")] == [
        f"{tree}|undo:charge:{c0}",
        f"{tree}|undo:reserve",
    ]
    marks = await workers.made[0].tree.list(workers.tenant, tree, COMPENSATED_PREFIX)
    assert set(marks) == {
        f"{COMPENSATED_PREFIX}{key}" for key in ("reserve", f"charge:{c0}", f"charge:{tree}.c1")
    }
    # The zombie's undo after its thaw never ran: it stopped at its lease check.
    assert [e["error"] for e in workers.of("handover", tree=tree)] == ["ExecutionLeaseLostError"]


async def test_the_mid_undo_takeover_test_catches_compensations_that_are_not_durable(
    workers: Workers, sql: SqlConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run with an unwinder that forgets its marks: wc runs wb's compensation a
    second time (the effect store replays its result, but the compensator was called)."""
    import agboss_sql.lab.tree_worker as worker_module

    monkeypatch.setattr(worker_module, "Unwinder", ForgetfulUnwinder)
    tree = "tree-undo-forgetful"
    ran = await unwind_taken_over_mid_undo(workers, sql, tree)
    again = [step for worker, step, _ in ran if worker == "wc" and step.startswith("undo:charge")]
    assert again == [f"undo:charge:{tree}.c0"], ran
