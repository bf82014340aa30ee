"""The fencing matrix: every fenced write and every lease move against every state a lease
can be in, and the child queue's attempt rules against every state a child can be in,
generated from one table each so no contract can miss a row.

A row of `LEASE_STATES` says how to bring a lease (and the context an instance acts with)
into its state, what a fenced write with that context is refused for, and what each lease
move with it answers. `WRITES` lists every fenced write of each fencing store; the suites
of `fenced_effect` and `outbound_call` take `write_cases(contract)` (each write against each
state), the lease suite takes `move_cases()` (each move against each state), the child
queue's suite `attempt_cases()` (restart and finish against each child state).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.errors import ExecutionFencedError, InvalidIdentifierError
from agboss_sql.contracts.keys import attempt_owner_of
from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.stores import ChildExecutionQueueRepository
from agboss_sql.contracts.types import (
    AttemptRef,
    ChildStatus,
    ExecutionLease,
    FencedEffectKey,
    OutboundCallStatus,
    QueuedChild,
)
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import (
    FENCED_EFFECT,
    LEASE,
    LEASE_MS,
    OTHER_TENANT,
    OUTBOUND_CALL,
    World,
    expect,
    fail,
    key_of,
)

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
)
"""States only a lease move can meet: a move is made by its store's instance."""

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


# --- the fenced writes --------------------------------------------------------------------

INTENT = {"order": "o-1", "amount_cents": 100}
VALUE = {"charged": True}


@dataclass(frozen=True, slots=True)
class Write:
    """One fenced write of a fencing store."""

    contract: str
    name: str
    prepare: Callable[[World], Prepare]
    run: Callable[[World, FencedEffectKey, int], Awaitable[Any]]
    """Make the write with the key of the context, by the given instance."""
    unchanged: Callable[[World, ExecutionLease], Awaitable[str | None]]
    """After a refusal: what was written, or `None` when nothing was."""


def _nothing(w: World) -> Prepare:
    async def prepare(lease: ExecutionLease) -> None:
        return None

    return prepare


async def _effect(w: World, key: FencedEffectKey, instance: int) -> Any:
    return await w.effects(instance).save_result_if_absent(key, w.work("written", VALUE))


async def _no_rows(w: World, lease: ExecutionLease) -> str | None:
    rows = await w.rows()
    return None if not rows else f"business rows {rows}"


def _recorded(w: World) -> Prepare:
    async def prepare(lease: ExecutionLease) -> None:
        await w.calls(0).save_if_absent(key_of(lease), INTENT, w.now)

    return prepare


def _claimed(w: World) -> Prepare:
    async def prepare(lease: ExecutionLease) -> None:
        key = key_of(lease)
        saved = await w.calls(0).save_if_absent(key, INTENT, w.now)
        claimed = await w.calls(0).mark_pending(key, saved.call.attempt_ref, attempt_owner_of(key))
        expect(claimed, "attempt-cas", "the holder's claim of attempt 1 was refused")

    return prepare


async def _call_row(w: World, lease: ExecutionLease) -> Any:
    return await w.calls(0).get(key_of(lease))


async def _record(w: World, key: FencedEffectKey, instance: int) -> Any:
    return await w.calls(instance).save_if_absent(key, INTENT, w.now)


async def _no_call(w: World, lease: ExecutionLease) -> str | None:
    row = await _call_row(w, lease)
    return None if row is None else f"a call row {row}"


def _readable(key: FencedEffectKey) -> FencedEffectKey:
    """`key` for reading the call's row before the write: a key built without its holder
    reads the same row under any holder's name (the holder is no part of its identity)."""
    if key.holder_instance_id:
        return key
    return dataclasses.replace(key, holder_instance_id="reader")


async def _mark_pending(w: World, key: FencedEffectKey, instance: int) -> Any:
    expected = AttemptRef(OutboundCallStatus.PENDING, 0, "")
    row = await w.calls(0).get(_readable(key))
    if row is not None:
        expected = row.attempt_ref
    return await w.calls(instance).mark_pending(key, expected, attempt_owner_of(key))


