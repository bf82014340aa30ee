"""The coordination matrix's engine: a store's write methods against every state its row
can be in, decided from one table per store (`Table`), with each cell run on the same and
the other instance, and under the row's own tenant and another one.

A `Table` lists the states a row can be in (`RowState`: how to bring a row, named by a
`Cell`'s tenant and id, into it and the label it then reads as) and the store's writes
(`Op`: the call, what it answers in each state, the label the row reads as after it). For
each op and state, `row_cases(table)` builds one case that runs these variants, each on
ids of its own:

- the same tenant, the op by instance 1, then by instance 2 (the row brought to its state
  by instance 1): the op answers `Op.answers[state]` and the row then reads
  `Op.after[state]` (its own label when the op leaves it alone);
- another tenant (for a tenanted store and a state other than absent): the row is brought
  to its state under `tenant-2` and the op runs under `tenant-1` with every other id
  equal, by instance 1, then by instance 2. The op answers what it answers when the row is
  absent, `tenant-1`'s row reads what the op leaves an absent row as, and `tenant-2`'s row
  reads back exactly as before (its full snapshot, not its label): an op under one tenant
  never changes, cancels, completes, wakes or counts anything of another;
- both tenants (the same stores and states): both rows brought to the state, the op under
  `tenant-1` answers and leaves `tenant-1`'s row as in the first variant, and
  `tenant-2`'s row reads back exactly as before (a store that reads the row by its tenant
  but writes it by its id alone moves both).

An answer is normalised by the op (a bool, a count, a label, or the name of the contract
error it raised); `None` in `Op.answers` leaves the answer unchecked (a purge counts every
tenant's rows and the rows of the case's earlier variants).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import OTHER_TENANT, TENANT, World, expect

ABSENT = "absent"
"""The state every table starts from: no row with the cell's ids."""

UNCHECKED = object()
"""An answer the matrix does not check (see the module's docstring)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """The row one variant works on: its tenant, its id, and the case's stores."""

    ctx: CaseContext
    contract: str
    tenant: str
    id: str

    def store(self, instance: int = 0) -> Any:
        return self.ctx.store(self.contract, instance)

    @property
    def now(self) -> int:
        return self.ctx.clock.now()

    async def advance(self, ms: int) -> None:
        await self.ctx.clock.advance(ms)

    def under(self, tenant: str) -> Cell:
        """The same ids under `tenant`."""
        return Cell(self.ctx, self.contract, tenant, self.id)


