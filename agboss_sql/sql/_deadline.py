"""The client's deadline on a server statement: the one place it is enforced.

The server ends a statement at `Timeouts.statement_ms` itself (PostgreSQL
`statement_timeout`, MariaDB `max_statement_time`); the client gives up `GRACE_S` later,
for a server that stopped answering (a black-holed connection). A `StatementDeadline` is
armed as a statement is sent and disarmed when it answers; when it goes off it cancels the
task waiting for the answer, and the task's handler asks `passed()` whether that
cancellation was the deadline's, to raise `DeadlinePassed` in its place. The pool
runner's own statements (`PoolRunner.bounded`) and the statements SQLAlchemy sends for
the work's transactions (the engine's cursor events) are both bounded by it.

A timer, not a task per statement: the bound costs next to nothing while the server
answers.
"""

from __future__ import annotations

import asyncio

from agboss_sql._timeouts import Timeouts

GRACE_S = 0.5
"""How long past `Timeouts.statement_ms` the client still waits for the server's answer."""


class DeadlinePassed(Exception):
    """The client stopped waiting for the server's answer to a statement."""


def statement_bound_s(timeouts: Timeouts) -> float:
    """The client's bound on one statement, in seconds: `statement_ms` and `GRACE_S`."""
    return timeouts.statement_ms / 1000 + GRACE_S


class StatementDeadline:
    """The deadline of the statement in flight on one connection: `arm` when it is sent,
    `disarm` when it answered. Past `seconds`, the task that armed it is cancelled."""

    __slots__ = ("expired", "seconds", "task", "timer")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self.task: asyncio.Task[object] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """Cancel the current task `seconds` from now unless `disarm` comes first (outside
        a task, nothing is armed)."""
        task = asyncio.current_task()
        if task is None:
            return
        self.task = task
        self.timer = asyncio.get_running_loop().call_later(self.seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self.task is not None:
            self.task.cancel()

    def disarm(self) -> None:
        """No deadline for the statement any more (it answered, or failed)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def passed(self) -> bool:
        """Asked once, while handling the armed task's `CancelledError`: whether the
        cancellation is the deadline's own, to be raised as `DeadlinePassed`. Not when the
        task's caller cancelled it too, even in the same loop pass (a process thawed after
        a freeze finds every deadline passed as its stop cancels it): the caller's
        cancellation wins, or the stop would never see its task end."""
        if not self.expired or self.task is None:
            return False
        return self.task.uncancel() == 0


__all__ = ["GRACE_S", "DeadlinePassed", "StatementDeadline", "statement_bound_s"]
