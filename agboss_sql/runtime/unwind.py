"""Durable LIFO compensation: the next holder finishes an undo without repeating a step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from agboss_sql.contracts.stores import (
    COMPENSATED_PREFIX,
    UNWINDING_KEY,
    ExecutionTreeRepository,
)
from agboss_sql.runtime.keeper import LeaseKeeper

Compensator = tuple[str, Callable[[], Awaitable[None]]]
"""A step's key and the call that undoes it."""


class Unwinder:
    """Runs a tree's compensators in LIFO order, durably.

    `UNWINDING_KEY` is written before the first compensator runs, and
    `COMPENSATED_PREFIX + key` after each one finishes. A holder that takes the tree over
    mid-undo sees `is_unwinding` and calls `compensate` with the same list: the keys already
    marked are skipped, the rest run, last first.

    A compensator that finished but whose mark was not written (the instance died in
    between) runs again: compensators must be idempotent by their key, as every effect is.
    """

    def __init__(self, tree: ExecutionTreeRepository) -> None:
        self.tree = tree

    async def is_unwinding(self, tenant_id: str, root_execution_id: str) -> bool:
        """True once an undo of the tree has started (here or on another instance)."""
        return await self.tree.get(tenant_id, root_execution_id, UNWINDING_KEY) is not None

    async def compensated(self, tenant_id: str, root_execution_id: str) -> set[str]:
        """The keys whose compensators finished."""
        marked = await self.tree.list(tenant_id, root_execution_id, COMPENSATED_PREFIX)
        return {key[len(COMPENSATED_PREFIX) :] for key in marked}

    async def compensate(
        self,
        tenant_id: str,
        root_execution_id: str,
        compensators: Sequence[Compensator],
        *,
        keeper: LeaseKeeper | None = None,
    ) -> list[str]:
        """Mark the tree unwinding, then run the unmarked compensators last first, marking
        each as it finishes. With a `keeper`, the lease is checked before each one (a lost
        lease raises `ExecutionLeaseLostError`: the new holder finishes the undo). The keys
        run by this call, in the order run. A compensator that raises stops the undo there,
        unmarked."""
        keys = [key for key, _ in compensators]
        if len(set(keys)) != len(keys):
            raise ValueError(f"compensator keys must be unique, got {keys!r}")
        await self.tree.save_if_absent(
            tenant_id, root_execution_id, UNWINDING_KEY, {"compensators": keys}
        )
        done = await self.compensated(tenant_id, root_execution_id)
        ran: list[str] = []
        for key, undo in reversed(compensators):
            if key in done:
                continue
            if keeper is not None:
                keeper.check_lease()
            await undo()
            await self.tree.save_if_absent(
                tenant_id, root_execution_id, COMPENSATED_PREFIX + key, True
            )
            ran.append(key)
        return ran


async def compensate(
    tree: ExecutionTreeRepository,
    tenant_id: str,
    root_execution_id: str,
    compensators: Sequence[Compensator],
    *,
    keeper: LeaseKeeper | None = None,
) -> list[str]:
    """`Unwinder(tree).compensate(...)`: run the tree's unmarked compensators LIFO."""
    return await Unwinder(tree).compensate(
        tenant_id, root_execution_id, compensators, keeper=keeper
    )


__all__ = ["Compensator", "Unwinder", "compensate"]
