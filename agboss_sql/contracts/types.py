"""Value types of the store contracts: frozen dataclasses and enums."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")

JsonValue = Any
"""A value that `json.dumps` accepts (dict, list, str, int, float, bool, None)."""


@dataclass(frozen=True, slots=True)
class ApplicationContext:
    """Who this application instance is."""

    instance_id: str
    name: str = "application"


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """An instance and the epoch it held."""

    instance_id: str
    lease_epoch: int


@dataclass(frozen=True, slots=True)
class ExecutionLease:
    """A granted lease: who holds `(tenant_id, execution_id)` at which epoch, for how long."""

    tenant_id: str
    execution_id: str
    holder_instance_id: str
    lease_epoch: int
    remaining_ms: int
    taken_over_from: LeaseHolder | None = None


class LeaseCheck(Enum):
    """Whether a fencing store checks the lease inside its write's transaction."""

    ATOMIC = "atomic"
    WITHOUT_DOUBLE_CHARGE_PROTECTION = "without-double-charge-protection"


class LeaseState(StrEnum):
    """What `lease_state_of` found of another execution's lease at a token."""

    LIVE = "live"
    SUPERSEDED = "superseded"
    RELEASED = "released"
    FINISHED = "finished"
    ABSENT = "absent"


class LeaseEventKind(StrEnum):
    ACQUIRED = "acquired"
    TAKEN_OVER = "taken-over"
    RENEWED = "renewed"
    RELEASED = "released"
    YIELDED = "yielded"
    RECLAIMED = "reclaimed"
    FINISHED = "finished"
    LOST = "lost"
    SUPERSEDED = "superseded"


@dataclass(frozen=True, slots=True)
class ExecutionLeaseEvent:
    """One line of the lease log: a move of one lease, by one instance, at one epoch."""

    tenant_id: str
    execution_id: str
    instance_id: str
    lease_epoch: int
    kind: LeaseEventKind
    at: int
    taken_over_from: LeaseHolder | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class StepRef:
    """A step of an execution, by its idempotency key."""

    execution_id: str
    idempotency_key: str
    name: str


@dataclass(frozen=True, slots=True)
class ExecutionContext:
    """What a running step knows of its execution and lease."""

    tenant_id: str
    root_execution_id: str
    execution_id: str
    lease: ExecutionLease
    step: StepRef


@dataclass(frozen=True, slots=True)
class FencedEffectKey:
    """The key of one fenced effect or outbound call (build it with `fenced_effect_key_of`)."""

    tenant_id: str
    lease_execution_id: str
    token: int
    scope_key: str
    step: StepRef
    name: str
    business_key: str | None = None
    fingerprint: str | None = None
    holder_instance_id: str = field(kw_only=True)
    """The instance the lease at `token` was granted to (the lease's `holder_instance_id`):
    the fence refuses the write unless the lease is held at `token` by that instance, so a
    context built by hand with another holder's epoch is refused as superseded. Required:
    a key that names no holder is `InvalidIdentifierError` before any statement (an epoch is
    granted to one instance, but only the holder's name proves the writer is that one). Not
    part of the key's identity."""


@dataclass(frozen=True, slots=True)
class StoredKeyFacts:
    """What a stored row keeps of its key: the fingerprint and the step that wrote it."""

    fingerprint: str | None
    step: StepRef | None


@dataclass(frozen=True, slots=True)
class FencedEffectResult(Generic[T]):
    """The effect's value, and whether it was replayed from a stored result (and whose)."""

    value: T
    replayed: bool
    replayed_from: StepRef | None = None


