"""The fencing matrix: every fenced write and every lease move against every state a lease
can be in, and the child queue's attempt rules against every state a child can be in,
generated from one table each so no contract can miss a row.

A row of `LEASE_STATES` says how to bring a lease (and the context an instance acts with)
into its state, what a fenced write with that context is refused for, and what each lease
move with it answers. `WRITES` lists every fenced write of each fencing store; the suites
of `fenced_effect` and `outbound_call` take `write_cases(contract)` (each write against each
state), the lease suite takes `move_cases()` (each move against each state), the child
queue's suite `attempt_cases()` (restart and finish against each child state).

The table of lease states is in `_matrix_states`, the fenced writes in `_matrix_writes`,
the child queue's rules in `_matrix_children`; this module holds the lease moves and
re-exports the rest.
"""

from __future__ import annotations

from agboss_sql.contracts.types import ExecutionLease
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import LEASE, LEASE_MS, World, expect
from agboss_sql.testing.contracts._matrix_children import CHILD_STATES, attempt_cases
from agboss_sql.testing.contracts._matrix_states import (
    LEASE_STATES,
    MOVE_ONLY_STATES,
    MOVES,
    RECLAIM,
    RELEASE,
    RENEW,
    WRITE_ONLY_STATES,
    YIELD,
    CaseRun,
    State,
)
from agboss_sql.testing.contracts._matrix_writes import WRITES, write_cases

# --- the lease moves ----------------------------------------------------------------------


async def _move(w: World, move: str, lease: ExecutionLease, instance: int) -> bool:
    leases = w.leases(instance)
    if move == RENEW:
        return await leases.renew(lease, LEASE_MS) is not None
    if move == RELEASE:
        return await leases.release(lease)
    if move == YIELD:
        return await leases.yield_lease(lease)
    if move == RECLAIM:
        new = await leases.reclaim(lease, LEASE_MS)
        if new is not None:
            expect(
                new.lease_epoch == lease.lease_epoch + 1,
                "lease-moves",
                f"a reclaim at epoch {lease.lease_epoch} gave epoch {new.lease_epoch}, not the "
                "next one",
            )
        return new is not None
    return await leases.finish(lease)


def _move_case(move: str, state: State) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)

        async def nothing(lease: ExecutionLease) -> None:
            return None

        reached = await state.reach(w, nothing)
        granted = await _move(w, move, reached.context, reached.instance)
        what = f"a {move} with a context whose lease is {state.name}"
        wanted = state.moves[move]
        expect(
            granted == wanted,
            "no-stale-write" if granted else "lease-moves",
            f"{what} was {'granted' if granted else 'refused'}, where the contract "
            f"{'grants' if wanted else 'refuses'} it",
        )
        if not granted and reached.holder is not None:
            # Nothing moved: the lease's current holder still renews it.
            instance, held = reached.holder
            left = await w.leases(instance).renew(held, LEASE_MS)
            expect(
                left is not None,
                "no-stale-write",
                f"after {what} was refused, the current holder's renewal was refused: the "
                "refused move changed the lease",
            )

    return run


def move_cases() -> list[Case]:
    """Each lease move against each lease state: one case each (the lease store has no
    opt-out, so none is a fencing case)."""
    return [
        Case(
            LEASE,
            f"matrix: {move} with a context whose lease is {state.name}",
            _move_case(move, state),
        )
        for move in MOVES
        for state in (*LEASE_STATES, *MOVE_ONLY_STATES)
    ]


__all__ = [
    "CHILD_STATES",
    "LEASE_STATES",
    "MOVES",
    "MOVE_ONLY_STATES",
    "WRITE_ONLY_STATES",
    "WRITES",
    "attempt_cases",
    "move_cases",
    "write_cases",
]
