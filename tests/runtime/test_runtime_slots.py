"""The step slots: the order waiting steps are served in, aging on the clock, no deadlock
when parents wait on children, and the readiness the slots report."""

from __future__ import annotations

import asyncio

import pytest

from agboss_sql.contracts.clocks import VirtualClock
from agboss_sql.runtime.slots import StepKind, StepSlots


async def _settle() -> None:
    """Let every task that can run do so (the loop has nothing else to wait for)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def _served_order(slots: StepSlots, asks: list[tuple[str, StepKind, int]]) -> list[str]:
    """Queue `asks` behind a held slot, free it, and answer the names in the order served
    (each served step frees its slot at once)."""
    served: list[str] = []

    async def step(name: str, kind: StepKind, depth: int) -> None:
        async with slots.step(kind, depth):
            served.append(name)

    tasks = []
    for name, kind, depth in asks:
        tasks.append(asyncio.create_task(step(name, kind, depth)))
        await _settle()
    assert slots.waiting == len(asks)
    slots.release()
    await asyncio.gather(*tasks)
    return served


async def test_a_freed_slot_goes_to_the_branch_closing_step_then_the_deepest_then_new_roots() -> (
    None
):
    clock = VirtualClock(1_000)
    slots = StepSlots(1, clock)
    await slots.acquire(StepKind.DEEPER, 0)
    served = await _served_order(
        slots,
        [
            ("root-a", StepKind.ROOT, 0),
            ("depth-1", StepKind.DEEPER, 1),
            ("depth-2", StepKind.DEEPER, 2),
            ("close", StepKind.CLOSE_BRANCH, 1),
            ("root-b", StepKind.ROOT, 0),
            ("depth-2-later", StepKind.DEEPER, 2),
        ],
    )
    assert served == ["close", "depth-2", "depth-2-later", "depth-1", "root-a", "root-b"]


async def test_a_shallow_step_ages_past_deeper_ones_after_waiting_on_the_clock() -> None:
    clock = VirtualClock(1_000)
    slots = StepSlots(1, clock, aging_ms=10_000)
    await slots.acquire(StepKind.DEEPER, 0)
    shallow = asyncio.create_task(slots.acquire(StepKind.DEEPER, 0))
    await _settle()
    # 25 s later the shallow step counts as depth 2: it goes before a depth-1 step that just
    # came, and ties with a depth-2 one (which asked later, so goes after).
    clock.set(clock.now() + 25_000)
    deep = asyncio.create_task(slots.acquire(StepKind.DEEPER, 2))
    deeper = asyncio.create_task(slots.acquire(StepKind.DEEPER, 1))
    await _settle()
    assert slots.order() == [
        (StepKind.DEEPER, 0),
        (StepKind.DEEPER, 2),
        (StepKind.DEEPER, 1),
    ]
    # Without the aging the shallow step would be last.
    assert slots.rank(StepKind.DEEPER, 0, 1_000, 1_000) > slots.rank(
        StepKind.DEEPER, 1, 26_000, 26_000
    )
    slots.release()
    await _settle()
    assert shallow.done() and not deep.done() and not deeper.done()
    for task in (deep, deeper):
        task.cancel()
    await asyncio.gather(deep, deeper, return_exceptions=True)


async def test_parents_waiting_on_children_hold_no_slot_so_a_full_process_never_deadlocks() -> None:
    # One slot; three parents each run a step, then wait for their child, which needs a slot
    # too. A parent that kept its slot while waiting would deadlock at once.
    clock = VirtualClock(0)
    slots = StepSlots(1, clock)
    done: list[str] = []

    async def child(name: str) -> None:
        async with slots.step(StepKind.DEEPER, 1):
            done.append(name)

    async def parent(name: str) -> None:
        async with slots.step(StepKind.ROOT, 0):
            running = asyncio.create_task(child(f"{name}.c0"))
        await running  # waiting for the child: no slot held
        async with slots.step(StepKind.CLOSE_BRANCH, 0):
            done.append(name)

    async with asyncio.timeout(5):  # a deadlock would hang here; the run takes milliseconds
        await asyncio.gather(*(parent(f"p{i}") for i in range(3)))
    assert sorted(done) == sorted(["p0", "p1", "p2", "p0.c0", "p1.c0", "p2.c0"])
    assert slots.busy == 0 and slots.waiting == 0


async def test_full_free_and_a_cancelled_waiter_leaving_the_queue() -> None:
    slots = StepSlots(2, VirtualClock(0))
    assert slots.free == 2 and not slots.full
    await slots.acquire(StepKind.ROOT)
    await slots.acquire(StepKind.ROOT)
    assert slots.full and slots.free == 0
    waiter = asyncio.create_task(slots.acquire(StepKind.DEEPER, 3))
    await _settle()
    assert slots.waiting == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert slots.waiting == 0
    slots.release()
    assert slots.free == 1 and slots.busy == 1


def test_bad_settings_are_refused() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            StepSlots(bad, VirtualClock(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StepSlots(1, VirtualClock(0), aging_ms=0)


async def test_release_without_a_slot_is_an_error() -> None:
    slots = StepSlots(1, VirtualClock(0))
    with pytest.raises(RuntimeError):
        slots.release()