class OutboundCallStatus(StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """The attempt a caller read: compare-and-set operations compare all three."""

    status: OutboundCallStatus
    attempt: int
    attempt_owner: str


@dataclass(frozen=True, slots=True)
class OutboundCall:
    """An intent to call another system once per key, and how far it got."""

    key_identity: str
    business_identity: str | None
    tenant_id: str
    name: str
    intent: JsonValue
    status: OutboundCallStatus
    attempt: int
    attempt_owner: str
    lease_execution_id: str
    token: int
    fingerprint: str | None
    step: StepRef
    recorded_at: int
    updated_at: int
    response: JsonValue = None
    error: JsonValue = None

    @property
    def attempt_ref(self) -> AttemptRef:
        return AttemptRef(self.status, self.attempt, self.attempt_owner)


class OutboundCallSaved(NamedTuple):
    call: OutboundCall
    created: bool


@dataclass(frozen=True, slots=True)
class AttemptOwner:
    """Who may send an attempt: an execution's lease at a token."""

    tenant_id: str
    execution_id: str
    token: int


class ChildStatus(StrEnum):
    """Where a child is: `queued` (claimable), `running` (claimed by an attempt),
    `waiting` (its attempt yielded while its own children run: neither claimable nor
    rescued; the finish of its last child makes it `queued` again) or `finished`."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class QueuedChild:
    """A child execution to run on any instance."""

    tenant_id: str
    root_execution_id: str
    parent_execution_id: str
    child_execution_id: str
    depth: int
    payload: JsonValue = None


@dataclass(frozen=True, slots=True)
class ClaimedChild:
    """A child as its claimer got it: run this attempt."""

    tenant_id: str
    root_execution_id: str
    parent_execution_id: str
    child_execution_id: str
    depth: int
    payload: JsonValue
    attempt: int
    claimed_by: str


@dataclass(frozen=True, slots=True)
class ChildExecution:
    """A child's row as listed by `children` and `running`."""

    tenant_id: str
    root_execution_id: str
    parent_execution_id: str
    child_execution_id: str
    depth: int
    payload: JsonValue
    status: ChildStatus
    attempt: int
    claimed_by: str | None
    queued_at: int
    outcome: JsonValue = None


@dataclass(frozen=True, slots=True)
class ChildFinish:
    """One finish of a batch (`ChildExecutionQueueRepository.finish_many`): the child, the
    attempt that ran it (the finish is fenced by it) and the outcome."""

    child_execution_id: str
    attempt: int
    outcome: JsonValue = None


class FinishResult(NamedTuple):
    finished: bool
    remaining: int


class WaitResult(NamedTuple):
    """What `ChildExecutionQueueRepository.wait_for_children` answered: `waiting` when the
    attempt's entry waits for its children (or waited and was woken since: the run ends and
    yields its lease); `remaining` how many of its children were not finished."""

    waiting: bool
    remaining: int


class ExecutionRecordStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    tenant_id: str
    execution_id: str
    root_execution_id: str
    parent_execution_id: str | None
    thread_id: str | None
    workflow: str
    owner: str | None
    status: ExecutionRecordStatus
    created_at: int
    updated_at: int
    outcome: JsonValue = None


@dataclass(frozen=True, slots=True)
class MeshRequest:
    idempotency_key: str
    tenant_id: str
    fingerprint: str
    received_at: int
    response: JsonValue = None
    completed: bool = False


class MeshRequestSaved(NamedTuple):
    request: MeshRequest
    created: bool


@dataclass(frozen=True, slots=True)
class WindowResult:
    allowed: bool
    used: int
    resets_at: int


class PauseStatus(StrEnum):
    PENDING = "pending"
    RESOLVED = "resolved"
    TAKEN = "taken"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class PausedExecution:
    tenant_id: str
    pause_id: str
    execution_id: str
    root_execution_id: str
    thread_id: str | None
    status: PauseStatus
    request: JsonValue
    decision: JsonValue
    created_at: int
    resolved_at: int | None = None


class BudgetScope(StrEnum):
    EXECUTION = "execution"
    TENANT = "tenant"
    APPLICATION = "application"


@dataclass(frozen=True, slots=True)
class CostEntry:
    """One spend line; `entry_id` makes recording it idempotent."""

    entry_id: str
    tenant_id: str
    execution_id: str
    application: str
    tokens_in: int
    tokens_out: int
    cost_micros: int
    at: int


@dataclass(frozen=True, slots=True)
class CostTotal:
    tokens_in: int = 0
    tokens_out: int = 0
    cost_micros: int = 0


@dataclass(frozen=True, slots=True)
class ExecutionSnapshot:
    """A finished run. `record` keeps steps[].decision, input_hash, tool_calls, origin."""

    tenant_id: str
    execution_id: str
    workflow: str
    status: str
    started_at: int
    finished_at: int
    record: JsonValue = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HistoryCursor:
    """Where a page of history ended: pass it as `after` for the next page."""

    finished_at: int
    execution_id: str
