"""The coordination matrix's tables of the keyed stores: the mesh requests, the tree keys,
the history, the cost ledger and the lease log, each write against every state of its row, under the
row's tenant and another one (run by `_matrix_rows`)."""

from __future__ import annotations

import json
from typing import Any

from agboss_sql.contracts.errors import IdempotencyKeyConflictError
from agboss_sql.contracts.types import (
    BudgetScope,
    CostEntry,
    ExecutionLeaseEvent,
    ExecutionSnapshot,
    LeaseEventKind,
)
from agboss_sql.testing.contracts._matrix_rows import (
    ABSENT,
    UNCHECKED,
    Cell,
    Op,
    RowState,
    Table,
)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


async def _nothing(cell: Cell) -> None:
    return None


# --- mesh requests ------------------------------------------------------------------------

MESH = "mesh_request"
FIRST_RESPONSE = {"r": 1}


async def _m_open(cell: Cell) -> None:
    await cell.store().save_if_absent(cell.id, cell.tenant, "fp-1", cell.now)


async def _m_completed(cell: Cell) -> None:
    await _m_open(cell)
    await cell.store().complete(cell.tenant, cell.id, FIRST_RESPONSE)


async def _m_label(cell: Cell) -> str:
    request = await cell.store().get(cell.tenant, cell.id)
    if request is None:
        return ABSENT
    state = f"completed {_text(request.response)}" if request.completed else "open"
    return f"{state} ({request.fingerprint})"


async def _m_snapshot(cell: Cell) -> Any:
    return await cell.store().get(cell.tenant, cell.id)


def _m_save(fingerprint: str) -> Any:
    async def run(cell: Cell, i: int) -> Any:
        try:
            saved = await cell.store(i).save_if_absent(cell.id, cell.tenant, fingerprint, cell.now)
        except IdempotencyKeyConflictError:
            return "IdempotencyKeyConflictError"
        return "created" if saved.created else f"existing ({saved.request.fingerprint})"

    return run


async def _m_complete(cell: Cell, i: int) -> Any:
    return await cell.store(i).complete(cell.tenant, cell.id, {"r": 2})


COMPLETED = f"completed {_text(FIRST_RESPONSE)} (fp-1)"

MESH_TABLE = Table(
    contract=MESH,
    what="a request",
    rule="mesh-states",
    states=(
        RowState(ABSENT, ABSENT, _nothing),
        RowState("open", "open (fp-1)", _m_open),
        RowState("completed", COMPLETED, _m_completed),
    ),
    ops=(
        Op(
            "save_if_absent with the same fingerprint",
            _m_save("fp-1"),
            {ABSENT: "created", "open": "existing (fp-1)", "completed": "existing (fp-1)"},
            {ABSENT: "open (fp-1)"},
        ),
        Op(
            "save_if_absent with another fingerprint",
            _m_save("fp-2"),
            {
                ABSENT: "created",
                "open": "IdempotencyKeyConflictError",
                "completed": "IdempotencyKeyConflictError",
            },
            {ABSENT: "open (fp-2)"},
        ),
        Op(
            "complete",
            _m_complete,
            {ABSENT: False, "open": True, "completed": False},
            {"open": f"completed {_text({'r': 2})} (fp-1)"},
        ),
    ),
    label=_m_label,
    snapshot=_m_snapshot,
)


# --- tree keys ----------------------------------------------------------------------------

TREES = "execution_tree"
KEY = "@agboss/cancel-request"


async def _t_set(cell: Cell) -> None:
    await cell.store().save_if_absent(cell.tenant, cell.id, KEY, {"v": 1})


async def _t_deleted(cell: Cell) -> None:
    await _t_set(cell)
    await cell.store().delete_tree(cell.tenant, cell.id)


async def _t_label(cell: Cell) -> str:
    found = await cell.store().list(cell.tenant, cell.id)
    return ABSENT if not found else _text(found)


async def _t_save(cell: Cell, i: int) -> Any:
    return await cell.store(i).save_if_absent(cell.tenant, cell.id, KEY, {"v": 2})


async def _t_delete(cell: Cell, i: int) -> Any:
    return await cell.store(i).delete_tree(cell.tenant, cell.id)


TREE_TABLE = Table(
    contract=TREES,
    what="a tree's key",
    rule="tree-states",
    states=(
        RowState(ABSENT, ABSENT, _nothing),
        RowState("set", _text({KEY: {"v": 1}}), _t_set),
        RowState("deleted with its tree", ABSENT, _t_deleted),
    ),
    ops=(
        Op(
            "save_if_absent",
            _t_save,
            {ABSENT: True, "set": False, "deleted with its tree": True},
            {ABSENT: _text({KEY: {"v": 2}}), "deleted with its tree": _text({KEY: {"v": 2}})},
        ),
        Op(
            "delete_tree",
            _t_delete,
            {ABSENT: 0, "set": 1, "deleted with its tree": 0},
            {"set": ABSENT},
        ),
    ),
    label=_t_label,
    snapshot=_t_label,
)


# --- history ------------------------------------------------------------------------------

