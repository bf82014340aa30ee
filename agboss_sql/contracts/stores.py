"""The store contracts: one abstract base class per shared store.

Every method is `async`. Times are integer ms; identifiers are texts of at
most 255 characters. Each docstring states the promise an implementation keeps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from agboss_sql.contracts._value_rules import checked_child_finishes
from agboss_sql.contracts.types import (
    AttemptRef,
    BudgetScope,
    ChildExecution,
    ChildFinish,
    ClaimedChild,
    CostEntry,
    CostTotal,
    ExecutionLease,
    ExecutionLeaseEvent,
    ExecutionRecord,
    ExecutionRecordStatus,
    ExecutionSnapshot,
    FencedEffectKey,
    FencedEffectResult,
    FinishResult,
    HistoryCursor,
    JsonValue,
    LeaseCheck,
    LeaseState,
    MeshRequest,
    MeshRequestSaved,
    OutboundCall,
    OutboundCallSaved,
    PausedExecution,
    QueuedChild,
    WaitResult,
    WindowResult,
)

T = TypeVar("T")
Tx = TypeVar("Tx")

CANCEL_REQUEST_KEY = "@agboss/cancel-request"
UNWINDING_KEY = "@agboss/unwinding"
COMPENSATED_PREFIX = "@agboss/compensated/"


class Store(ABC):
    """What every store has: where its rows live, and a readiness probe."""

    backend: str | None = None
    """`"<kind>"` or `"<kind>:<database>"`: where the store's rows live. Two stores share a
    transactional backend exactly when these texts are equal. In-memory stores declare
    `"in-memory"` on the class; SQL stores answer their connection's dialect (optionally
    `":<database>"`) on each instance."""

    @abstractmethod
    async def ping(self) -> None:
        """Return when the store can serve; raise when it cannot (readiness, 2 s timeout)."""


class FencingStore(Store):
    """A store whose writes are fenced by an execution lease."""

    lease_repository: ClassVar[type[ExecutionLeaseRepository] | None] = None
    lease_check: ClassVar[LeaseCheck] = LeaseCheck.ATOMIC


class ExecutionLeaseRepository(Store):
    """One owner at a time: one lease per `(tenant_id, execution_id)`, with epochs as fencing
    tokens. Expiry is decided by the store's time; a lease is live while `expires_at > now`."""

    @abstractmethod
    async def acquire(
        self, tenant_id: str, execution_id: str, lease_ms: int
    ) -> ExecutionLease | None:
        """In one atomic step: take the lease when it is absent, or not finished and released,
        yielded or expired (`expires_at <= now`), at `lease_epoch + 1` (1 when new) for
        `lease_ms`. `None` when refused. `taken_over_from` names the previous holder when its
        epoch expired unreleased (a takeover, also from itself)."""

    @abstractmethod
    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        """While the lease is held at its epoch, not released/yielded/finished and live:
        `expires_at = max(expires_at, now + lease_ms)` (never shortens). The ms left, or
        `None` once the lease is over."""

    @abstractmethod
    async def release(self, lease: ExecutionLease) -> bool:
        """Set released when held at its epoch and not released/finished. True when it did."""

    @abstractmethod
    async def yield_lease(self, lease: ExecutionLease) -> bool:
        """Set yielded (anyone may acquire it) when held at its epoch, not
        released/yielded/finished, and live. True when it did."""

    @abstractmethod
    async def reclaim(self, lease: ExecutionLease, lease_ms: int) -> ExecutionLease | None:
        """Take back a yielded, still-live lease at `lease_epoch + 1` when nobody took it.
        The new lease, or `None`."""

    @abstractmethod
    async def finish(self, lease: ExecutionLease) -> bool:
        """Set finished and released when held at its epoch and not released/finished.
        A finished lease is never granted again. True when it did."""

    @abstractmethod
    async def save_execution_id_if_absent(self, tenant_id: str, execution_id: str) -> bool:
        """Insert the execution id if no execution ever had it, by the id alone whatever the
        tenant; never deleted. True when this call inserted it."""


class ExecutionLeaseEventRepository(Store):
    """The lease log: what each instance did with each lease, read back exactly as saved."""

    @abstractmethod
    async def save(self, event: ExecutionLeaseEvent) -> None:
        """Append `event`."""

    @abstractmethod
    async def list(self, tenant_id: str, execution_id: str) -> Sequence[ExecutionLeaseEvent]:
        """The execution's events, exactly as saved, in save order."""

    @abstractmethod
    async def recent(self, limit: int) -> Sequence[ExecutionLeaseEvent]:
        """The newest `limit` events, newest first."""


