"""What the sim keeps beside the stores: each instance's stores and beliefs, and the
contract's model of each tree's lease and each queued child."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.stores import (
    ChildExecutionQueueRepository,
    CostLedgerRepository,
    ExecutionLeaseRepository,
    FencedEffectRepository,
    OutboundCallRepository,
    PausedExecutionRepository,
)
from agboss_sql.contracts.types import (
    AttemptRef,
    ChildStatus,
    ExecutionLease,
    LeaseState,
    PauseStatus,
)
from agboss_sql.testing.explorer._world import TRUST_MARGIN_MS, View


@dataclass(frozen=True, slots=True)
class InstanceStores:
    """One simulated instance's stores, built from the set's factories with its own seam."""

    name: str
    skew_ms: int
    leases: ExecutionLeaseRepository | None
    effects: FencedEffectRepository[Any] | None
    calls: OutboundCallRepository | None
    queue: ChildExecutionQueueRepository | None = None
    pauses: PausedExecutionRepository | None = None
    costs: CostLedgerRepository | None = None


class TreeModel:
    """The contract's view of one tree's lease, built from the store's answers: what the
    store must hold if it kept the contract."""

    __slots__ = (
        "closed",
        "decided",
        "epoch",
        "expires_at",
        "finished",
        "finished_by",
        "granted",
        "holder",
        "index",
        "name",
        "released",
        "yielded",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"tree-{index + 1}"
        self.epoch = 0
        self.holder = -1
        self.expires_at = 0
        self.released = False
        self.yielded = False
        self.finished = False
        self.closed = False
        self.finished_by = ""
        self.granted: dict[int, str] = {}
        self.decided: dict[int, tuple[LeaseState, str]] = {}
        """Each token `lease_state_of` answered is over (superseded, released, finished),
        with the answer and who asked: that epoch never moves again."""

    def refusal(
        self, epoch: int, holder: int, now: int, *, live: bool = True, yielded_ok: bool = False
    ) -> str | None:
        """Why the contract refuses a move or write of `holder` at `epoch` now, or `None`."""
        if epoch > self.epoch:
            return "never granted"
        if epoch < self.epoch or holder != self.holder:
            return FenceRefusal.SUPERSEDED
        if self.finished:
            return FenceRefusal.FINISHED
        if self.closed:
            return "closed (superseded)"
        if self.released:
            return FenceRefusal.RELEASED
        if self.yielded and not yielded_ok:
            return FenceRefusal.YIELDED
        if live and self.expires_at <= now:
            return FenceRefusal.EXPIRED
        return None

    def state_at(self, token: int, now: int) -> LeaseState:
        """What `lease_state_of` answers at `token` by the contract."""
        if self.epoch == 0 or self.epoch < token:
            return LeaseState.ABSENT
        if self.epoch > token:
            return LeaseState.SUPERSEDED
        if self.finished:
            return LeaseState.FINISHED
        if self.closed:
            return LeaseState.SUPERSEDED
        if self.released:
            return LeaseState.RELEASED
        if self.expires_at <= now:
            return LeaseState.SUPERSEDED
        return LeaseState.LIVE

    def open(self) -> bool:
        return self.epoch > 0 and not self.released and not self.finished


class ChildModel:
    """The contract's view of one queued child, built from the store's answers."""

    __slots__ = (
        "attempt",
        "depth",
        "finished_attempt",
        "index",
        "parent",
        "queued",
        "remaining",
        "status",
        "wait_attempt",
        "wake_by",
        "wake_until",
        "woken_by",
    )

    def __init__(self, index: int, parent: int = -1, depth: int = 1) -> None:
        self.index = index
        self.parent = parent
        """Its parent's index among the children, -1 for the root."""
        self.depth = depth
        self.queued = True
        """It has been queued (the child-tree world queues child-1's children in its set-up)."""
        self.status = ChildStatus.QUEUED
        self.attempt = 0
        self.finished_attempt = 0
        self.remaining = -1
        """What its finish answered (the siblings left unfinished)."""
        self.wait_attempt = 0
        """The attempt whose `wait_for_children` made it wait (0: none)."""
        self.wake_by = ""
        """Who holds the claim of the wake its finish owes (when it answered none left)."""
        self.wake_until = 0
        self.woken_by = ""
        """Who marked that wake done."""

    def key(self) -> tuple[object, ...]:
        return (
            self.status.value,
            self.attempt,
            self.finished_attempt,
            self.remaining,
            self.queued,
            self.wait_attempt,
            self.wake_by,
            self.wake_until,
            self.woken_by,
        )


class PauseModel:
    """The contract's view of one tenant's pause, built from the store's answers."""

    __slots__ = ("decision", "status", "taker", "tenant")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.status = PauseStatus.PENDING
        self.decision = ""
        """Who answered it (the decision names its instance)."""
        self.taker = ""

    def key(self) -> tuple[str, str, str]:
        return (self.status.value, self.decision, self.taker)


class LedgerModel:
    """The contract's view of one tenant's execution budget and entry."""

    __slots__ = ("entry", "reserved", "tenant")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.reserved = 0
        self.entry = False
        """The tenant's entry is recorded."""

    def spent(self, entry_micros: int) -> int:
        return self.reserved + (entry_micros if self.entry else 0)

    def key(self) -> tuple[int, bool]:
        return (self.reserved, self.entry)


class Inst:
    """What one simulated instance believes."""

    __slots__ = (
        "attempts",
        "claimed",
        "contexts",
        "done",
        "effect_done",
        "expiry",
        "holding",
        "index",
        "lease",
        "name",
        "reconciled",
        "sent",
        "stores",
        "tree",
        "view",
        "wake_claims",
        "wakes",
        "yielded",
    )

    def __init__(self, index: int, stores: InstanceStores, tree: TreeModel) -> None:
        self.index = index
        self.name = stores.name
        self.stores = stores
        self.tree = tree
        self.lease: ExecutionLease | None = None
        """The last lease the store granted it (kept after it let go: a zombie's)."""
        self.contexts: dict[int, ExecutionLease] = {}
        """Every lease the store ever granted it, by epoch: it may act with any of them."""
        self.attempts: set[tuple[int, int]] = set()
        """Every (child, attempt) of the child queue it ever saw: it may restart or finish
        with any of them."""
        self.holding = False
        """It believes it holds `lease` (it has not let go, nor been told it lost it)."""
        self.yielded = False
        self.expiry: int | None = None
        """Send time + the remaining the store answered, on the run's monotonic clock."""
        self.effect_done = False
        self.view: View | str | None = None
        """The call as it last saw it: `None` unread, `ABSENT`, or a row."""
        self.claimed: AttemptRef | None = None
        """The attempt it claimed and may send."""
        self.sent: str | None = None
        """`"charged"` or `"refused"` once it sent the claimed attempt."""
        self.reconciled: str | None = None
        """For the pending attempt in `view`: `"live"`, `"landed"` or `"not-landed"`."""
        self.done = False
        self.wakes: set[int] = set()
        """The children it saw owe their parent's wake (its finish, or `unwoken`)."""
        self.wake_claims: set[int] = set()
        """The children whose wake it claimed."""

    def acting(self) -> ExecutionLease | None:
        """The context it acts with in good faith: the lease it holds or yielded."""
        return self.lease if self.holding or self.yielded else None

    def trust_left(self, now: int) -> int:
        """How long it still trusts its lease (0: it does not)."""
        if not self.holding or self.expiry is None:
            return 0
        return max(0, self.expiry - TRUST_MARGIN_MS - now)
