"""The fencing matrix's fenced writes (`WRITES`): every fenced write of each fencing store
against every state of `LEASE_STATES`, as `write_cases(contract)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.keys import attempt_owner_of
from agboss_sql.contracts.types import (
    AttemptRef,
    ExecutionLease,
    FencedEffectKey,
    OutboundCallStatus,
)
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import (
    FENCED_EFFECT,
    OUTBOUND_CALL,
    World,
    expect,
    fail,
    key_of,
)
from agboss_sql.testing.contracts._matrix_states import (
    LEASE_STATES,
    WRITE_ONLY_STATES,
    CaseRun,
    Prepare,
    State,
)

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
