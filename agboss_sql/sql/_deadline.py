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
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import StoreTimeoutError, StoreUnavailableError

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


# -- the statements of an engine's transactions ---------------------------------------

ENGINE_DEADLINE = "agboss.deadline"
"""The key of the running transaction's `StatementDeadline` in its connection's `info`."""


def connect_and_begin(engine: sa.Engine, deadline: StatementDeadline) -> sa.Connection:
    """A pooled connection with `deadline` as its statements' deadline, in a transaction
    (run in SQLAlchemy's greenlet). A connection that closed while SQLAlchemy set it up
    (its first connection asks the server a few questions; a server that died meanwhile
    leaves it closed, the driver's error swallowed) is `StoreUnavailableError`: nothing of
    the caller's was sent."""
    try:
        connection = engine.connect()
    except sa.exc.ResourceClosedError as exc:
        raise StoreUnavailableError(
            f"the connection to {engine.url.render_as_string(hide_password=True)} closed "
            f"while it was being opened ({exc}): the server went away; nothing was sent"
        ) from exc
    try:
        connection.info[ENGINE_DEADLINE] = deadline
        connection.begin()
    except BaseException:
        connection.info.pop(ENGINE_DEADLINE, None)
        connection.close()
        raise
    return connection


def end_deadline(info: dict[Any, Any], deadline: StatementDeadline) -> None:
    """No statement deadline for this transaction any more (none is in flight)."""
    info.pop(ENGINE_DEADLINE, None)
    deadline.disarm()


def _deadline_of(connection: Any) -> StatementDeadline | None:
    """The deadline armed on `connection`'s driver connection, if any.

    SQLAlchemy asks a new engine's first connection its questions (server version, SQL
    mode, ...) on an ad-hoc connection that has no info dict: reading its `info` raises a
    bare `NotImplementedError`. No deadline of ours is ever set there (`connect_and_begin`
    sets it after the checkout), and the engine's `handle_error` listeners run there too:
    a listener that raised would replace the statement's own error, or the cancellation of
    the checkout's bound, with that `NotImplementedError` (seen on a Galera node stalled
    by the loss of another)."""
    if connection is None:
        return None
    try:
        info = connection.info
    except NotImplementedError:
        return None
    deadline: StatementDeadline | None = info.get(ENGINE_DEADLINE)
    return deadline


def bound_statements(engine: AsyncEngine) -> None:
    """Arm the running transaction's `StatementDeadline` as each statement on the engine's
    connections is sent, and disarm it when the statement answered or failed. A statement
    still unanswered when it goes off cancels the transaction's task; the driver drops the
    connection (see the dialects' `connect`), and `transaction()` turns the cancellation
    into a typed error. A statement the server ends at its own timeout answers first."""

    @sa.event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _arm(connection: Any, *_args: Any) -> None:
        deadline = _deadline_of(connection)
        if deadline is not None:
            deadline.arm()

    def _disarm(connection: Any, *_args: Any) -> None:
        deadline = _deadline_of(connection)
        if deadline is not None:
            deadline.disarm()

    sa.event.listen(engine.sync_engine, "after_cursor_execute", _disarm)
    sa.event.listen(engine.sync_engine, "handle_error", lambda context: _disarm(context.connection))


__all__ = [
    "ENGINE_DEADLINE",
    "bound_statements",
    "connect_and_begin",
    "end_deadline",
    "GRACE_S",
    "DeadlinePassed",
    "StatementDeadline",
    "statement_bound_s",
]


def bound_error_under(exc: BaseException) -> StoreTimeoutError | None:
    """The `StoreTimeoutError` of one of our bounds that `exc` was raised in place of (found in
    its context chain), or `None`: an error an engine's `handle_error` listener or its
    clean-up raised while a bound's own error was being raised must not hide it."""
    seen: set[int] = set()
    under = exc.__context__
    while under is not None and id(under) not in seen:
        if isinstance(under, StoreTimeoutError):
            return under
        seen.add(id(under))
        under = under.__cause__ or under.__context__
    return None