Reach = Callable[[Cell], Awaitable[None]]
Label = Callable[[Cell], Awaitable[str]]
Snapshot = Callable[[Cell], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class RowState:
    """One state a row can be in: how to reach it (by instance 1) and what it reads as."""

    name: str
    label: str
    reach: Reach


@dataclass(frozen=True, slots=True)
class Op:
    """One write of a store: how it runs on a cell by an instance, what it answers in each
    state (normalised), and the label the row reads as after it (when not its own)."""

    name: str
    run: Callable[[Cell, int], Awaitable[Any]]
    answers: Mapping[str, Any]
    after: Mapping[str, str] = field(default_factory=dict)
    tenanted: bool = True
    """Whether the op names a tenant (a purge does not: it has no other-tenant variant)."""


@dataclass(frozen=True, slots=True)
class Table:
    """A store's row states and writes: the matrix of one contract (or one part of it)."""

    contract: str
    what: str
    """What a row is, in case names ("a pause", "a slot")."""
    rule: str
    """The rule a failing cell names."""
    states: tuple[RowState, ...]
    ops: tuple[Op, ...]
    label: Label
    snapshot: Snapshot | None = None
    """The full read of a row, compared before and after an op under another tenant;
    `None` for a store whose rows have no tenant."""
    label_before: bool = True
    """Whether the row's label is read before the op too (not when reading it changes
    what the op meets: a probe of a slot clears the run-out slots it counts)."""

    def state(self, name: str) -> RowState:
        return next(s for s in self.states if s.name == name)


def _expected_after(op: Op, state: RowState) -> str:
    return op.after.get(state.name, state.label)


async def _same_tenant(table: Table, op: Op, state: RowState, cell: Cell, instance: int) -> None:
    what = f"{op.name} by instance {instance + 1} on {table.what} {state.name}"
    await state.reach(cell)
    if table.label_before:
        before = await table.label(cell)
        expect(
            before == state.label,
            table.rule,
            f"{table.what} brought to {state.name} reads {before!r}, not {state.label!r}",
        )
    answer = await op.run(cell, instance)
    wanted = op.answers[state.name]
    if wanted is not UNCHECKED:
        expect(answer == wanted, table.rule, f"{what} answered {answer!r}, not {wanted!r}")
    after = await table.label(cell)
    expected = _expected_after(op, state)
    expect(after == expected, table.rule, f"after {what} it reads {after!r}, not {expected!r}")


async def _other_tenant(table: Table, op: Op, state: RowState, cell: Cell, instance: int) -> None:
    assert table.snapshot is not None
    theirs = cell.under(OTHER_TENANT)
    what = (
        f"{op.name} under {TENANT} by instance {instance + 1}, with {OTHER_TENANT}'s "
        f"{table.what} of the same ids {state.name}"
    )
    await state.reach(theirs)
    before = await table.snapshot(theirs)
    answer = await op.run(cell, instance)
    wanted = op.answers[ABSENT]
    if wanted is not UNCHECKED:
        expect(
            answer == wanted,
            "tenant-isolation",
            f"{what} answered {answer!r}, where with no row of its tenant it answers {wanted!r}",
        )
    after = await table.snapshot(theirs)
    expect(
        after == before,
        "tenant-isolation",
        f"{what} changed {OTHER_TENANT}'s row: {before!r} -> {after!r}",
    )
    mine = await table.label(cell)
    expected = _expected_after(op, table.state(ABSENT))
    expect(
        mine == expected,
        "tenant-isolation",
        f"after {what}, {TENANT}'s row reads {mine!r}, not {expected!r}",
    )


async def _both_tenants(table: Table, op: Op, state: RowState, cell: Cell, instance: int) -> None:
    assert table.snapshot is not None
    theirs = cell.under(OTHER_TENANT)
    what = (
        f"{op.name} under {TENANT} by instance {instance + 1} on {table.what} {state.name}, "
        f"with {OTHER_TENANT}'s of the same ids {state.name} too"
    )
    await state.reach(theirs)
    await state.reach(cell)
    before = await table.snapshot(theirs)
    answer = await op.run(cell, instance)
    wanted = op.answers[state.name]
    if wanted is not UNCHECKED:
        expect(answer == wanted, "tenant-isolation", f"{what} answered {answer!r}, not {wanted!r}")
    after = await table.snapshot(theirs)
    expect(
        after == before,
        "tenant-isolation",
        f"{what} changed {OTHER_TENANT}'s row: {before!r} -> {after!r}",
    )
    mine = await table.label(cell)
    expected = _expected_after(op, state)
    expect(
        mine == expected,
        "tenant-isolation",
        f"after {what}, {TENANT}'s row reads {mine!r}, not {expected!r}",
    )


def _cell_case(table: Table, op: Op, state: RowState) -> Callable[[CaseContext], Awaitable[None]]:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        for instance in (0, 1):
            cell = Cell(ctx, table.contract, TENANT, w.name(table.contract))
            await _same_tenant(table, op, state, cell, instance)
        if table.snapshot is None or not op.tenanted or state.name == ABSENT:
            return
        for instance in (0, 1):
            cell = Cell(ctx, table.contract, TENANT, w.name(table.contract))
            await _other_tenant(table, op, state, cell, instance)
            cell = Cell(ctx, table.contract, TENANT, w.name(table.contract))
            await _both_tenants(table, op, state, cell, instance)

    return run


def row_cases(table: Table) -> list[Case]:
    """Each op of `table` against each of its states: one case each."""
    for op in table.ops:
        missing = [s.name for s in table.states if s.name not in op.answers]
        if missing:
            raise ValueError(f"{table.contract}: {op.name} answers no state {missing}")
    return [
        Case(
            table.contract,
            f"matrix: {op.name} on {table.what} {state.name}",
            _cell_case(table, op, state),
        )
        for op in table.ops
        for state in table.states
    ]


def outcome(error: type[Exception]) -> Callable[[Awaitable[Any]], Awaitable[Any]]:
    """Await a call, answering the name of `error` when it raises it."""

    async def answer(call: Awaitable[Any]) -> Any:
        try:
            return await call
        except error:
            return error.__name__

    return answer


__all__ = [
    "ABSENT",
    "UNCHECKED",
    "Cell",
    "Op",
    "RowState",
    "Table",
    "outcome",
    "row_cases",
]