HISTORY = "execution_history"


def _snapshot(cell: Cell, status: str) -> ExecutionSnapshot:
    return ExecutionSnapshot(
        tenant_id=cell.tenant,
        execution_id=cell.id,
        workflow="wf",
        status=status,
        started_at=cell.now - 10,
        finished_at=cell.now,
        record={"status": status},
    )


async def _h_saved(cell: Cell) -> None:
    await cell.store().save(_snapshot(cell, "succeeded"))


async def _h_read(cell: Cell) -> Any:
    return await cell.store().get(cell.tenant, cell.id)


async def _h_label(cell: Cell) -> str:
    found = await _h_read(cell)
    return ABSENT if found is None else f"saved {found.status}"


async def _h_save(cell: Cell, i: int) -> Any:
    return await cell.store(i).save(_snapshot(cell, "failed"))


async def _h_purge(cell: Cell, i: int) -> Any:
    return await cell.store(i).purge(cell.now + 1)


HISTORY_TABLE = Table(
    contract=HISTORY,
    what="a run's snapshot",
    rule="history-states",
    states=(
        RowState(ABSENT, ABSENT, _nothing),
        RowState("saved", "saved succeeded", _h_saved),
    ),
    ops=(
        Op(
            "save of the same execution id",
            _h_save,
            {ABSENT: None, "saved": None},
            {ABSENT: "saved failed", "saved": "saved failed"},
        ),
        Op(
            "purge of what finished before now + 1 ms",
            _h_purge,
            {ABSENT: UNCHECKED, "saved": UNCHECKED},
            {"saved": ABSENT},
            tenanted=False,
        ),
    ),
    label=_h_label,
    snapshot=_h_read,
)


# --- cost ledger --------------------------------------------------------------------------

LEDGER = "cost_ledger"


def _entry(cell: Cell) -> CostEntry:
    return CostEntry(
        entry_id=cell.id,
        tenant_id=cell.tenant,
        execution_id=f"{cell.id}-exec",
        application="app-1",
        tokens_in=1,
        tokens_out=2,
        cost_micros=100,
        at=cell.now,
    )


async def _l_recorded(cell: Cell) -> None:
    await cell.store().record(_entry(cell))


async def _l_total(cell: Cell) -> Any:
    return await cell.store().total(BudgetScope.EXECUTION, f"{cell.id}-exec", tenant_id=cell.tenant)


async def _l_label(cell: Cell) -> str:
    return f"{(await _l_total(cell)).cost_micros} micros"


async def _l_record(cell: Cell, i: int) -> Any:
    return await cell.store(i).record(_entry(cell))


async def _l_reserve(cell: Cell, i: int) -> Any:
    return await cell.store(i).try_reserve(
        BudgetScope.EXECUTION, f"{cell.id}-exec", 50, 120, tenant_id=cell.tenant
    )


LEDGER_TABLE = Table(
    contract=LEDGER,
    what="an execution's spend",
    rule="ledger-states",
    states=(
        RowState(ABSENT, "0 micros", _nothing),
        RowState("with the entry recorded", "100 micros", _l_recorded),
    ),
    ops=(
        Op(
            "record of the same entry id",
            _l_record,
            {ABSENT: True, "with the entry recorded": False},
            {ABSENT: "100 micros"},
        ),
        Op(
            "try_reserve of 50 within 120",
            _l_reserve,
            {ABSENT: True, "with the entry recorded": False},
            {ABSENT: "50 micros"},
        ),
    ),
    label=_l_label,
    snapshot=_l_total,
)


# --- the lease log ------------------------------------------------------------------------

LEASE_LOG = "execution_lease_event"


def _event(cell: Cell) -> ExecutionLeaseEvent:
    return ExecutionLeaseEvent(
        cell.tenant, cell.id, "instance-1", 1, LeaseEventKind.ACQUIRED, 1_700_000_000_000
    )


async def _e_saved(cell: Cell) -> None:
    await cell.store().save(_event(cell))


async def _e_list(cell: Cell) -> Any:
    return list(await cell.store().list(cell.tenant, cell.id))


async def _e_label(cell: Cell) -> str:
    return f"{len(await _e_list(cell))} listed"


async def _e_save(cell: Cell, i: int) -> Any:
    return await cell.store(i).save(_event(cell))


LOG_TABLE = Table(
    contract=LEASE_LOG,
    what="an execution's lease log",
    rule="lease-log-exact",
    states=(
        RowState(ABSENT, "0 listed", _nothing),
        RowState("with an event saved", "1 listed", _e_saved),
    ),
    ops=(
        Op(
            "save of the same event",
            _e_save,
            {ABSENT: None, "with an event saved": None},
            {ABSENT: "1 listed", "with an event saved": "2 listed"},
        ),
    ),
    label=_e_label,
    snapshot=_e_list,
)


TABLES: tuple[Table, ...] = (MESH_TABLE, TREE_TABLE, HISTORY_TABLE, LEDGER_TABLE, LOG_TABLE)
"""The keyed stores' tables."""

__all__ = ["TABLES"]