def _at_attempt(status: OutboundCallStatus, attempt: int) -> Any:
    async def unchanged(w: World, lease: ExecutionLease) -> str | None:
        row = await _call_row(w, lease)
        if row is None:
            return None
        found = (OutboundCallStatus(row.status), int(row.attempt))
        return None if found == (status, attempt) else f"the call moved to {found}"

    return unchanged


def _ending(completed: bool) -> Callable[[World, FencedEffectKey, int], Awaitable[Any]]:
    async def run(w: World, key: FencedEffectKey, instance: int) -> Any:
        row = await w.calls(0).get(_readable(key))
        ref = (
            row.attempt_ref
            if row is not None
            else AttemptRef(OutboundCallStatus.PENDING, 1, attempt_owner_of(key))
        )
        calls = w.calls(instance)
        if completed:
            return await calls.mark_completed(key, ref, VALUE)
        return await calls.mark_failed(key, ref, {"refused": True})

    return run


WRITES: tuple[Write, ...] = (
    Write(FENCED_EFFECT, "save_result_if_absent", _nothing, _effect, _no_rows),
    Write(OUTBOUND_CALL, "save_if_absent", _nothing, _record, _no_call),
    Write(
        OUTBOUND_CALL,
        "mark_pending",
        _recorded,
        _mark_pending,
        _at_attempt(OutboundCallStatus.PENDING, 0),
    ),
    Write(
        OUTBOUND_CALL,
        "mark_completed",
        _claimed,
        _ending(True),
        _at_attempt(OutboundCallStatus.PENDING, 1),
    ),
    Write(
        OUTBOUND_CALL,
        "mark_failed",
        _claimed,
        _ending(False),
        _at_attempt(OutboundCallStatus.PENDING, 1),
    ),
)
"""Every fenced write of each fencing store."""


def _write_case(write: Write, state: State) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        reached = await state.reach(w, write.prepare(w))
        key = key_of(reached.context)
        if state.key is not None:
            key = state.key(key)
        what = f"{write.name} with a context whose lease is {state.name}"
        refusal = state.write
        if isinstance(refusal, type):
            try:
                answer = await write.run(w, key, reached.instance)
            except refusal:
                written = await write.unchanged(w, reached.context)
                expect(written is None, "no-stale-write", f"{what} was refused but wrote {written}")
                return
            except Exception as exc:
                fail(
                    "bad-input",
                    f"{what} raised {exc!r}, where the contract raises {refusal.__name__}",
                )
            fail(
                "no-stale-write",
                f"{what} was accepted ({answer!r}), where the contract refuses it "
                f"({refusal.__name__})",
            )
        try:
            answer = await write.run(w, key, reached.instance)
        except ExecutionFencedError as exc:
            if refusal is None:
                fail("no-stale-write", f"{what} was refused ({exc.reason})")
            expect(
                exc.reason == refusal,
                "no-stale-write",
                f"{what} was refused for {exc.reason!r}, where the contract says {refusal.value!r}",
            )
            expect(
                exc.scope_key == key.scope_key and exc.token == key.token,
                "no-stale-write",
                f"{what}: the refusal names {exc.scope_key!r} at {exc.token}, expected "
                f"{key.scope_key!r} at {key.token}",
            )
            written = await write.unchanged(w, reached.context)
            expect(written is None, "no-stale-write", f"{what} was refused but wrote {written}")
            return
        if refusal is not None:
            fail(
                "no-stale-write",
                f"{what} was accepted ({answer!r}), where the contract refuses it "
                f"({refusal.value})",
            )
        accepted = getattr(answer, "created", answer)
        if isinstance(accepted, bool):
            expect(accepted, "no-stale-write", f"{what} on a live lease answered {answer!r}")

    return run


