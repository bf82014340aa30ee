"""The coordination matrix: `coordination_cases(contract)`, every matrix case of a
coordination contract, and the tables of the pauses and the execution records (each write
against every state of its row, under the row's tenant and another one, run by
`_matrix_rows`). The keyed stores' tables are in `_matrix_keyed`, the rate limits' and the
child queue's wake path in `_matrix_wakes`, the cases of ids two tenants share beside the
row's own in `_matrix_tenants`."""

from __future__ import annotations

import json
from typing import Any

from agboss_sql.contracts.errors import (
    DuplicateExecutionError,
    DuplicatePauseError,
    NotPausedError,
)
from agboss_sql.contracts.types import (
    ExecutionRecord,
    ExecutionRecordStatus,
    PausedExecution,
    PauseStatus,
)
from agboss_sql.testing._case import Case
from agboss_sql.testing.contracts._matrix_rows import (
    ABSENT,
    UNCHECKED,
    Cell,
    Op,
    RowState,
    Table,
    outcome,
    row_cases,
)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# --- pauses -------------------------------------------------------------------------------

PAUSES = "paused_execution"


def _pause(cell: Cell) -> PausedExecution:
    return PausedExecution(
        tenant_id=cell.tenant,
        pause_id=cell.id,
        execution_id=f"{cell.id}-exec",
        root_execution_id=f"{cell.id}-root",
        thread_id=None,
        status=PauseStatus.PENDING,
        request={"question": "approve?"},
        decision=None,
        created_at=cell.now,
    )


async def _p_pending(cell: Cell) -> None:
    await cell.store().save(_pause(cell))


async def _p_resolved(cell: Cell) -> None:
    await _p_pending(cell)
    await cell.store().resolve(cell.tenant, cell.id, {"approved": True})


def _p_taken(taker: str | None) -> Any:
    async def reach(cell: Cell) -> None:
        await _p_resolved(cell)
        await cell.store().take(cell.tenant, cell.id, taker=taker)

    return reach


async def _p_cancelled(cell: Cell) -> None:
    await _p_pending(cell)
    await cell.store().cancel(cell.tenant, cell.id)


async def _nothing(cell: Cell) -> None:
    return None


async def _p_label(cell: Cell) -> str:
    pause = await cell.store().get(cell.tenant, cell.id)
    return ABSENT if pause is None else str(pause.status.value)


async def _p_snapshot(cell: Cell) -> Any:
    return await cell.store().get(cell.tenant, cell.id)


async def _p_save_answer(cell: Cell, i: int) -> Any:
    try:
        await cell.store(i).save(_pause(cell))
    except DuplicatePauseError:
        return "DuplicatePauseError"
    return "saved"


async def _p_resolve(cell: Cell, i: int) -> Any:
    got = await outcome(NotPausedError)(cell.store(i).resolve(cell.tenant, cell.id, {"late": 1}))
    return got if isinstance(got, str) else str(got.status.value)


def _p_take(taker: str | None) -> Any:
    async def run(cell: Cell, i: int) -> Any:
        return await cell.store(i).take(cell.tenant, cell.id, taker=taker)

    return run


async def _p_cancel(cell: Cell, i: int) -> Any:
    return await cell.store(i).cancel(cell.tenant, cell.id)


async def _p_purge(cell: Cell, i: int) -> Any:
    return await cell.store(i).purge(cell.now + 1)


TAKER = "taker-1"
_P_STATES = ("pending", "resolved", "taken by this taker", "taken by another taker", "cancelled")


def _each(value: Any, **but: Any) -> dict[str, Any]:
    """`value` in every pause state, `but` where named (spaces as underscores)."""
    found = {name: value for name in (ABSENT, *_P_STATES)}
    for name, other in but.items():
        found[name.replace("_", " ")] = other
    return found


PAUSE_TABLE = Table(
    contract=PAUSES,
    what="a pause",
    rule="pause-states",
    states=(
        RowState(ABSENT, ABSENT, _nothing),
        RowState("pending", "pending", _p_pending),
        RowState("resolved", "resolved", _p_resolved),
        RowState("taken by this taker", "taken", _p_taken(TAKER)),
        RowState("taken by another taker", "taken", _p_taken("taker-2")),
        RowState("cancelled", "cancelled", _p_cancelled),
    ),
    ops=(
        Op(
            "save of the same pause id",
            _p_save_answer,
            _each("DuplicatePauseError", absent="saved"),
            {ABSENT: "pending"},
        ),
        Op(
            "resolve",
            _p_resolve,
            _each("NotPausedError", pending="resolved"),
            {"pending": "resolved"},
        ),
        Op(
            f"take by {TAKER}",
            _p_take(TAKER),
            _each(False, resolved=True, taken_by_this_taker=True),
            {"resolved": "taken"},
        ),
        Op(
            "take without a taker",
            _p_take(None),
            _each(False, resolved=True),
            {"resolved": "taken"},
        ),
        Op("cancel", _p_cancel, _each(False, pending=True), {"pending": "cancelled"}),
        Op(
            "purge of what moved before now + 1 ms",
            _p_purge,
            _each(UNCHECKED),
            {
                "taken by this taker": ABSENT,
                "taken by another taker": ABSENT,
                "cancelled": ABSENT,
            },
            tenanted=False,
        ),
    ),
    label=_p_label,
    snapshot=_p_snapshot,
)


# --- execution records --------------------------------------------------------------------

RECORDS = "execution_record"
S = ExecutionRecordStatus
DONE = {"v": 1}


