"""More cases of the pauses' suite: a pause saved in any state reads back whole.

Added where mutation testing of the stores (docs/mutation.md) found a change no case saw:
a save that dropped the pause's `resolved_at` (stored `None` whatever it was given) passed
every case, because every case saved pending pauses, whose `resolved_at` is `None`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agboss_sql.contracts.stores import PausedExecutionRepository
from agboss_sql.contracts.types import PausedExecution, PauseStatus
from agboss_sql.testing._case import Case, CaseContext

CONTRACT = "paused_execution"
TENANT = "tenant-1"


def _pauses(ctx: CaseContext, instance: int = 0) -> PausedExecutionRepository:
    store: PausedExecutionRepository = ctx.store(CONTRACT, instance)
    return store


async def reads_back_a_pause_saved_in_any_state(ctx: CaseContext) -> None:
    """A pause saved resolved, taken or cancelled (a copy moved from another store) reads
    back with every field as saved, its decision and `resolved_at` included, on either
    instance; a resolved one is drained with them."""
    now = ctx.clock.now()
    saved = []
    for i, status in enumerate([PauseStatus.RESOLVED, PauseStatus.TAKEN, PauseStatus.CANCELLED]):
        pause = PausedExecution(
            tenant_id=TENANT,
            pause_id=f"pause-{status.value}",
            execution_id="root-1/exec",
            root_execution_id="root-1",
            thread_id=None,
            status=status,
            request={"question": "approve?"},
            decision=None if status is PauseStatus.CANCELLED else {"approved": i},
            created_at=now - 1_000 + i,
            resolved_at=now - 500 + i,
        )
        await _pauses(ctx, i % 2).save(pause)
        saved.append(pause)
    for instance in (0, 1):
        for pause in saved:
            got = await _pauses(ctx, instance).get(TENANT, pause.pause_id)
            if got != pause:
                raise AssertionError(
                    f"[pause-round-trip] saved {pause}, instance {instance + 1} read {got}"
                )
    drained = list(await _pauses(ctx, 1).resolved(TENANT, "root-1"))
    if drained != [saved[0]]:
        raise AssertionError(f"[drain-resolved] drained {drained}, expected [{saved[0]}]")


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("reads back a pause saved in any state", reads_back_a_pause_saved_in_any_state),
]


def more_cases() -> list[Case]:
    """The cases of this module, in the suite's order."""
    return [Case(CONTRACT, name, run) for name, run in CASES]


__all__ = ["more_cases"]
