"""What an instance runs around the stores: the workflow engine that runs your code
(`Workflows`, `WorkflowContext`, `Engine`), and the pieces it stands on — the lease keeper
(renewal, self-fencing), the recovery sweep, the child worker, durable compensation, and
the outbound call sent at most once per attempt."""

from __future__ import annotations

from agboss_sql.runtime.children import (
    ChildWorker,
    ChildYielded,
    RunChild,
    WakeParent,
    error_outcome,
)
from agboss_sql.runtime.context import WorkflowContext
from agboss_sql.runtime.engine import DEFAULT_TENANT, Engine, WorkflowHandle
from agboss_sql.runtime.errors import (
    AmbiguousPauseError,
    ChildWorkflowFailedError,
    InvalidStepNameError,
    NotJsonError,
    PauseNotSupportedError,
    StepConflictError,
    UnknownWorkflowError,
    UnknownWorkflowRunError,
    WorkflowCancelledError,
    WorkflowDefinitionError,
    WorkflowFailedError,
    WorkflowIdConflictError,
    WorkflowTimeoutError,
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
from agboss_sql.runtime.workflows import (
    Child,
    PauseInfo,
    WorkflowDefinition,
    Workflows,
    WorkflowState,
    WorkflowStatus,
)

__all__ = [
    # your code on the stores
    "Workflows",
    "WorkflowContext",
    "Child",
    "Engine",
    "WorkflowHandle",
    "WorkflowStatus",
    "WorkflowState",
    "PauseInfo",
    "WorkflowDefinition",
    "DEFAULT_TENANT",
    "AmbiguousPauseError",
    "ChildWorkflowFailedError",
    "InvalidStepNameError",
    "NotJsonError",
    "PauseNotSupportedError",
    "StepConflictError",
    "UnknownWorkflowError",
    "UnknownWorkflowRunError",
    "WorkflowCancelledError",
    "WorkflowDefinitionError",
    "WorkflowFailedError",
    "WorkflowIdConflictError",
    "WorkflowTimeoutError",
    # the pieces under it
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