class FencedEffectRepository(FencingStore, Generic[Tx]):
    """One effect per key: the lease check, the scope's high-water mark, the stored result
    and the business rows in one atomic step."""

    @abstractmethod
    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Callable[[Tx], Awaitable[T]]
    ) -> FencedEffectResult[T]:
        """In one transaction: refuse (`ExecutionFencedError`) unless the key's lease is held
        at its token, not released/yielded/finished and live, and the scope's mark is not
        above the token; raise the mark; replay a stored result for the key; else run
        `work(tx)` in the transaction and store its (JSON) result. Any refusal or exception
        rolls everything back, the work's rows included."""

    @abstractmethod
    async def get_result(self, key: FencedEffectKey) -> FencedEffectResult[JsonValue] | None:
        """The result stored under the key's identity (`fenced_key_identity_of`), answered
        as `save_result_if_absent` answers a replay of the key (its value, `replayed=True`,
        `replayed_from` the step that wrote it when it is another step; another
        fingerprint under a business key is `IdempotencyKeyConflictError`), or `None` when
        none is stored. The key is checked as a write checks it, before anything is read.
        One read: no lease check (a zombie's read answers too), nothing locked, claimed or
        written; a write still in flight or rolled back is not seen."""


class OutboundCallRepository(FencingStore):
    """One send per key: an intent to call another system, moved by compare-and-set under
    the same lease and mark check as a fenced effect."""

    @abstractmethod
    async def get(self, key: FencedEffectKey) -> OutboundCall | None:
        """The stored intent for the key, or `None`."""

    @abstractmethod
    async def save_if_absent(
        self, key: FencedEffectKey, intent: JsonValue, recorded_at: int
    ) -> OutboundCallSaved:
        """After the lease and mark check: insert the pending intent if no row has the key.
        The stored row and whether this call created it."""

    @abstractmethod
    async def mark_pending(self, key: FencedEffectKey, expected: AttemptRef, owner: str) -> bool:
        """After the lease and mark check: when the row is still at `expected`, claim the next
        attempt (`attempt + 1`) for `owner`, status pending. True when one row changed."""

    @abstractmethod
    async def mark_completed(
        self, key: FencedEffectKey, attempt: AttemptRef, response: JsonValue
    ) -> bool:
        """After the lease and mark check: complete the pending `attempt` when it is still the
        row's attempt and owner. True when one row changed."""

    @abstractmethod
    async def mark_failed(
        self, key: FencedEffectKey, attempt: AttemptRef, error: JsonValue
    ) -> bool:
        """As `mark_completed`, ending the attempt as failed."""

    @abstractmethod
    async def lease_state_of(self, tenant_id: str, execution_id: str, token: int) -> LeaseState:
        """Lock the execution's lease row; if it expired at `token`, close it (released,
        superseded) in the same step. The lease's state at that token."""


