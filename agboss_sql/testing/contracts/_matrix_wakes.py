"""The coordination matrix's tables of the rate limits (slots, windows, pauses: keyed by
holder, not tenant) and of the child queue's wake path (`claim_wake`, `mark_woken`
against every state a child and its wake can be in), run by `_matrix_rows`."""

from __future__ import annotations

from typing import Any

from agboss_sql.contracts.errors import DuplicateChildError
from agboss_sql.contracts.types import QueuedChild
from agboss_sql.testing.contracts._fencing import fail
from agboss_sql.testing.contracts._matrix_rows import (
    ABSENT,
    Cell,
    Op,
    RowState,
    Table,
)

# --- rate limits: slots -------------------------------------------------------------------

RATE_LIMIT = "rate_limit"
HOLDER = "holder-1"
TTL_MS = 1_000


async def _nothing(cell: Cell) -> None:
    return None


def _slot(holder: str, *, run_out: bool = False, given_back: bool = False) -> Any:
    async def reach(cell: Cell) -> None:
        store = cell.store()
        await store.acquire_slot(cell.id, holder, 1, TTL_MS)
        if given_back:
            await store.release_slot(cell.id, holder)
        if run_out:
            await cell.advance(TTL_MS)

    return reach


async def _slot_label(cell: Cell) -> str:
    # A probe takes the key's only slot when nobody holds one, and gives it back.
    store = cell.store()
    if await store.acquire_slot(cell.id, "probe", 1, 1):
        await store.release_slot(cell.id, "probe")
        return "free"
    return "held"


async def _acquire(cell: Cell, i: int) -> Any:
    return await cell.store(i).acquire_slot(cell.id, HOLDER, 1, TTL_MS)


async def _renew(cell: Cell, i: int) -> Any:
    return await cell.store(i).renew_slot(cell.id, HOLDER, TTL_MS)


async def _release(cell: Cell, i: int) -> Any:
    return await cell.store(i).release_slot(cell.id, HOLDER)


_SLOT_STATES = (
    "held by this holder",
    "held by another holder",
    "held by this holder, run out",
    "held by another holder, run out",
    "given back",
)


def _slots(value: Any, **but: Any) -> dict[str, Any]:
    found = {name: value for name in (ABSENT, *_SLOT_STATES)}
    for name, other in but.items():
        found[name.replace("__", ", ").replace("_", " ")] = other
    return found


SLOT_TABLE = Table(
    contract=RATE_LIMIT,
    what="the only slot of a key",
    rule="slot-states",
    states=(
        RowState(ABSENT, "free", _nothing),
        RowState("held by this holder", "held", _slot(HOLDER)),
        RowState("held by another holder", "held", _slot("holder-2")),
        RowState("held by this holder, run out", "free", _slot(HOLDER, run_out=True)),
        RowState("held by another holder, run out", "free", _slot("holder-2", run_out=True)),
        RowState("given back", "free", _slot(HOLDER, given_back=True)),
    ),
    ops=(
        Op(
            f"acquire_slot by {HOLDER}",
            _acquire,
            _slots(True, held_by_another_holder=False),
            _slots("held"),
        ),
        Op(
            f"renew_slot by {HOLDER}",
            _renew,
            _slots(False, held_by_this_holder=True),
        ),
        Op(
            f"release_slot by {HOLDER}",
            _release,
            _slots(None),
            {"held by this holder": "free"},
        ),
    ),
    label=_slot_label,
    label_before=False,
)


# --- rate limits: windows and pauses ------------------------------------------------------

WINDOW_MS = 1_000
LIMIT = 5


def _used(amount: int, *, next_window: bool = False) -> Any:
    async def reach(cell: Cell) -> None:
        await cell.store().add_to_window(cell.id, WINDOW_MS, amount, LIMIT)
        if next_window:
            await cell.advance(WINDOW_MS - cell.now % WINDOW_MS)

    return reach


async def _window_label(cell: Cell) -> str:
    read = await cell.store().add_to_window(cell.id, WINDOW_MS, 0, 10**12)
    return f"{read.used} used"


async def _add(cell: Cell, i: int) -> Any:
    got = await cell.store(i).add_to_window(cell.id, WINDOW_MS, 2, LIMIT)
    return (got.allowed, got.used)


WINDOW_TABLE = Table(
    contract=RATE_LIMIT,
    what="a key's window",
    rule="window-states",
    states=(
        RowState(ABSENT, "0 used", _nothing),
        RowState("with 3 of 5 used", "3 used", _used(3)),
        RowState("with 5 of 5 used", "5 used", _used(5)),
        RowState("with 5 of 5 used in the window before", "0 used", _used(5, next_window=True)),
    ),
    ops=(
        Op(
            "add_to_window of 2 within 5",
            _add,
            {
                ABSENT: (True, 2),
                "with 3 of 5 used": (True, 5),
                "with 5 of 5 used": (False, 5),
                "with 5 of 5 used in the window before": (True, 2),
            },
            {
                ABSENT: "2 used",
                "with 3 of 5 used": "5 used",
                "with 5 of 5 used in the window before": "2 used",
            },
        ),
    ),
    label=_window_label,
)


