"""Writing the lease log: after the move it records, never failing the run."""

from __future__ import annotations

import logging
from collections.abc import Callable

from agboss_sql.contracts.clocks import Clock
from agboss_sql.contracts.stores import ExecutionLeaseEventRepository
from agboss_sql.contracts.types import (
    ExecutionLease,
    ExecutionLeaseEvent,
    LeaseEventKind,
    LeaseHolder,
)

logger = logging.getLogger("agboss_sql.runtime")

_REASON_LIMIT = 500

LeaseMoveObserver = Callable[[ExecutionLease, LeaseEventKind, "str | None"], None]
"""Told `(lease, kind, reason)` of each lease move a keeper of this process makes."""

_observers: list[LeaseMoveObserver] = []


def observe_lease_moves(observer: LeaseMoveObserver) -> Callable[[], None]:
    """Tell `observer` of every lease move the keepers, sweeps and runs of this process make
    from now on (what they log, and every renewal, logged or not), synchronously and after
    the move; answers the function that stops telling it. An observer that raises is
    reported and never fails the move."""
    _observers.append(observer)

    def stop() -> None:
        if observer in _observers:
            _observers.remove(observer)

    return stop


def notify_lease_move(
    lease: ExecutionLease, kind: LeaseEventKind, reason: str | None = None
) -> None:
    """Tell the observers (`observe_lease_moves`) of one move."""
    for observer in tuple(_observers):
        try:
            observer(lease, kind, reason)
        except Exception:
            logger.warning("a lease move observer failed on %s", kind.value, exc_info=True)


async def log_lease_event(
    events: ExecutionLeaseEventRepository | None,
    clock: Clock,
    lease: ExecutionLease,
    kind: LeaseEventKind,
    *,
    taken_over_from: LeaseHolder | None = None,
    reason: str | None = None,
) -> None:
    """Append one event for `lease` at the application clock's now.

    A failing lease log is reported and swallowed: the log is for operators, and the move
    it records has already happened. The observers of lease moves are told first.
    """
    notify_lease_move(lease, kind, reason)
    if events is None:
        return
    event = ExecutionLeaseEvent(
        tenant_id=lease.tenant_id,
        execution_id=lease.execution_id,
        instance_id=lease.holder_instance_id,
        lease_epoch=lease.lease_epoch,
        kind=kind,
        at=clock.now(),
        taken_over_from=taken_over_from,
        reason=None if reason is None else reason[:_REASON_LIMIT],
    )
    try:
        await events.save(event)
    except Exception:
        logger.warning(
            "could not write the %s event of %s/%s at epoch %d to the lease log",
            kind.value,
            lease.tenant_id,
            lease.execution_id,
            lease.lease_epoch,
            exc_info=True,
        )


async def log_take(
    events: ExecutionLeaseEventRepository | None, clock: Clock, lease: ExecutionLease
) -> None:
    """`taken-over` (naming the previous holder) when the lease was taken over, else
    `acquired`."""
    if lease.taken_over_from is not None:
        await log_lease_event(
            events, clock, lease, LeaseEventKind.TAKEN_OVER, taken_over_from=lease.taken_over_from
        )
    else:
        await log_lease_event(events, clock, lease, LeaseEventKind.ACQUIRED)