class ChildExecutionQueueRepository(Store):
    """Children on any instance: claimed once, finished once, the parent woken once."""

    @abstractmethod
    async def enqueue(self, child: QueuedChild) -> None:
        """Queue the child; a child id already queued is `DuplicateChildError`."""

    @abstractmethod
    async def claim(self, instance_id: str) -> ClaimedChild | None:
        """In one step: take the next queued child, deepest first then oldest, and mark it
        running for `instance_id`. Two claimers never get one child."""

    @abstractmethod
    async def enqueue_many(self, children: Sequence[QueuedChild]) -> Sequence[str]:
        """In one step: queue each of `children` whose id is not queued yet (as `enqueue`
        does, each parent's count raised by the number of its children queued here) and
        answer their ids, in the order given; a child id already queued is skipped (no
        error, nothing of it changed). A batch naming one child id twice is a `ValueError`,
        before anything is queued; an empty batch answers `[]`."""

    @abstractmethod
    async def claim_many(self, instance_id: str, n: int) -> Sequence[ClaimedChild]:
        """In one step: take up to `n` queued children (deepest first, then oldest, as
        `claim` picks them) and mark each running for `instance_id` at its own next
        attempt, in that order; fewer (or none) when fewer are free. Two claimers never get
        one child, and each claimed child is finished, restarted and leased on its own."""

    def wakeups(self) -> QueueWakeups | None:
        """Where an idle claimer learns that children were queued without polling, or
        `None` when this store tells nobody (the claimer polls). Each call opens a new
        listener, which its caller closes."""
        return None

    @abstractmethod
    async def running(self, limit: int) -> Sequence[ChildExecution]:
        """Running children, oldest first (the recovery sweep tries each one's lease)."""

    @abstractmethod
    async def restart(self, child_execution_id: str, attempt: int) -> ClaimedChild | None:
        """For a running child still at `attempt`: record this store's instance as claimer
        and `attempt + 1` (compare-and-set). The claimed child, or `None`."""

    @abstractmethod
    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> FinishResult:
        """Move running -> finished once (only at `attempt` when given) and count the
        parent's unfinished children in the same step: exactly one finisher sees 0, and its
        finish owes the parent its wake (see `claim_wake`).

        Idempotent per attempt: given `attempt`, a finish of a child that this attempt
        already finished (a retry after a lost reply) answers what the first finish
        answered, `FinishResult(True, <the same remaining>)`, and changes nothing. Without
        `attempt` a second finish is `finished=False`.

        The finish that sees none left also moves its parent's entry, when the parent is
        itself a child `waiting` for its children, back to `queued` (claimable again), in
        the same step: a waiting parent is never left behind."""

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        """Finish several children at once, each as `finish(child, outcome,
        attempt=attempt)` would, as if one after another in the order given, and answer
        each one's `FinishResult` in that order: each fenced by its own attempt (a
        superseded attempt's entry changes nothing and answers `finished=False`), a retry of
        an attempt's committed finish answering what it answered, exactly one finisher of a
        parent's last children (in this batch or beside it) seeing none left, a waiting
        parent made claimable again, tenants apart. A store commits the batch in one step
        (one transaction: one commit, one count update per parent); this default, for a
        store that cannot, finishes them one after another. A batch naming one child twice
        is a `ValueError` before anything is finished; an empty batch answers `[]`."""
        batch = checked_child_finishes(finishes)
        return [
            await self.finish(f.child_execution_id, f.outcome, attempt=f.attempt) for f in batch
        ]

    @abstractmethod
    async def wait_for_children(
        self, child_execution_id: str, *, attempt: int
    ) -> WaitResult | None:
        """A child whose own children run yields: in one step that counts its children as
        `finish` does, move it running -> `waiting` at `attempt` while any of its children is
        unfinished (`WaitResult(True, remaining)`: the run ends without finishing, its lease
        yielded), or leave it running when every one finished (`WaitResult(False, 0)`: go
        on). A waiting child is neither claimed nor listed by `running` (no rescue takes
        it); the finish of its last child makes it `queued` again. Idempotent per attempt:
        a retry answers `WaitResult(True, …)` while this attempt's entry waits or was woken
        and not claimed since. `None` when the child is not running at `attempt`
        (superseded, finished, unknown)."""

    @abstractmethod
    async def unwoken(self, limit: int) -> Sequence[ChildExecution]:
        """Up to `limit` finished children whose finish saw none left (they owe their
        parent's wake) and whose wake is neither done nor claimed by a live claim, oldest
        finish first: the sweep wakes their parents."""

    @abstractmethod
    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        """Compare-and-set: the wake owed by the child (its finish saw none left) is claimed
        by `claimer` until `now + claim_ms` (application clock) when it is not done and not
        claimed by another claimer whose claim is still live. True when `claimer` holds the
        claim: of concurrent claimers exactly one; a retry by the same claimer answers True
        again. False for a child that owes no wake, or whose wake is done."""

    @abstractmethod
    async def mark_woken(self, child_execution_id: str, claimer: str) -> bool:
        """Compare-and-set: record the parent's wake as done when `claimer` holds the wake's
        claim (live or not, as long as nobody claimed it since). True when the wake is
        done by `claimer`, also on a retry; False when another claimer took the claim over
        (the wake was late past its claim) or nothing was claimed."""

    @abstractmethod
    async def children(self, tenant_id: str, parent_execution_id: str) -> Sequence[ChildExecution]:
        """The tenant's parent's children, in the order they were queued (never another
        tenant's, whatever its parent id)."""


class QueueWakeups(ABC):
    """A claimer's listener for children queued (or made claimable again) anywhere: a hint
    to claim now, never a promise that a child is free. A claimer keeps polling beside it
    (a hint can be lost, e.g. while the listener reconnects)."""

    @abstractmethod
    async def wait(self, timeout_ms: int) -> bool:
        """Wait at most `timeout_ms` (on the event loop's clock) for a hint that children
        were queued since the last call: True when one came, False when the time ran out
        or the listener could not listen (it tries again at a later call)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop listening and close what the listener holds (bounded)."""