def _paused(ms: int, *, past: bool = False) -> Any:
    async def reach(cell: Cell) -> None:
        await cell.store().pause_until(cell.id, cell.now + ms)
        if past:
            await cell.advance(ms)

    return reach


async def _pause_label(cell: Cell) -> str:
    until = await cell.store().paused_until(cell.id)
    return "not paused" if until is None else f"paused {until - cell.now} ms more"


async def _pause_for_3s(cell: Cell, i: int) -> Any:
    return await cell.store(i).pause_until(cell.id, cell.now + 3_000)


PAUSE_TABLE = Table(
    contract=RATE_LIMIT,
    what="a key's pause",
    rule="pause-never-shortens",
    states=(
        RowState(ABSENT, "not paused", _nothing),
        RowState("paused 1 s more", "paused 1000 ms more", _paused(1_000)),
        RowState("paused 5 s more", "paused 5000 ms more", _paused(5_000)),
        RowState("paused until a time now past", "not paused", _paused(1_000, past=True)),
    ),
    ops=(
        Op(
            "pause_until 3 s from now",
            _pause_for_3s,
            {
                ABSENT: None,
                "paused 1 s more": None,
                "paused 5 s more": None,
                "paused until a time now past": None,
            },
            {
                ABSENT: "paused 3000 ms more",
                "paused 1 s more": "paused 3000 ms more",
                "paused until a time now past": "paused 3000 ms more",
            },
        ),
    ),
    label=_pause_label,
)


# --- the child queue's wake path ----------------------------------------------------------

CHILD_QUEUE = "child_queue"
CLAIMER = "claimer-1"
CLAIM_MS = 1_000
OWES = "finished, owes its wake"


def _child(cell: Cell, child: str, parent: str | None = None) -> QueuedChild:
    return QueuedChild(
        cell.tenant, f"{cell.id}-root", parent or f"{cell.id}-parent", child, 1, None
    )


async def _claim_ours(cell: Cell) -> int:
    """Claim until the cell's child is claimed (children the case's earlier variants left
    queued are claimed on the way): its attempt."""
    store = cell.store()
    for _ in range(100):
        claimed = await store.claim("instance-1")
        if claimed is None:
            break
        if claimed.child_execution_id == cell.id:
            return int(claimed.attempt)
    fail("claim-when-queued", f"the queued child {cell.id!r} was never claimed")


def _queue_state(
    *,
    claimed: bool = True,
    sibling: bool = False,
    waiting: bool = False,
    finished: bool = True,
    wake: str | None = None,
    run_out: bool = False,
    woken: bool = False,
) -> Any:
    async def reach(cell: Cell) -> None:
        store = cell.store()
        await store.enqueue(_child(cell, cell.id))
        if sibling:
            await store.enqueue(_child(cell, f"{cell.id}-sib"))
        if not claimed:
            return
        attempt = await _claim_ours(cell)
        if waiting:
            await store.enqueue(_child(cell, f"{cell.id}-kid", parent=cell.id))
            await store.wait_for_children(cell.id, attempt=attempt)
            return
        if not finished:
            return
        await store.finish(cell.id, {"ok": True}, attempt=attempt)
        if wake is None:
            return
        await store.claim_wake(cell.id, wake, CLAIM_MS)
        if woken:
            await store.mark_woken(cell.id, wake)
        if run_out:
            await cell.advance(CLAIM_MS)

    return reach


async def _queue_label(cell: Cell) -> str:
    store = cell.store()
    found = [
        c
        for c in await store.children(cell.tenant, f"{cell.id}-parent")
        if c.child_execution_id == cell.id
    ]
    if not found:
        return ABSENT
    owes = any(c.child_execution_id == cell.id for c in await store.unwoken(10_000))
    return OWES if owes else str(found[0].status.value)


async def _attempt(cell: Cell) -> int:
    for found in await cell.store().children(cell.tenant, f"{cell.id}-parent"):
        if found.child_execution_id == cell.id:
            return int(found.attempt)
    return 1


async def _enqueue(cell: Cell, i: int) -> Any:
    try:
        await cell.store(i).enqueue(_child(cell, cell.id))
    except DuplicateChildError:
        return "DuplicateChildError"
    return "queued"


async def _enqueue_many(cell: Cell, i: int) -> Any:
    queued = list(await cell.store(i).enqueue_many([_child(cell, cell.id)]))
    return f"{len(queued)} queued" if queued in ([], [cell.id]) else queued


