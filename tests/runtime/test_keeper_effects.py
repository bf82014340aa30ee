"""`LeaseKeeper.effect()` on a virtual clock (docs/limits.md, "The holder's own effects").

The renewals of `GatedRenewLeases` wait while a gate is closed, as a renewal on a database
waits behind the row lock its holder's own effect holds; the test opens the gate where the
effect would commit. The same on real processes and databases: tests/faults/test_probes.py
and tests/faults/test_long_effects.py.
"""

from __future__ import annotations

import asyncio

from runtime_support import START, TENANT, RecordingLeases, World, settle

from agboss_sql.contracts import ExecutionLease
from agboss_sql.runtime import LeaseKeeper

LEASE_MS = 3_000
"""Its trust window is 2 s (`TRUST_MARGIN_MS` is 1 s), renewals every second."""


class GatedRenewLeases(RecordingLeases):
    """Renewals are sent at once and decided when the gate opens (the row's lock freed)."""

    gate: asyncio.Event

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        await self.gate.wait()
        return await super().renew(lease, lease_ms)


async def _advance(world: World, ms: int, step: int = 100) -> None:
    await settle()
    while ms > 0:
        await world.clock.advance(min(step, ms))
        await settle()
        ms -= step


async def _holder(world: World) -> tuple[LeaseKeeper, GatedRenewLeases]:
    instance = world.instance("holder", GatedRenewLeases)
    leases = instance.leases
    assert isinstance(leases, GatedRenewLeases)
    leases.gate = asyncio.Event()
    leases.gate.set()
    keeper = LeaseKeeper(leases, instance.events, world.clock, lease_ms=LEASE_MS)
    assert await keeper.take(TENANT, "tree-1") is not None
    keeper.start()
    return keeper, leases


async def test_without_effect_a_renewal_held_up_past_the_trust_window_loses_the_lease(
    world: World,
) -> None:
    keeper, leases = await _holder(world)
    leases.gate.clear()
    await _advance(world, 2_000)
    assert keeper.lost  # the window (2 s) ended with the renewal still waiting


async def test_an_effect_shorter_than_the_lease_keeps_it_through_its_held_up_renewal(
    world: World,
) -> None:
    keeper, leases = await _holder(world)
    async with keeper.effect() as held:
        held()  # the fence passed: the row is locked, renewals wait
        leases.gate.clear()
        await _advance(world, 2_500)
        assert keeper.held and keeper.trusted()  # past the window, before the lease's end
        leases.gate.set()  # the effect commits
    await settle()
    assert keeper.held and keeper.trusted()
    await _advance(world, 3 * LEASE_MS)
    assert keeper.held and keeper.trusted()
    assert leases.renewals and leases.renewals[-1] > START + 2_500


async def test_an_effect_ending_inside_the_window_lets_its_held_up_renewal_answer_after_it(
    world: World,
) -> None:
    keeper, leases = await _holder(world)
    async with keeper.effect() as held:
        held()
        leases.gate.clear()
        await _advance(world, 1_900)  # a renewal was sent at 1 s and waits
    assert keeper.held
    await _advance(world, 300)  # the row is free, but its renewal answers only now
    leases.gate.set()
    await settle()
    assert keeper.held and keeper.trusted()


async def test_an_effect_that_outlasts_the_lease_loses_it_at_the_leases_end(
    world: World,
) -> None:
    keeper, leases = await _holder(world)
    async with keeper.effect() as held:
        held()
        leases.gate.clear()
        await _advance(world, 2_900)
        assert keeper.held
        await _advance(world, 200)
        assert keeper.lost
        assert "its own effect held the lease past the lease's end" in str(keeper.signal.reason)
        leases.gate.set()