def write_cases(contract: str) -> list[Case]:
    """Each fenced write of `contract` against each lease state: one fencing case each."""
    return [
        Case(
            contract,
            f"matrix: {write.name} with a context whose lease is {state.name}",
            _write_case(write, state),
            fencing=True,
        )
        for write in WRITES
        if write.contract == contract
        for state in (*LEASE_STATES, *WRITE_ONLY_STATES)
    ]


# --- the lease moves ----------------------------------------------------------------------


async def _move(w: World, move: str, lease: ExecutionLease, instance: int) -> bool:
    leases = w.leases(instance)
    if move == RENEW:
        return await leases.renew(lease, LEASE_MS) is not None
    if move == RELEASE:
        return await leases.release(lease)
    if move == YIELD:
        return await leases.yield_lease(lease)
    if move == RECLAIM:
        new = await leases.reclaim(lease, LEASE_MS)
        if new is not None:
            expect(
                new.lease_epoch == lease.lease_epoch + 1,
                "lease-moves",
                f"a reclaim at epoch {lease.lease_epoch} gave epoch {new.lease_epoch}, not the "
                "next one",
            )
        return new is not None
    return await leases.finish(lease)


def _move_case(move: str, state: State) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)

        async def nothing(lease: ExecutionLease) -> None:
            return None

        reached = await state.reach(w, nothing)
        granted = await _move(w, move, reached.context, reached.instance)
        what = f"a {move} with a context whose lease is {state.name}"
        wanted = state.moves[move]
        expect(
            granted == wanted,
            "no-stale-write" if granted else "lease-moves",
            f"{what} was {'granted' if granted else 'refused'}, where the contract "
            f"{'grants' if wanted else 'refuses'} it",
        )
        if not granted and reached.holder is not None:
            # Nothing moved: the lease's current holder still renews it.
            instance, held = reached.holder
            left = await w.leases(instance).renew(held, LEASE_MS)
            expect(
                left is not None,
                "no-stale-write",
                f"after {what} was refused, the current holder's renewal was refused: the "
                "refused move changed the lease",
            )

    return run


def move_cases() -> list[Case]:
    """Each lease move against each lease state: one case each (the lease store has no
    opt-out, so none is a fencing case)."""
    return [
        Case(
            LEASE,
            f"matrix: {move} with a context whose lease is {state.name}",
            _move_case(move, state),
        )
        for move in MOVES
        for state in (*LEASE_STATES, *MOVE_ONLY_STATES)
    ]


# --- the child queue's attempt rules ------------------------------------------------------

CHILD_QUEUE = "child_queue"


@dataclass(frozen=True, slots=True)
class ChildState:
    """One state a child can be in when a restart or finish arrives with an attempt."""

    name: str
    restart: bool
    """Whether a restart at the attempt is granted."""
    finish: bool
    """Whether a finish at the attempt is answered finished."""
    reach: Callable[[World, ChildExecutionQueueRepository, str], Awaitable[int]]
    """Queue the child (or not) and bring it to the state: the attempt the move carries."""


async def _enqueue(w: World, queue: ChildExecutionQueueRepository, child: str) -> None:
    parent = f"{child}-parent"
    await queue.enqueue(QueuedChild("tenant-1", f"{child}-root", parent, child, 1, None))
    # A sibling keeps the parent unfinished, so a finish answers how many are left.
    await queue.enqueue(QueuedChild("tenant-1", f"{child}-root", parent, f"{child}-sib", 1, None))


