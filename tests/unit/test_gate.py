"""The inline runner's gate: one holder, waiters served in arrival order, handed over on
leave (a newcomer never slips in), each wait ended by its deadline, a cancelled waiter's
hand-over passed on."""

from __future__ import annotations

import asyncio

import pytest

from agboss_sql.sql._gate import Gate

FAR = 1e12  # a deadline no test reaches


async def _settle() -> None:
    """Let every task made ready run until each waits again (loop turns, not time)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_free_gate_is_taken_at_once_and_a_held_one_waits() -> None:
    gate = Gate()
    assert await gate.enter(FAR)
    assert gate.held
    second = asyncio.create_task(gate.enter(FAR))
    await _settle()
    assert not second.done(), "a held gate let a second holder in"
    gate.leave()
    await _settle()
    assert second.done() and second.result()
    assert gate.held, "the gate was handed over, not freed"
    gate.leave()
    assert not gate.held


async def test_waiters_are_served_in_arrival_order_and_no_newcomer_slips_in() -> None:
    gate = Gate()
    await gate.enter(FAR)
    order: list[str] = []

    async def take(name: str) -> None:
        assert await gate.enter(FAR)
        order.append(name)
        await asyncio.sleep(0)
        gate.leave()

    first = asyncio.create_task(take("first"))
    await _settle()
    second = asyncio.create_task(take("second"))
    await _settle()
    gate.leave()
    # Handed to "first" already: a newcomer arriving now queues behind both.
    newcomer = asyncio.create_task(take("newcomer"))
    for _ in range(4):
        await _settle()
    assert first.done() and second.done() and newcomer.done()
    assert order == ["first", "second", "newcomer"]
    assert not gate.held


async def test_a_wait_ends_at_its_deadline_without_the_gate() -> None:
    gate = Gate()
    await gate.enter(FAR)
    loop = asyncio.get_running_loop()
    assert not await gate.enter(loop.time()), "a wait past its deadline took the gate"
    assert gate.held
    later = asyncio.create_task(gate.enter(FAR))
    await _settle()
    gate.leave()  # skips the expired waiter
    await _settle()
    assert later.done() and later.result()
    gate.leave()
    assert not gate.held


async def test_a_waiter_cancelled_as_it_is_handed_the_gate_passes_it_on() -> None:
    gate = Gate()
    await gate.enter(FAR)
    cancelled = asyncio.create_task(gate.enter(FAR))
    await _settle()
    after = asyncio.create_task(gate.enter(FAR))
    await _settle()
    gate.leave()  # handed to `cancelled`, which has not run yet
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await _settle()
    assert after.done() and after.result(), "the gate handed to a cancelled waiter was lost"
    gate.leave()
    assert not gate.held


async def test_a_waiter_cancelled_while_waiting_leaves_the_gate_to_the_next() -> None:
    gate = Gate()
    await gate.enter(FAR)
    cancelled = asyncio.create_task(gate.enter(FAR))
    await _settle()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    after = asyncio.create_task(gate.enter(FAR))
    await _settle()
    gate.leave()
    await _settle()
    assert after.done() and after.result()
    gate.leave()
    assert not gate.held
