"""Durable LIFO compensation: the next holder finishes the undo and skips what was done
(docs/contracts.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from runtime_support import TENANT, World

from agboss_sql.contracts import (
    COMPENSATED_PREFIX,
    UNWINDING_KEY,
    ExecutionLeaseLostError,
    VirtualClock,
)
from agboss_sql.runtime import LeaseKeeper, Unwinder, compensate


class Undo:
    """Compensators that note each run; `broken` ones raise (the instance died mid-undo)."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.broken: set[str] = set()

    def of(self, key: str) -> Callable[[], Awaitable[None]]:
        async def undo() -> None:
            if key in self.broken:
                raise ConnectionError(f"died while undoing {key}")
            self.ran.append(key)

        return undo

    def list(self, *keys: str) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        return [(key, self.of(key)) for key in keys]


async def test_compensation_runs_lifo_and_the_next_holder_skips_the_done_ones(
    world: World,
) -> None:
    a, b = world.instance("a"), world.instance("b")
    undo = Undo()
    undo.broken = {"reserve"}
    with pytest.raises(ConnectionError):
        await compensate(a.tree, TENANT, "tree-1", undo.list("book", "reserve", "charge"))
    assert undo.ran == ["charge"]
    marks = await a.tree.list(TENANT, "tree-1")
    assert set(marks) == {UNWINDING_KEY, COMPENSATED_PREFIX + "charge"}

    undo.broken = set()
    unwinder = Unwinder(b.tree)
    assert await unwinder.is_unwinding(TENANT, "tree-1")
    assert await unwinder.compensated(TENANT, "tree-1") == {"charge"}
    ran = await unwinder.compensate(TENANT, "tree-1", undo.list("book", "reserve", "charge"))
    assert ran == ["reserve", "book"]
    assert undo.ran == ["charge", "reserve", "book"]  # each exactly once, last first
    assert await unwinder.compensated(TENANT, "tree-1") == {"book", "reserve", "charge"}
    # A third holder has nothing left to do.
    assert await unwinder.compensate(TENANT, "tree-1", undo.list("book", "reserve", "charge")) == []


async def test_unwinding_is_marked_before_the_first_compensator(world: World) -> None:
    a = world.instance("a")
    seen: list[bool] = []

    async def first() -> None:
        seen.append(await Unwinder(a.tree).is_unwinding(TENANT, "tree-1"))

    assert not await Unwinder(a.tree).is_unwinding(TENANT, "tree-1")
    await compensate(a.tree, TENANT, "tree-1", [("only", first)])
    assert seen == [True]


async def test_a_lost_lease_stops_the_undo_before_the_next_compensator(world: World) -> None:
    world.store_time = VirtualClock(world.clock.now())
    a, b = world.instance("a"), world.instance("b")
    keeper = LeaseKeeper(a.leases, a.events, world.clock)
    await keeper.take(TENANT, "tree-1")
    undo = Undo()
    compensators = undo.list("first", "second")

    async def lose_then_undo() -> None:
        await world.store_time.advance(30_000)  # type: ignore[union-attr]
        assert await b.leases.acquire(TENANT, "tree-1", 30_000) is not None
        assert await keeper.confirm_now() is False
        undo.ran.append("second")

    compensators[1] = ("second", lose_then_undo)
    with pytest.raises(ExecutionLeaseLostError):
        await compensate(a.tree, TENANT, "tree-1", compensators, keeper=keeper)
    assert undo.ran == ["second"]  # "first" was left to the new holder
    assert await Unwinder(b.tree).compensated(TENANT, "tree-1") == {"second"}


async def test_compensator_keys_must_be_unique(world: World) -> None:
    undo = Undo()
    with pytest.raises(ValueError, match="unique"):
        await compensate(world.instance("a").tree, TENANT, "t", undo.list("x", "x"))
