"""`checkpoint_saver_contract`: one pytest class that proves a fenced LangGraph checkpoint
saver keeps what a fenced saver promises, for any saver bound to the set's lease store.

    TestMySaver = checkpoint_saver_contract(
        lambda seam: MySaver(conn, fenced=True, store_clock=seam.store_clock),
        execution_lease=lambda seam: MyLeases(conn, seam.store_clock, seam.application),
        name="my saver",
        reset=empty_my_tables,
    )

Each case runs as its own test method, `test_checkpoint_saver__<case>`, on a fresh
`CaseContext`: the reset first, two instances (each a lease store and a saver on one
backing store, on the case's `VirtualClock`), each built store closed after. A write
carries the writer's lease in `config["configurable"]["agboss_lease"]` (an
`ExecutionLease`, or its dict form). The cases:

- a late writer is refused after a takeover (`aput`, `aput_writes`, `put`, `put_writes`),
  its refused writes leave nothing behind, and the new holder's thread stays as written;
- the fence decides by the store's time at the expiry; a released, yielded, finished,
  never-granted or forged (another holder's name) lease is refused; a write without a
  lease raises `ValueError`;
- the lease check and the write are one step (with `statements=`);
- `MAX_CHECKPOINT_WRITE_BYTES` bounds a put (values and metadata) and a put_writes (values
  and channel names), refused before any statement;
- an append is never stored against a base another instance deleted (nor against the
  same version a copy of the thread holds), nor against a version another instance
  stored as an append and this one puts again; `delete_for_runs` leaves the checkpoints that
  name no run; a saver that keeps no value (`reader=`) stores a growing conversation whole;
- a task's fifty writes are kept in order; the saver used without a lease (`unfenced=`)
  keeps fifty values and a task's fifty writes, the values a put appends and those beside
  them, and never stores an append against a base another instance deleted;
- a graph stops at its first write after a takeover, and the new holder resumes it.

pytest (with pytest-asyncio) and LangGraph are imported only when a class is built or a
case runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agboss_sql.testing import _saver_fencing as fencing
from agboss_sql.testing import _saver_storage as storage
from agboss_sql.testing._case import CaseContext, as_factory
from agboss_sql.testing._saver_support import (
    CONTRACT,
    LEASE,
    LEASE_KEY,
    READER,
    UNFENCED,
    SaverOptions,
    SaverStatements,
)
from agboss_sql.testing.contracts._store_set import Factory, Reset, StoreSet, _resets_of
from agboss_sql.testing.contracts._test_class import CaseInfo, _class_name, _snake, add_test
from agboss_sql.testing.contracts.conformance import _caller_module

Body = Callable[[CaseContext, SaverOptions], Awaitable[None]]


@dataclass(frozen=True)
class SaverCase:
    """One case of the fenced saver's contract: its name and its body."""

    name: str
    run: Body


CASES: tuple[SaverCase, ...] = (
    SaverCase("a late writer is refused after a takeover", fencing.late_writer_refused),
    SaverCase("a late sync writer is refused after a takeover", fencing.late_sync_writer_refused),
    SaverCase("the fence decides by the store's time at the expiry", fencing.fence_at_expiry),
    SaverCase("released, yielded, finished and absent leases are refused", fencing.closed_leases_refused),
    SaverCase("a write without a lease or its holder is refused", fencing.no_lease_refused),
    SaverCase("a lease under another holder's name is refused", fencing.forged_holder_refused),
    SaverCase("a growing conversation is appended only while the lease is held", fencing.appends_only_while_held),
    SaverCase("the lease check and the write are one step", fencing.one_step),
    SaverCase("a graph stops at its first write after a takeover", fencing.graph_stops_after_takeover),
    SaverCase("MAX_CHECKPOINT_WRITE_BYTES bounds a put with its metadata", storage.put_limit),
    SaverCase("MAX_CHECKPOINT_WRITE_BYTES bounds put_writes with its channel names", storage.writes_limit),
    SaverCase("an append is never stored against a base another saver deleted", storage.deleted_base),
    SaverCase("an append is never stored against a deleted base a copy holds", storage.deleted_base_of_a_copy),
    SaverCase("an append without a lease is never stored against a deleted base", storage.deleted_base_unfenced),
    SaverCase("a version stored as an append is never a base of a retrying saver", storage.retried_append_no_base),
    SaverCase("delete_for_runs leaves the checkpoints that name no run", storage.runs_leave_unnamed),
    SaverCase("a saver that keeps no value stores a growing conversation whole", storage.keeps_nothing),
    SaverCase("values that have no length are read back as written", storage.values_without_length),
    SaverCase("a retried task's writes keep their first values, special ones their latest", storage.retried_writes),
    SaverCase("a task's fifty writes are kept and read back in order", storage.many_writes),
    SaverCase("a saver used without a lease keeps fifty values and writes", storage.unfenced_writes),
    SaverCase("a put without a lease keeps its appends and the values beside them", storage.unfenced_appends_beside_values),
)  # fmt: skip
"""Every case, in the order the class runs them."""


