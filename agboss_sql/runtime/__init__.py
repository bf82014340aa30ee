"""What an instance runs around the stores: the lease keeper (renewal, self-fencing), the
recovery sweep, the child worker, durable compensation, and the outbound call sent at
most once per attempt."""

from __future__ import annotations

from agboss_sql.runtime.children import (
    ChildWorker,
    ChildYielded,
    RunChild,
    WakeParent,
    error_outcome,
)
from agboss_sql.runtime.keeper import (
    DEFAULT_LEASE_MS,
    TRUST_MARGIN_MS,
    LeaseKeeper,
    bind_keeper,
    current_keeper,
    unbind_keeper,
)
from agboss_sql.runtime.outbound import Send, outbound_call
from agboss_sql.runtime.signal import AbortSignal
from agboss_sql.runtime.sweep import DAY_MS, DEFAULT_SWEEP_MS, RecoverySweep, Resume
from agboss_sql.runtime.unwind import Compensator, Unwinder, compensate

__all__ = [
    "AbortSignal",
    "LeaseKeeper",
    "current_keeper",
    "bind_keeper",
    "unbind_keeper",
    "DEFAULT_LEASE_MS",
    "TRUST_MARGIN_MS",
    "RecoverySweep",
    "Resume",
    "DAY_MS",
    "DEFAULT_SWEEP_MS",
    "ChildWorker",
    "ChildYielded",
    "RunChild",
    "WakeParent",
    "error_outcome",
    "Unwinder",
    "Compensator",
    "compensate",
    "outbound_call",
    "Send",
]