class ExecutionRecordRepository(Store):
    """Runs and their status; status moves are compare-and-set."""

    @abstractmethod
    async def save(self, record: ExecutionRecord) -> None:
        """Insert; an existing `(tenant_id, execution_id)` is `DuplicateExecutionError`."""

    @abstractmethod
    async def get(self, tenant_id: str, execution_id: str) -> ExecutionRecord | None:
        """The record, or `None` (another tenant's record is `None`)."""

    @abstractmethod
    async def find_by_thread(self, tenant_id: str, thread_id: str) -> Sequence[ExecutionRecord]:
        """The tenant's records of a thread, oldest first."""

    @abstractmethod
    async def find_by_status(
        self, status: ExecutionRecordStatus, limit: int
    ) -> Sequence[ExecutionRecord]:
        """Up to `limit` records in `status`, oldest update first."""

    @abstractmethod
    async def transition(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        new: ExecutionRecordStatus,
    ) -> bool:
        """Compare-and-set the status from `expected` to `new`. True when it moved."""

    @abstractmethod
    async def complete(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        final: ExecutionRecordStatus,
        outcome: JsonValue,
    ) -> bool:
        """Compare-and-set from `expected` to `final` with the outcome: one outcome per run.
        True when the run's outcome is this one: moved by this call, or already completed as
        `final` with an equal outcome (a retry after a lost reply answers as the first did).
        A different final status or outcome is False."""


class ExecutionTreeRepository(Store):
    """Request-scoped keys shared by a tree (cancel requests, unwinding, compensations)."""

    @abstractmethod
    async def save_if_absent(
        self, tenant_id: str, root_execution_id: str, key: str, value: JsonValue
    ) -> bool:
        """Insert if the tree has no such key. True when this call inserted it."""

    @abstractmethod
    async def get(self, tenant_id: str, root_execution_id: str, key: str) -> JsonValue | None:
        """The key's value, or `None`."""

    @abstractmethod
    async def list(
        self, tenant_id: str, root_execution_id: str, prefix: str = ""
    ) -> dict[str, JsonValue]:
        """The tree's keys starting with `prefix`, in key order."""

    @abstractmethod
    async def delete_tree(self, tenant_id: str, root_execution_id: str) -> int:
        """Delete every key of the tree. The number deleted."""


class MeshRequestRepository(Store):
    """One run per incoming request, by its tenant and idempotency key: keys are per tenant,
    so two tenants using one key never see, complete or collide with each other's request."""

    @abstractmethod
    async def save_if_absent(
        self, idempotency_key: str, tenant_id: str, fingerprint: str, received_at: int
    ) -> MeshRequestSaved:
        """Insert the tenant's request under `idempotency_key` if the tenant has none; the
        stored request and whether it was created. The same tenant and key with another
        fingerprint is `IdempotencyKeyConflictError`. Another tenant's request under the
        same key is another request: created, never answered nor refused by it."""

    @abstractmethod
    async def complete(self, tenant_id: str, idempotency_key: str, response: JsonValue) -> bool:
        """Store the response of the tenant's request once. True when it did; False for a
        key the tenant never used (whoever else did)."""

    @abstractmethod
    async def get(self, tenant_id: str, idempotency_key: str) -> MeshRequest | None:
        """The tenant's request under the key, or `None` (never another tenant's)."""


class RateLimitRepository(Store):
    """Limits across instances, on the application's clock; each counted and taken under
    one lock."""

    @abstractmethod
    async def acquire_slot(self, key: str, holder: str, max_slots: int, ttl_ms: int) -> bool:
        """Take a slot for `holder` while fewer than `max_slots` unexpired slots are held
        (a holder's own live slot is refreshed). Never more than `max_slots` under load."""

    @abstractmethod
    async def renew_slot(self, key: str, holder: str, ttl_ms: int) -> bool:
        """Extend the holder's unexpired slot. False when it has none."""

    @abstractmethod
    async def release_slot(self, key: str, holder: str) -> None:
        """Give the holder's slot back."""

    @abstractmethod
    async def add_to_window(
        self, key: str, window_ms: int, amount: int, limit: int
    ) -> WindowResult:
        """Add `amount` to the current fixed window when it stays within `limit`; a refused
        amount is not added."""

    @abstractmethod
    async def pause_until(self, key: str, until: int) -> None:
        """Pause `key` until `until` (never shortens a pause)."""

    @abstractmethod
    async def paused_until(self, key: str) -> int | None:
        """The end of the pause, or `None` once past."""


