"""The fencing matrix's one table of lease states (`LEASE_STATES`): how to bring a lease,
and the context an instance acts with, into each state, what a fenced write with that
context is refused for, and what each lease move with it answers."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.types import ExecutionLease, FencedEffectKey
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fencing import LEASE_MS, OTHER_TENANT, World, expect, fail

CaseRun = Callable[[CaseContext], Awaitable[None]]

RENEW = "renew"
RELEASE = "release"
YIELD = "yield"
RECLAIM = "reclaim"
FINISH = "finish"
MOVES = (RENEW, RELEASE, YIELD, RECLAIM, FINISH)
"""Every lease move."""


@dataclass(frozen=True, slots=True)
class Reached:
    """A lease brought into a state: the context an instance acts with, which instance's
    store acts, and the lease that must still be live and held after a refused move (its
    instance), if any."""

    context: ExecutionLease
    instance: int
    holder: tuple[int, ExecutionLease] | None


Prepare = Callable[[ExecutionLease], Awaitable[None]]
"""What a write needs done under the live lease before its lease moves (a recorded call,
a claimed attempt)."""


@dataclass(frozen=True, slots=True)
class State:
    """One state a lease (and the context acting on it) can be in."""

    name: str
    write: FenceRefusal | type[Exception] | None
    """What a fenced write with the context is refused for (`None`: it is accepted): the
    fence's reason, or the typed error that refuses the key before any statement."""
    moves: dict[str, bool]
    """Whether each move with the context is granted."""
    reach: Callable[[World, Prepare], Awaitable[Reached]]
    key: Callable[[FencedEffectKey], FencedEffectKey] | None = None
    """How the write's key is built by hand from the context's (`None`: as the runtime
    builds it, `fenced_effect_key_of`)."""


async def _taken(w: World, prepare: Prepare) -> tuple[str, ExecutionLease]:
    tree = w.name()
    lease = await w.take(tree, 0)
    await prepare(lease)
    return tree, lease


async def _live(w: World, prepare: Prepare) -> Reached:
    _, lease = await _taken(w, prepare)
    return Reached(lease, 0, None)


async def _expired(w: World, prepare: Prepare) -> Reached:
    _, lease = await _taken(w, prepare)
    await w.at(w.now + lease.remaining_ms)
    return Reached(lease, 0, None)


def _ended(move: str) -> Callable[[World, Prepare], Awaitable[Reached]]:
    async def reach(w: World, prepare: Prepare) -> Reached:
        _, lease = await _taken(w, prepare)
        leases = w.leases(0)
        done = await {
            RELEASE: leases.release,
            YIELD: leases.yield_lease,
            FINISH: leases.finish,
        }[move](lease)
        expect(done, "lease-moves", f"the holder's {move} of its live lease was refused")
        return Reached(lease, 0, None)

    return reach


async def _superseded(w: World, prepare: Prepare) -> Reached:
    tree, lease = await _taken(w, prepare)
    await w.at(w.now + lease.remaining_ms)
    newer = await w.take(tree, 1)
    return Reached(lease, 0, (1, newer))


async def _older_epoch(w: World, prepare: Prepare) -> Reached:
    _, lease = await _taken(w, prepare)
    leases = w.leases(0)
    expect(await leases.yield_lease(lease), "lease-moves", "the holder's yield was refused")
    newer = await leases.reclaim(lease, LEASE_MS)
    if newer is None:
        fail("lease-moves", "the holder's reclaim of the lease it yielded was refused")
    return Reached(lease, 0, (0, newer))


async def _never_granted(w: World, prepare: Prepare) -> Reached:
    _, lease = await _taken(w, prepare)
    return Reached(dataclasses.replace(lease, lease_epoch=lease.lease_epoch + 1), 0, (0, lease))


async def _absent(w: World, prepare: Prepare) -> Reached:
    _, lease = await _taken(w, prepare)
    nobody = dataclasses.replace(lease, execution_id=w.name("never-leased"))
    return Reached(nobody, 0, (0, lease))


async def _named_for_another(w: World, prepare: Prepare) -> Reached:
    # The holder's current epoch in a context built by hand under another instance's name.
    _, lease = await _taken(w, prepare)
    return Reached(dataclasses.replace(lease, holder_instance_id="instance-2"), 0, (0, lease))


