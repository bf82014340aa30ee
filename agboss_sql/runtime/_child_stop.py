"""What a `ChildWorker` and the engine share to stop: cancel and wait for tasks (bounded),
release and flush lease keepers (bounded); and `FinishReporting`, the queue that reports
every finish it answered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from agboss_sql.contracts.types import JsonValue
from agboss_sql.runtime.keeper import LeaseKeeper

STUCK_GRACE_S = 1.0
"""How long a task cancelled a second time (stuck in its clean-up) is waited for."""


OnStuck = Callable[[set[asyncio.Task[Any]]], None]


async def cancel_and_wait(
    tasks: list[asyncio.Task[Any]],
    timeout_s: float | None,
    *,
    on_stuck: OnStuck | None = None,
    cancel: bool = True,
) -> None:
    """Cancel `tasks` (unless `cancel=False`: they stop on their own) and wait for them to
    end, at most `timeout_s` (unbounded when `None`). Tasks still going past the bound are
    stuck in a clean-up that outlived its cancellation: `on_stuck` is told (while they
    still wait), then they are cancelled (again) and waited for `STUCK_GRACE_S` more."""
    for each in tasks if cancel else ():
        each.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    if not pending:
        return
    if on_stuck is not None:
        on_stuck(pending)
    for each in pending:
        each.cancel()
    await asyncio.wait(pending, timeout=STUCK_GRACE_S)


async def release_bounded(keeper: LeaseKeeper) -> int:
    """Release the keeper's lease, bounded to 2 s; 1 when released, else 0."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(2):
            return 1 if await keeper.release() else 0
    return 0


async def flush_bounded(keepers: list[LeaseKeeper]) -> None:
    """Wait for the lease log writes of `keepers` (together), each bounded to 2 s."""

    async def flush(keeper: LeaseKeeper) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await keeper.flush()

    await asyncio.gather(*(flush(keeper) for keeper in keepers))


class FinishReporting:
    """A child queue that reports every finish it answered (which child, which attempt,
    whether it counted, how many siblings remain) to `emit` as a `child-finish` event, so
    an audit can tell a finish that counted from a superseded one. Everything else is the
    wrapped queue's."""

    def __init__(self, queue: Any, emit: Callable[[dict[str, Any]], None]) -> None:
        self._queue = queue
        self._emit = emit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> Any:
        result = await self._queue.finish(child_execution_id, outcome, attempt=attempt)
        self._emit(
            {
                "kind": "child-finish",
                "child": child_execution_id,
                "attempt": attempt,
                "finished": result.finished,
                "remaining": result.remaining,
            }
        )
        return result


__all__ = [
    "STUCK_GRACE_S",
    "FinishReporting",
    "OnStuck",
    "cancel_and_wait",
    "flush_bounded",
    "release_bounded",
]