def _body(
    store_set: StoreSet, case: SaverCase, options: SaverOptions
) -> Callable[[], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        await case.run(ctx, options)

    async def body() -> None:
        await store_set.run(run)

    return body


def checkpoint_saver_contract(
    factory: Factory,
    *,
    execution_lease: Factory,
    name: str,
    reset: Reset | None = None,
    reader: Factory | None = None,
    unfenced: Factory | None = None,
    stored_rows: Callable[[str], Awaitable[int]] | None = None,
    statements: SaverStatements | None = None,
    loop_scope: str = "session",
    case_timeout_s: float = 300.0,
) -> type:
    """A pytest class (`Test<Name>`) proving a fenced checkpoint saver, one test per case
    (`test_checkpoint_saver__<case>`).

    `factory` builds instance `i`'s fenced saver, `(seam) -> saver` or a `StoreFactory`:
    bound to the lease store `execution_lease` builds (on the same backing store, deciding
    by `seam.store_clock`). `reset` empties the backing store before each case. Optional,
    each adding what the cases can see: `reader`, a saver on the same store that keeps no
    value (every read goes to the store; it runs the keeps-no-value case and reads back);
    `unfenced`, the same saver used without a lease, as LangGraph uses a checkpointer (no
    lease in its configs, nothing fenced: the case of a saver used so);
    `stored_rows(thread_id)`, how many rows the store holds for a thread (a refused write
    must leave none); `statements` (`SaverStatements`), the statements a saver sends (the
    one-step case, and limits refused before any statement). A case that needs one not
    given is skipped with a note saying so.
    """
    factories = {LEASE: as_factory(execution_lease), CONTRACT: as_factory(factory)}
    if reader is not None:
        factories[READER] = as_factory(reader)
    if unfenced is not None:
        factories[UNFENCED] = as_factory(unfenced)
    store_set = StoreSet(
        name=name,
        factories=factories,
        reset=reset,
        loop_scope=loop_scope,
        case_timeout_s=case_timeout_s,
        _resets=_resets_of(factories, reset),
    )
    options = SaverOptions(stored_rows=stored_rows, statements=statements)
    cls: type = type(
        _class_name(name),
        (),
        {
            "__doc__": f"The fenced checkpoint saver {name!r} against its contract",
            "__module__": _caller_module(1),
            "__test__": True,
            "store_set": store_set,
            "cases": {},
        },
    )
    for case in CASES:
        add_test(
            cls,
            f"test_{CONTRACT}__{_snake(case.name)}",
            _body(store_set, case, options),
            doc=f"checkpoint saver ({name}): {case.name}",
            info=CaseInfo(CONTRACT, case.name, fencing=True),
        )
    return cls


__all__ = [
    "CASES",
    "LEASE_KEY",
    "SaverCase",
    "SaverStatements",
    "checkpoint_saver_contract",
]