async def _wait(cell: Cell, i: int) -> Any:
    # At the child's current attempt: a wait at another one is the waits suite's.
    got = await cell.store(i).wait_for_children(cell.id, attempt=await _attempt(cell))
    return None if got is None else (got.waiting, got.remaining)


async def _restart(cell: Cell, i: int) -> Any:
    got = await cell.store(i).restart(cell.id, await _attempt(cell))
    return None if got is None else "restarted"


async def _finish(cell: Cell, i: int) -> Any:
    done = await cell.store(i).finish(cell.id, {"late": True}, attempt=await _attempt(cell))
    return (done.finished, done.remaining)


async def _claim_wake(cell: Cell, i: int) -> Any:
    return await cell.store(i).claim_wake(cell.id, CLAIMER, CLAIM_MS)


async def _mark_woken(cell: Cell, i: int) -> Any:
    return await cell.store(i).mark_woken(cell.id, CLAIMER)


_CHILD_STATES = (
    RowState(ABSENT, ABSENT, _nothing),
    RowState("queued", "queued", _queue_state(claimed=False)),
    RowState("running", "running", _queue_state(finished=False)),
    RowState("waiting for its own children", "waiting", _queue_state(waiting=True)),
    RowState("finished with a sibling unfinished", "finished", _queue_state(sibling=True)),
    RowState("finished last, its wake unclaimed", OWES, _queue_state()),
    RowState(
        "finished last, its wake claimed by this claimer", "finished", _queue_state(wake=CLAIMER)
    ),
    RowState(
        "finished last, its wake claimed by this claimer and run out",
        OWES,
        _queue_state(wake=CLAIMER, run_out=True),
    ),
    RowState(
        "finished last, its wake claimed by another claimer",
        "finished",
        _queue_state(wake="claimer-2"),
    ),
    RowState(
        "finished last, its wake claimed by another claimer and run out",
        OWES,
        _queue_state(wake="claimer-2", run_out=True),
    ),
    RowState(
        "finished last, woken by this claimer", "finished", _queue_state(wake=CLAIMER, woken=True)
    ),
    RowState(
        "finished last, woken by another claimer",
        "finished",
        _queue_state(wake="claimer-2", woken=True),
    ),
)


def _wakes(*granted: str) -> dict[str, bool]:
    return {s.name: s.name in granted for s in _CHILD_STATES}


def _all(value: Any, **but: Any) -> dict[str, Any]:
    found = {s.name: value for s in _CHILD_STATES}
    found.update(but)
    return found


WAKE_TABLE = Table(
    contract=CHILD_QUEUE,
    what="a child",
    rule="child-states",
    states=_CHILD_STATES,
    ops=(
        Op(
            "enqueue of the same child id",
            _enqueue,
            _all("DuplicateChildError", absent="queued"),
            {ABSENT: "queued"},
        ),
        Op(
            "enqueue_many of the same child id",
            _enqueue_many,
            _all("0 queued", absent="1 queued"),
            {ABSENT: "queued"},
        ),
        Op(
            "restart at its current attempt",
            _restart,
            _all(None, running="restarted"),
        ),
        Op(
            "finish at its current attempt",
            _finish,
            _all(
                (True, 0),
                absent=(False, 0),
                queued=(False, 1),
                running=(True, 0),
                **{
                    "waiting for its own children": (False, 1),
                    "finished with a sibling unfinished": (True, 1),
                },
            ),
            {"running": OWES},
        ),
        Op(
            "wait_for_children at its current attempt",
            _wait,
            _all(None, running=(False, 0), **{"waiting for its own children": (True, 1)}),
        ),
        Op(
            f"claim_wake by {CLAIMER}",
            _claim_wake,
            _wakes(
                "finished last, its wake unclaimed",
                "finished last, its wake claimed by this claimer",
                "finished last, its wake claimed by this claimer and run out",
                "finished last, its wake claimed by another claimer and run out",
            ),
            {
                "finished last, its wake unclaimed": "finished",
                "finished last, its wake claimed by this claimer and run out": "finished",
                "finished last, its wake claimed by another claimer and run out": "finished",
            },
        ),
        Op(
            f"mark_woken by {CLAIMER}",
            _mark_woken,
            _wakes(
                "finished last, its wake claimed by this claimer",
                "finished last, its wake claimed by this claimer and run out",
                "finished last, woken by this claimer",
            ),
            {"finished last, its wake claimed by this claimer and run out": "finished"},
        ),
    ),
    label=_queue_label,
)


TABLES: tuple[Table, ...] = (SLOT_TABLE, WINDOW_TABLE, PAUSE_TABLE, WAKE_TABLE)
"""The rate limits' and the wake path's tables."""

__all__ = ["TABLES"]
