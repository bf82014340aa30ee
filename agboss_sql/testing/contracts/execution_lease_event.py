"""Contract suite of `ExecutionLeaseEventRepository` (docs/contracts.md): the lease log.

An operator reads the log to tell a zombie from a takeover, so every field of every
event comes back exactly as saved (its type included: a kind is a `LeaseEventKind`, a
previous holder a `LeaseHolder`), per execution in save order, whichever instance saved
or reads it; `recent(limit)` is newest first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from agboss_sql.contracts.types import ExecutionLeaseEvent, LeaseEventKind, LeaseHolder
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import OTHER_TENANT, TENANT, World, expect, fail

CONTRACT = "execution_lease_event"

CaseRun = Callable[[CaseContext], Awaitable[None]]

_BIG_EPOCH = 2**40 + 7
_LONG_REASON = "lease lost: " + "é∂ " * 600


def _field_problem(saved: ExecutionLeaseEvent, read: object) -> str | None:
    """The first field of `read` that is not exactly `saved`'s, or `None`."""
    if type(read) is not ExecutionLeaseEvent:
        return f"read back a {type(read).__name__}, not an ExecutionLeaseEvent"
    for field in dataclasses.fields(ExecutionLeaseEvent):
        want = getattr(saved, field.name)
        got = getattr(read, field.name)
        if got != want:
            return f"{field.name} is {got!r}, saved {want!r}"
        if type(got) is not type(want):
            return (
                f"{field.name} is a {type(got).__name__} ({got!r}), saved a {type(want).__name__}"
            )
        if isinstance(want, LeaseHolder):
            for part in ("instance_id", "lease_epoch"):
                if type(getattr(got, part)) is not type(getattr(want, part)):
                    return f"{field.name}.{part} is a {type(getattr(got, part)).__name__}"
    return None


def _expect_exact(saved: Sequence[ExecutionLeaseEvent], read: Sequence[object], what: str) -> None:
    read = list(read)
    expect(
        len(read) == len(saved),
        "lease-log-exact",
        f"{what}: read back {len(read)} events, saved {len(saved)}",
    )
    for index, (want, got) in enumerate(zip(saved, read, strict=True)):
        problem = _field_problem(want, got)
        if problem is not None:
            fail("lease-log-exact", f"{what}: event {index + 1} ({want.kind}): {problem}")


def _events(w: World, tree: str, tenant: str = TENANT) -> list[ExecutionLeaseEvent]:
    at = w.now
    return [
        ExecutionLeaseEvent(tenant, tree, "instance-1", 1, LeaseEventKind.ACQUIRED, at),
        ExecutionLeaseEvent(tenant, tree, "instance-1", 1, LeaseEventKind.RENEWED, at + 10_000),
        ExecutionLeaseEvent(tenant, tree, "instance-1", 1, LeaseEventKind.YIELDED, at + 10_001),
        ExecutionLeaseEvent(tenant, tree, "instance-1", 2, LeaseEventKind.RECLAIMED, at + 10_002),
        ExecutionLeaseEvent(
            tenant,
            tree,
            "instance-2",
            3,
            LeaseEventKind.TAKEN_OVER,
            at + 40_002,
            taken_over_from=LeaseHolder("instance-1", 2),
        ),
        ExecutionLeaseEvent(
            tenant,
            tree,
            "instance-1",
            2,
            LeaseEventKind.LOST,
            at + 40_003,
            reason="renewal refused: the lease is over",
        ),
        ExecutionLeaseEvent(
            tenant,
            tree,
            "instance-3",
            3,
            LeaseEventKind.SUPERSEDED,
            at + 40_004,
            taken_over_from=LeaseHolder("instance-2", 3),
            reason=_LONG_REASON,
        ),
        ExecutionLeaseEvent(
            tenant, tree, "instance-2", 3, LeaseEventKind.RELEASED, at + 40_005, reason=""
        ),
        ExecutionLeaseEvent(
            tenant,
            tree,
            "instance-2",
            _BIG_EPOCH,
            LeaseEventKind.FINISHED,
            at + 2**41,
            taken_over_from=LeaseHolder("instance-2", _BIG_EPOCH - 1),
            reason="done",
        ),
    ]


async def every_field_read_back_exactly(ctx: CaseContext) -> None:
    """Events of every kind, with and without `taken_over_from` and `reason` (empty, long,
    non-ASCII), large epochs and times, are listed exactly as saved, in save order, by the
    other instance."""
    w = World(ctx)
    tree = w.name()
    events = _events(w, tree)
    expect(
        {e.kind for e in events} == set(LeaseEventKind),
        "lease-log-exact",
        "the suite must save every kind",
    )
    for index, event in enumerate(events):
        await w.log(index % 2).save(event)
    _expect_exact(events, await w.log(1).list(TENANT, tree), "list by instance-2")
    _expect_exact(events, await w.log(0).list(TENANT, tree), "list by instance-1")


async def listed_per_execution_in_save_order(ctx: CaseContext) -> None:
    """Saves of two executions and of the same execution id in another tenant, interleaved
    across two instances: each list holds only its own, in save order."""
    w = World(ctx)
    one, two = w.name(), w.name()
    streams = {
        (TENANT, one): _events(w, one),
        (TENANT, two): _events(w, two)[:4],
        (OTHER_TENANT, one): _events(w, one, OTHER_TENANT)[2:7],
    }
    longest = max(len(events) for events in streams.values())
    saves = 0
    for index in range(longest):
        for events in streams.values():
            if index < len(events):
                await w.log(saves % 2).save(events[index])
                saves += 1
    for (tenant, tree), events in streams.items():
        _expect_exact(events, await w.log(1).list(tenant, tree), f"list of {tenant}/{tree}")
    expect(
        list(await w.log(0).list(TENANT, w.name())) == [],
        "lease-log-exact",
        "an execution with no events listed some",
    )


async def recent_newest_first(ctx: CaseContext) -> None:
    """`recent(limit)` answers the newest `limit` events, newest first, whichever
    execution they belong to; `recent(0)` answers none."""
    w = World(ctx)
    one, two = w.name(), w.name()
    saved = [*_events(w, one)[:3], *_events(w, two)[:2], *_events(w, one)[3:5]]
    for index, event in enumerate(saved):
        await w.log(index % 2).save(event)
    _expect_exact(saved[::-1][:4], await w.log(1).recent(4), "recent(4)")
    _expect_exact(saved[::-1][:1], await w.log(0).recent(1), "recent(1)")
    _expect_exact([], await w.log(0).recent(0), "recent(0)")


async def saved_twice_is_listed_twice(ctx: CaseContext) -> None:
    """The log is an append: the same event saved twice is listed twice."""
    w = World(ctx)
    tree = w.name()
    event = _events(w, tree)[4]
    await w.log(0).save(event)
    await w.log(1).save(event)
    _expect_exact([event, event], await w.log(0).list(TENANT, tree), "an event saved twice")


def cases() -> list[Case]:
    """The lease log's cases (none is a fencing case: the log needs no lease check)."""
    named: list[tuple[str, CaseRun]] = [
        ("every field is read back exactly", every_field_read_back_exactly),
        (
            "events are listed per execution and tenant in save order",
            listed_per_execution_in_save_order,
        ),
        ("recent is newest first", recent_newest_first),
        ("an event saved twice is listed twice", saved_twice_is_listed_twice),
    ]
    return [Case(CONTRACT, name, run) for name, run in named]


__all__ = ["CONTRACT", "cases"]
