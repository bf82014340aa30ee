"""The child queue's attempt rules in the matrix (`CHILD_STATES`): restart and finish
against every state a child can be in, as `attempt_cases()`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agboss_sql.contracts.stores import ChildExecutionQueueRepository
from agboss_sql.contracts.types import ChildStatus, QueuedChild
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import World, expect, fail
from agboss_sql.testing.contracts._matrix_states import CaseRun

# --- the child queue's attempt rules ------------------------------------------------------

CHILD_QUEUE = "child_queue"


@dataclass(frozen=True, slots=True)
class ChildState:
    """One state a child can be in when a restart or finish arrives with an attempt."""

    name: str
    restart: bool
    """Whether a restart at the attempt is granted."""
    finish: bool
    """Whether a finish at the attempt is answered finished."""
    reach: Callable[[World, ChildExecutionQueueRepository, str], Awaitable[int]]
    """Queue the child (or not) and bring it to the state: the attempt the move carries."""


async def _enqueue(w: World, queue: ChildExecutionQueueRepository, child: str) -> None:
    parent = f"{child}-parent"
    await queue.enqueue(QueuedChild("tenant-1", f"{child}-root", parent, child, 1, None))
    # A sibling keeps the parent unfinished, so a finish answers how many are left.
    await queue.enqueue(QueuedChild("tenant-1", f"{child}-root", parent, f"{child}-sib", 1, None))


async def _claim(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    # Claims take the deepest, then the oldest child: ours, queued before its sibling.
    claimed = await queue.claim("instance-1")
    if claimed is None or claimed.child_execution_id != child:
        fail("claim-order", f"the first claim of an emptied queue got {claimed}, not {child!r}")
    return int(claimed.attempt)


async def _c_queued(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    return 0


async def _c_running(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    return await _claim(w, queue, child)


async def _c_restarted(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    attempt = await _claim(w, queue, child)
    again = await queue.restart(child, attempt)
    if again is None:
        fail("restart-cas", f"a restart of {child!r} at its current attempt was refused")
    return attempt


async def _c_finished(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    attempt = await _claim(w, queue, child)
    done = await queue.finish(child, {"ok": True}, attempt=attempt)
    expect(done.finished, "finish-once", f"the finish of {child!r} at its attempt was refused")
    return attempt + 1


async def _c_replay(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    attempt = await _claim(w, queue, child)
    done = await queue.finish(child, {"ok": True}, attempt=attempt)
    expect(done.finished, "finish-once", f"the finish of {child!r} at its attempt was refused")
    return attempt


async def _c_absent(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    return 1


CHILD_STATES: tuple[ChildState, ...] = (
    ChildState("queued, never claimed", False, False, _c_queued),
    ChildState("running at the attempt", True, True, _c_running),
    ChildState("running at a later attempt (restarted)", False, False, _c_restarted),
    ChildState("finished at another attempt", False, False, _c_finished),
    ChildState("finished at the attempt (a retried finish)", False, True, _c_replay),
    ChildState("absent", False, False, _c_absent),
)
"""Every state a child can be in when a restart or a finish arrives with an attempt."""


def _attempt_case(move: str, state: ChildState) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        queue: ChildExecutionQueueRepository = ctx.store(CHILD_QUEUE, 0)
        other: ChildExecutionQueueRepository = ctx.store(CHILD_QUEUE, 1)
        child = w.name("child")
        attempt = await state.reach(w, queue, child)
        before = [
            (c.status, c.attempt, c.outcome)
            for c in await queue.children("tenant-1", f"{child}-parent")
            if c.child_execution_id == child
        ]
        what = f"a {move} at attempt {attempt} of a child {state.name}"
        if move == "restart":
            got = await other.restart(child, attempt)
            granted = got is not None
            wanted = state.restart
            rule = "restart-cas"
            if got is not None:
                expect(
                    got.attempt == attempt + 1 and got.claimed_by == "instance-2",
                    rule,
                    f"{what} gave attempt {got.attempt} to {got.claimed_by!r}",
                )
        else:
            result = await other.finish(child, {"late": True}, attempt=attempt)
            granted = result.finished is True
            wanted = state.finish
            rule = "finish-once"
            # Every finish answers the parent's children not finished once it is done (a
            # refused one changed nothing; a retry answers what the first finish did).
            siblings = await queue.children("tenant-1", f"{child}-parent")
            remaining = sum(1 for c in siblings if c.status != ChildStatus.FINISHED)
            expect(
                result.finished in (True, False) and result.remaining == remaining,
                rule,
                f"{what} answered {result}, where the contract answers "
                f"finished={wanted}, remaining={remaining}",
            )
        expect(
            granted == wanted,
            rule,
            f"{what} was {'granted' if granted else 'refused'}, where the contract "
            f"{'grants' if wanted else 'refuses'} it",
        )
        if not granted or (state.finish and move == "finish" and state.name.startswith("finished")):
            after = [
                (c.status, c.attempt, c.outcome)
                for c in await queue.children("tenant-1", f"{child}-parent")
                if c.child_execution_id == child
            ]
            expect(after == before, rule, f"{what} changed the child: {before} -> {after}")

    return run


def attempt_cases() -> list[Case]:
    """Restart and finish against each child state: one case each."""
    return [
        Case(
            CHILD_QUEUE,
            f"matrix: {move} at an attempt of a child {state.name}",
            _attempt_case(move, state),
        )
        for move in ("restart", "finish")
        for state in CHILD_STATES
    ]