class PausedExecutionRepository(Store):
    """Human-in-the-loop pauses, answered once whichever instance takes the answer."""

    @abstractmethod
    async def save(self, pause: PausedExecution) -> None:
        """Insert; an existing pause id is `DuplicatePauseError`."""

    @abstractmethod
    async def get(self, tenant_id: str, pause_id: str) -> PausedExecution | None:
        """The pause, or `None`."""

    @abstractmethod
    async def resolve(self, tenant_id: str, pause_id: str, decision: JsonValue) -> PausedExecution:
        """Compare-and-set pending -> resolved with the decision; the second answer (or an
        unknown pause) is `NotPausedError`."""

    @abstractmethod
    async def resolved(self, tenant_id: str, root_execution_id: str) -> Sequence[PausedExecution]:
        """The tree's resolved pauses to drain in one pass, oldest first."""

    @abstractmethod
    async def take(self, tenant_id: str, pause_id: str, *, taker: str | None = None) -> bool:
        """Compare-and-set resolved -> taken, recording `taker`. True when it moved, or when
        the pause is already taken by this same `taker` (a retry after a lost reply answers
        as the first did); False for anyone else, and for a retry without a taker."""

    @abstractmethod
    async def cancel(self, tenant_id: str, pause_id: str) -> bool:
        """Compare-and-set pending -> cancelled. True when it moved."""

    @abstractmethod
    async def purge(self, older_than: int) -> int:
        """Delete taken and cancelled pauses last moved before `older_than`. How many."""


class CostLedgerRepository(Store):
    """Spend across instances."""

    @abstractmethod
    async def record(self, entry: CostEntry) -> bool:
        """Record once by `(entry.tenant_id, entry.entry_id)` (a replayed step does not count
        twice; entry ids are per tenant). True when this call recorded it."""

    @abstractmethod
    async def total(
        self,
        scope: BudgetScope,
        key: str,
        since: int | None = None,
        *,
        tenant_id: str | None = None,
    ) -> CostTotal:
        """The spend of the scope's key (an execution, a tenant or an application), recorded
        at or after `since`, reservations included. With `tenant_id`, only that tenant's
        entries and reservations count; the EXECUTION scope needs it (an execution id is
        unique within its tenant only): `checked_budget_key`."""

    @abstractmethod
    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        """Atomically add `amount_micros` to the scope's key (of `tenant_id`, as in
        `total`) while its total stays within `limit_micros`. True when it was added."""


class ExecutionHistoryRepository(Store):
    """Finished runs, kept for export and evaluation."""

    @abstractmethod
    async def save(self, snapshot: ExecutionSnapshot) -> None:
        """Insert or replace by tenant and execution id."""

    @abstractmethod
    async def get(self, tenant_id: str, execution_id: str) -> ExecutionSnapshot | None:
        """The snapshot, or `None`."""

    @abstractmethod
    async def list(
        self,
        tenant_id: str,
        *,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        after: HistoryCursor | None = None,
    ) -> Sequence[ExecutionSnapshot]:
        """The tenant's snapshots finished in `[since, until)`, newest first, up to `limit`,
        continuing after the cursor of the last one of the previous page."""

    @abstractmethod
    async def purge(self, older_than: int) -> int:
        """Delete snapshots finished before `older_than`. How many."""


CONTRACTS: dict[str, type[Any]] = {
    "execution_lease": ExecutionLeaseRepository,
    "execution_lease_event": ExecutionLeaseEventRepository,
    "fenced_effect": FencedEffectRepository,
    "outbound_call": OutboundCallRepository,
    "child_queue": ChildExecutionQueueRepository,
    "rate_limit": RateLimitRepository,
    "execution_record": ExecutionRecordRepository,
    "execution_tree": ExecutionTreeRepository,
    "mesh_request": MeshRequestRepository,
    "paused_execution": PausedExecutionRepository,
    "cost_ledger": CostLedgerRepository,
    "execution_history": ExecutionHistoryRepository,
}
"""Every store contract by its key in `store_conformance(stores=...)`."""

FENCING_CONTRACTS = (FencedEffectRepository, OutboundCallRepository)

__all__ = [
    "CANCEL_REQUEST_KEY",
    "COMPENSATED_PREFIX",
    "CONTRACTS",
    "FENCING_CONTRACTS",
    "UNWINDING_KEY",
    "ChildExecutionQueueRepository",
    "CostLedgerRepository",
    "ExecutionHistoryRepository",
    "ExecutionLeaseEventRepository",
    "ExecutionLeaseRepository",
    "ExecutionRecordRepository",
    "ExecutionTreeRepository",
    "FencedEffectRepository",
    "FencingStore",
    "MeshRequestRepository",
    "OutboundCallRepository",
    "PausedExecutionRepository",
    "QueueWakeups",
    "RateLimitRepository",
    "Store",
]