async def _claim(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    # Claims take the deepest, then the oldest child: ours, queued before its sibling.
    claimed = await queue.claim("instance-1")
    if claimed is None or claimed.child_execution_id != child:
        fail("claim-order", f"the first claim of an emptied queue got {claimed}, not {child!r}")
    return int(claimed.attempt)


async def _c_queued(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    return 0


async def _c_running(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    return await _claim(w, queue, child)


async def _c_restarted(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    attempt = await _claim(w, queue, child)
    again = await queue.restart(child, attempt)
    if again is None:
        fail("restart-cas", f"a restart of {child!r} at its current attempt was refused")
    return attempt


async def _c_finished(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    attempt = await _claim(w, queue, child)
    done = await queue.finish(child, {"ok": True}, attempt=attempt)
    expect(done.finished, "finish-once", f"the finish of {child!r} at its attempt was refused")
    return attempt + 1


async def _c_replay(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    await _enqueue(w, queue, child)
    attempt = await _claim(w, queue, child)
    done = await queue.finish(child, {"ok": True}, attempt=attempt)
    expect(done.finished, "finish-once", f"the finish of {child!r} at its attempt was refused")
    return attempt


async def _c_absent(w: World, queue: ChildExecutionQueueRepository, child: str) -> int:
    return 1


CHILD_STATES: tuple[ChildState, ...] = (
    ChildState("queued, never claimed", False, False, _c_queued),
    ChildState("running at the attempt", True, True, _c_running),
    ChildState("running at a later attempt (restarted)", False, False, _c_restarted),
    ChildState("finished at another attempt", False, False, _c_finished),
    ChildState("finished at the attempt (a retried finish)", False, True, _c_replay),
    ChildState("absent", False, False, _c_absent),
)
"""Every state a child can be in when a restart or a finish arrives with an attempt."""


def _attempt_case(move: str, state: ChildState) -> CaseRun:
    async def run(ctx: CaseContext) -> None:
        w = World(ctx)
        queue: ChildExecutionQueueRepository = ctx.store(CHILD_QUEUE, 0)
        other: ChildExecutionQueueRepository = ctx.store(CHILD_QUEUE, 1)
        child = w.name("child")
        attempt = await state.reach(w, queue, child)
        before = [
            (c.status, c.attempt, c.outcome)
            for c in await queue.children("tenant-1", f"{child}-parent")
            if c.child_execution_id == child
        ]
        what = f"a {move} at attempt {attempt} of a child {state.name}"
        if move == "restart":
            got = await other.restart(child, attempt)
            granted = got is not None
            wanted = state.restart
            rule = "restart-cas"
            if got is not None:
                expect(
                    got.attempt == attempt + 1 and got.claimed_by == "instance-2",
                    rule,
                    f"{what} gave attempt {got.attempt} to {got.claimed_by!r}",
                )
        else:
            result = await other.finish(child, {"late": True}, attempt=attempt)
            granted = result.finished is True
            wanted = state.finish
            rule = "finish-once"
            # Every finish answers the parent's children not finished once it is done (a
            # refused one changed nothing; a retry answers what the first finish did).
            siblings = await queue.children("tenant-1", f"{child}-parent")
            remaining = sum(1 for c in siblings if c.status != ChildStatus.FINISHED)
            expect(
                result.finished in (True, False) and result.remaining == remaining,
                rule,
                f"{what} answered {result}, where the contract answers "
                f"finished={wanted}, remaining={remaining}",
            )
        expect(
            granted == wanted,
            rule,
            f"{what} was {'granted' if granted else 'refused'}, where the contract "
            f"{'grants' if wanted else 'refuses'} it",
        )
        if not granted or (state.finish and move == "finish" and state.name.startswith("finished")):
            after = [
                (c.status, c.attempt, c.outcome)
                for c in await queue.children("tenant-1", f"{child}-parent")
                if c.child_execution_id == child
            ]
            expect(after == before, rule, f"{what} changed the child: {before} -> {after}")

    return run


def attempt_cases() -> list[Case]:
    """Restart and finish against each child state: one case each."""
    return [
        Case(
            CHILD_QUEUE,
            f"matrix: {move} at an attempt of a child {state.name}",
            _attempt_case(move, state),
        )
        for move in ("restart", "finish")
        for state in CHILD_STATES
    ]


__all__ = [
    "CHILD_STATES",
    "LEASE_STATES",
    "MOVES",
    "MOVE_ONLY_STATES",
    "WRITE_ONLY_STATES",
    "WRITES",
    "attempt_cases",
    "move_cases",
    "write_cases",
]
