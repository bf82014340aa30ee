"""How far one attempt of a step got, and the loop that feeds a step its results."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from agboss_sql.sql.statements import Result, StatementCache, Step

T = TypeVar("T")

Execute = Callable[[Any, str, Mapping[str, Any] | None], Awaitable[tuple[Any, int]]]


class Progress:
    """How far one attempt of a step got: statements answered, whether a statement that
    may write was sent, and whether COMMIT was sent. A new one is all at its start."""

    # Class defaults, no `__init__`: one is made per call, on its hot path, and most are
    # never written to (a SQLite statement, a step that answers).
    applied: int = 0
    sent_write: bool = False
    committing: bool = False
    in_script: bool = False  # a `Script` was sent and has not answered


async def feed(
    cache: StatementCache, step: Step[T], raw: Any, execute: Execute, progress: Progress
) -> T:
    """Drive `step`: send each statement it yields through `execute` on `raw`, and feed its
    result back, until the step returns its answer."""
    result: Result | None = None
    while True:
        try:
            request = step.send(result) if result is not None else next(step)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        result = await send(cache, request.statement, request.params, raw, execute, progress)


def sending(
    cache: StatementCache, statement: Any, params: Mapping[str, Any], progress: Progress
) -> tuple[Any, Any]:
    """What goes to the driver for one statement, compiled and bound: told to the cache's
    listeners and marked in `progress` (a write sent, a script under way) before it is sent.
    The sender then runs it and counts it (`in_script` off, `applied` up)."""
    compiled = cache.compiled(statement)
    sent = cache.params(compiled, params)
    if cache.listeners:
        cache.notify(compiled.sql, sent)
    if not compiled.reads_only:
        progress.sent_write = True
    progress.in_script = compiled.script
    return compiled, sent


async def send(
    cache: StatementCache,
    statement: Any,
    params: Mapping[str, Any],
    raw: Any,
    execute: Execute,
    progress: Progress,
) -> Result:
    """Send one statement through `execute` on `raw`, counting it in `progress`."""
    compiled, sent = sending(cache, statement, params, progress)
    rows, count = await execute(raw, compiled.sql, sent)
    progress.in_script = False
    progress.applied += 1
    return Result(list(rows) if rows is not None else None, count)