def _record(cell: Cell) -> ExecutionRecord:
    return ExecutionRecord(
        tenant_id=cell.tenant,
        execution_id=cell.id,
        root_execution_id=cell.id,
        parent_execution_id=None,
        thread_id=None,
        workflow="wf",
        owner=None,
        status=S.QUEUED,
        created_at=cell.now,
        updated_at=cell.now,
    )


def _r_reach(*moves: tuple[S, S, Any]) -> Any:
    async def reach(cell: Cell) -> None:
        store = cell.store()
        await store.save(_record(cell))
        for expected, new, done in moves:
            if done is None:
                await store.transition(cell.tenant, cell.id, expected, new)
            else:
                await store.complete(cell.tenant, cell.id, expected, new, done)

    return reach


async def _r_label(cell: Cell) -> str:
    record = await cell.store().get(cell.tenant, cell.id)
    if record is None:
        return ABSENT
    if record.outcome is None:
        return str(record.status.value)
    return f"{record.status.value} {_text(record.outcome)}"


async def _r_snapshot(cell: Cell) -> Any:
    return await cell.store().get(cell.tenant, cell.id)


async def _r_save(cell: Cell, i: int) -> Any:
    try:
        await cell.store(i).save(_record(cell))
    except DuplicateExecutionError:
        return "DuplicateExecutionError"
    return "saved"


def _r_transition(expected: S, new: S) -> Any:
    async def run(cell: Cell, i: int) -> Any:
        return await cell.store(i).transition(cell.tenant, cell.id, expected, new)

    return run


def _r_complete(expected: S, final: S, done: Any) -> Any:
    async def run(cell: Cell, i: int) -> Any:
        return await cell.store(i).complete(cell.tenant, cell.id, expected, final, done)

    return run


_RUNNING = (S.QUEUED, S.RUNNING, None)
_R_STATES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")
SUCCEEDED = f"succeeded {_text(DONE)}"
FAILED = f"failed {_text(DONE)}"
CANCELLED = f"cancelled {_text(DONE)}"


def _r_each(value: Any, **but: Any) -> dict[str, Any]:
    found = {name: value for name in (ABSENT, *_R_STATES)}
    found.update(but)
    return found


RECORD_TABLE = Table(
    contract=RECORDS,
    what="a run's record",
    rule="record-states",
    states=(
        RowState(ABSENT, ABSENT, _nothing),
        RowState("queued", "queued", _r_reach()),
        RowState("running", "running", _r_reach(_RUNNING)),
        RowState("paused", "paused", _r_reach(_RUNNING, (S.RUNNING, S.PAUSED, None))),
        RowState("succeeded", SUCCEEDED, _r_reach(_RUNNING, (S.RUNNING, S.SUCCEEDED, DONE))),
        RowState("failed", FAILED, _r_reach(_RUNNING, (S.RUNNING, S.FAILED, DONE))),
        RowState("cancelled", CANCELLED, _r_reach((S.QUEUED, S.CANCELLED, DONE))),
    ),
    ops=(
        Op(
            "save of the same execution id",
            _r_save,
            _r_each("DuplicateExecutionError", absent="saved"),
            {ABSENT: "queued"},
        ),
        Op(
            "transition running -> paused",
            _r_transition(S.RUNNING, S.PAUSED),
            _r_each(False, running=True),
            {"running": "paused"},
        ),
        Op(
            "transition succeeded -> running",
            _r_transition(S.SUCCEEDED, S.RUNNING),
            _r_each(False),
        ),
        Op(
            "transition cancelled -> queued",
            _r_transition(S.CANCELLED, S.QUEUED),
            _r_each(False),
        ),
        Op(
            "complete running -> succeeded with the same outcome",
            _r_complete(S.RUNNING, S.SUCCEEDED, DONE),
            _r_each(False, running=True, succeeded=True),
            {"running": SUCCEEDED},
        ),
        Op(
            "complete running -> succeeded with another outcome",
            _r_complete(S.RUNNING, S.SUCCEEDED, {"v": 2}),
            _r_each(False, running=True),
            {"running": f"succeeded {_text({'v': 2})}"},
        ),
        Op(
            "complete running -> failed",
            _r_complete(S.RUNNING, S.FAILED, DONE),
            _r_each(False, running=True, failed=True),
            {"running": FAILED},
        ),
        Op(
            "complete queued -> cancelled",
            _r_complete(S.QUEUED, S.CANCELLED, DONE),
            _r_each(False, queued=True, cancelled=True),
            {"queued": CANCELLED},
        ),
        Op(
            "complete succeeded -> failed",
            _r_complete(S.SUCCEEDED, S.FAILED, DONE),
            _r_each(False),
        ),
    ),
    label=_r_label,
    snapshot=_r_snapshot,
)


TABLES: tuple[Table, ...] = (PAUSE_TABLE, RECORD_TABLE)
"""The tables of this module (the keyed stores' are in `_matrix_keyed`, the rate limits'
and the wake path's in `_matrix_wakes`)."""


def coordination_cases(contract: str) -> list[Case]:
    """Every matrix case of a coordination contract: its tables' cells and its tenant
    cases (none for the fencing stores, whose matrix is `_matrix`)."""
    from agboss_sql.testing.contracts._matrix_keyed import TABLES as KEYED_TABLES
    from agboss_sql.testing.contracts._matrix_tenants import tenant_cases
    from agboss_sql.testing.contracts._matrix_wakes import TABLES as WAKE_TABLES

    found: list[Case] = []
    for table in (*TABLES, *KEYED_TABLES, *WAKE_TABLES):
        if table.contract == contract:
            found += row_cases(table)
    return found + tenant_cases(contract)


__all__ = ["TABLES", "coordination_cases"]
