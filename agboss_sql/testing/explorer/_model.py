"""What the sim keeps beside the stores: each instance's stores and beliefs, and the
contract's model of each tree's lease and each queued child."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.stores import (
    ChildExecutionQueueRepository,
    ExecutionLeaseRepository,
    FencedEffectRepository,
    OutboundCallRepository,
)
from agboss_sql.contracts.types import AttemptRef, ChildStatus, ExecutionLease, LeaseState
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


class TreeModel:
    """The contract's view of one tree's lease, built from the store's answers: what the
    store must hold if it kept the contract."""

    __slots__ = (
        "closed",
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

    __slots__ = ("attempt", "finished_attempt", "index", "remaining", "status")

    def __init__(self, index: int) -> None:
        self.index = index
        self.status = ChildStatus.QUEUED
        self.attempt = 0
        self.finished_attempt = 0
        self.remaining = -1
        """What its finish answered (the siblings left unfinished)."""

    def key(self) -> tuple[str, int, int, int]:
        return (self.status.value, self.attempt, self.finished_attempt, self.remaining)


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

    def acting(self) -> ExecutionLease | None:
        """The context it acts with in good faith: the lease it holds or yielded."""
        return self.lease if self.holding or self.yielded else None

    def trust_left(self, now: int) -> int:
        """How long it still trusts its lease (0: it does not)."""
        if not self.holding or self.expiry is None:
            return 0
        return max(0, self.expiry - TRUST_MARGIN_MS - now)
