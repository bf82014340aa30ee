"""Writing the lease log: after the move it records, never failing the run."""

from __future__ import annotations

import logging

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
    it records has already happened.
    """
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