async def _named_by_nobody(w: World, prepare: Prepare) -> Reached:
    # The holder's current epoch in a context that names no instance at all.
    _, lease = await _taken(w, prepare)
    return Reached(dataclasses.replace(lease, holder_instance_id=""), 0, (0, lease))


async def _holder_left_out(w: World, prepare: Prepare) -> Reached:
    # The holder's own context; the write's key is built by hand without the holder.
    _, lease = await _taken(w, prepare)
    return Reached(lease, 0, (0, lease))


def _without_holder(key: FencedEffectKey) -> FencedEffectKey:
    # Built with replace(**Any) on purpose: the type requires the holder.
    hand: Any = dataclasses.replace
    built: FencedEffectKey = hand(key, holder_instance_id=None)
    return built


async def _other_holder(w: World, prepare: Prepare) -> Reached:
    # Another instance's store moving the holder's lease, with the holder's own context.
    _, lease = await _taken(w, prepare)
    return Reached(lease, 1, (0, lease))


async def _claimed_in_own_name(w: World, prepare: Prepare) -> Reached:
    # Another instance's store moving a context it built in its own name with the holder's
    # current epoch: the context names the store's instance, but the epoch was granted to
    # the holder, so the lease row still names the holder.
    _, lease = await _taken(w, prepare)
    return Reached(dataclasses.replace(lease, holder_instance_id="instance-2"), 1, (0, lease))


async def _other_tenant(w: World, prepare: Prepare) -> Reached:
    # The holder's live lease and epoch, in a context naming another tenant: that tenant
    # has no lease of the execution (an execution id is unique within its tenant only).
    _, lease = await _taken(w, prepare)
    return Reached(dataclasses.replace(lease, tenant_id=OTHER_TENANT), 0, (0, lease))


def _granted(*moves: str) -> dict[str, bool]:
    """The moves granted with a context in a state: every other move is refused."""
    return {move: move in moves for move in MOVES}


LEASE_STATES: tuple[State, ...] = (
    State("live", None, _granted(RENEW, RELEASE, YIELD, FINISH), _live),
    State("expired", FenceRefusal.EXPIRED, _granted(RELEASE, FINISH), _expired),
    State("released", FenceRefusal.RELEASED, _granted(), _ended(RELEASE)),
    State("yielded", FenceRefusal.YIELDED, _granted(RELEASE, RECLAIM, FINISH), _ended(YIELD)),
    State("finished", FenceRefusal.FINISHED, _granted(), _ended(FINISH)),
    State("superseded by a takeover", FenceRefusal.SUPERSEDED, _granted(), _superseded),
    State("an older epoch of the same holder", FenceRefusal.SUPERSEDED, _granted(), _older_epoch),
    State("a token never granted", FenceRefusal.TOKEN_NOT_GRANTED, _granted(), _never_granted),
    State("absent", FenceRefusal.LEASE_ABSENT, _granted(), _absent),
    State(
        "the same execution's lease in another tenant",
        FenceRefusal.LEASE_ABSENT,
        _granted(),
        _other_tenant,
    ),
    State(
        "the holder's epoch under another instance's name",
        FenceRefusal.SUPERSEDED,
        _granted(),
        _named_for_another,
    ),
)
"""Every state a lease can be in when a write or a move arrives with its context. A context
built by hand under another instance's name with the holder's current epoch moves and
writes nothing: a write's key names the instance the epoch was granted to, and a move is
made by its store's instance for the lease it names."""

MOVE_ONLY_STATES: tuple[State, ...] = (
    State("held by another instance", None, _granted(), _other_holder),
    State(
        "the holder's epoch in a context that names no instance", None, _granted(), _named_by_nobody
    ),
    State(
        "the holder's epoch claimed by another instance in its own name",
        None,
        _granted(),
        _claimed_in_own_name,
    ),
)
"""States only a lease move can meet: a move is made by its store's instance. The last one
tells a store that checks the context names its own instance but matches the lease row by
tenant, execution and epoch alone, without the row's holder."""

WRITE_ONLY_STATES: tuple[State, ...] = (
    State(
        "the holder's epoch in a key that names no holder",
        InvalidIdentifierError,
        _granted(),
        _holder_left_out,
        key=_without_holder,
    ),
)
"""States only a fenced write can meet: a key built by hand that leaves the holder out is
refused before any statement (the holder is what the fence checks beside the epoch)."""
