"""`FinishBatcher`: the finishes of children that end together, sent as one batch.

A worker's runs finish their children through it. A finish that finds no batch in flight is
sent at once, alone (`finish`: no wait added to a lone finish); the finishes that arrive
while a batch is in flight wait for it and then go together as the next batch
(`finish_many`: one transaction, one commit). Under load each commit carries every finish
that came during the one before (group commit); each is still decided by the queue on its
own row, fenced by its own attempt, so batching changes no answer.

A batch is idempotent per attempt (a retried entry answers as its committed finish did), so
after an error that leaves its outcome unknown (`StoreUnavailableError`) it is sent again,
whole, up to `retries` times; an error that remains is every waiter's. An outcome that
cannot be stored is refused to its own caller before it joins a batch, so one child's bad
outcome never fails its batch mates.

A store whose `finish` is overridden below its `finish_many` (a wrapper that watches or
changes finishes) gets its finishes one by one: its batch would pass the override by.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from agboss_sql.contracts.errors import StoreUnavailableError
from agboss_sql.contracts.rules import payload_text
from agboss_sql.contracts.stores import ChildExecutionQueueRepository
from agboss_sql.contracts.types import ChildFinish, FinishResult, JsonValue

logger = logging.getLogger("agboss_sql.runtime")

T = TypeVar("T")

CLOSE_BOUND_S = 5.0
"""How long `close` waits for the batch in flight."""


def batches_finishes(queue: ChildExecutionQueueRepository) -> bool:
    """Whether `queue`'s `finish_many` is at least as specific as its `finish`: False for a
    store that overrides `finish` in a subclass below the class giving `finish_many`, and
    for a proxy whose class gives neither."""
    mro = type(queue).__mro__

    def owner(name: str) -> int | None:
        return next((i for i, cls in enumerate(mro) if name in cls.__dict__), None)

    many, one = owner("finish_many"), owner("finish")
    # A proxy that forwards its calls (no class of its own gives them): one by one.
    return many is not None and one is not None and many <= one


class FinishBatcher:
    """Finishes children for the runs of one worker, batching those that end together (see
    the module)."""

    def __init__(self, queue: ChildExecutionQueueRepository, retries: int) -> None:
        self.queue = queue
        self.retries = retries
        self.batching = batches_finishes(queue)
        self._pending: list[tuple[ChildFinish, asyncio.Future[FinishResult]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.batches = 0
        """How many batches of two or more finishes were sent (for tests and figures)."""

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, attempt: int
    ) -> FinishResult:
        """Finish the child at `attempt` with `outcome`, alone or in a batch: what the
        queue's `finish` (or the batch's entry) answered, sent again after an error that
        leaves the outcome unknown, up to the retries."""
        if not self.batching:
            return await self._retrying(
                lambda: self.queue.finish(child_execution_id, outcome, attempt=attempt)
            )
        payload_text("the outcome", outcome)  # refused here, not in its batch
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[FinishResult] = loop.create_future()
        self._pending.append((ChildFinish(child_execution_id, attempt, outcome), answer))
        if self._sender is None or self._sender.done():
            # Its own task: a caller cancelled while waiting does not cancel the batch the
            # others wait for.
            self._sender = loop.create_task(self._send())
        return await asyncio.shield(answer)

    async def _send(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            entries = [entry for entry, _ in batch]
            try:
                results = await self._send_batch(entries)
            except asyncio.CancelledError:
                # Closed while a batch was in flight: its outcome, and the others', unknown.
                for _, answer in (*batch, *self._pending):
                    answer.cancel()
                self._pending = []
                raise
            except Exception as error:
                for _, answer in batch:
                    if not answer.done():
                        answer.set_exception(error)
                continue
            for (_, answer), result in zip(batch, results, strict=True):
                if not answer.done():
                    answer.set_result(result)

    async def _send_batch(self, entries: list[ChildFinish]) -> Sequence[FinishResult]:
        if len(entries) == 1:
            [only] = entries
            call = functools.partial(
                self.queue.finish, only.child_execution_id, only.outcome, attempt=only.attempt
            )
            return [await self._retrying(call)]
        self.batches += 1
        return await self._retrying(functools.partial(self.queue.finish_many, entries))

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        left = self.retries
        while True:
            try:
                return await call()
            except StoreUnavailableError as error:
                if left <= 0:
                    raise
                left -= 1
                logger.warning("a child finish failed (%s); trying again, %d left", error, left)

    async def close(self) -> None:
        """Wait, at most `CLOSE_BOUND_S`, for the batches in flight (their waiters may be
        gone: the finishes still land); one still going then is cancelled (its outcome is
        unknown, as a finish cut by a lost connection: the rescue or the wake sweep
        settles it)."""
        sender = self._sender
        if sender is not None and not sender.done():
            await asyncio.wait({sender}, timeout=CLOSE_BOUND_S)
            if not sender.done():
                sender.cancel()
                await asyncio.wait({sender})


__all__ = ["FinishBatcher", "batches_finishes"]
