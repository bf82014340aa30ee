"""The simulated instances, the reference model of the contracts, and the invariants.

A `Sim` drives the stores of two or three instances over one store set, one
operation at a time: each operation is sent only once the store answered the
one before, so the order the explorer chose is the order the store sees. The
sim keeps, beside the stores, what the instances believe (the lease each holds
and until when it trusts it, the outbound call as it last saw it) and the
contract's model of each lease built from the store's answers (the epoch, the
holder, the expiry the contract gives, released / yielded / finished /
closed). After every checked step it compares the two and raises `Broken` on
the first invariant the store broke.

Time is the run's `VirtualClock`: the store decides by it (`StoreClock(run)`),
an instance's own wall clock is that time off by its skew, and every
instance's monotonic clock is the run's (an instance measures its trust window
on its monotonic clock, from the moment it sent the request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.clocks import VirtualClock
from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.keys import (
    attempt_owner_of,
    business_identity_of,
    fenced_effect_key_of,
    fenced_key_identity_of,
    parse_attempt_owner,
)
from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.stores import (
    ChildExecutionQueueRepository,
    ExecutionLeaseRepository,
    FencedEffectRepository,
    OutboundCallRepository,
)
from agboss_sql.contracts.types import (
    AttemptRef,
    ChildStatus,
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    LeaseState,
    OutboundCallStatus,
    QueuedChild,
    StepRef,
)
from agboss_sql.testing._case import BusinessRows

LEASE_MS = 30_000
"""The lease every simulated instance takes."""

TRUST_MARGIN_MS = 1_000
"""An instance trusts its lease for `remaining - 1000` ms from the moment it sent the request."""

START_MS = 1_700_000_000_000
"""Where the run's time starts for every schedule."""

SKEWS = (
    LEASE_MS // 2,
    -(LEASE_MS // 2),
    LEASE_MS,
    -LEASE_MS,
    10 * LEASE_MS,
    -10 * LEASE_MS,
)
"""How far the second instance's own clock is off (the third's is off the other way):
+-lease/2, +-lease, +-10 x lease. The first instance's clock is the run's."""

EFFECT_NAME = "charge"
STEP_KEY = "step-1"
STEP_NAME = "charge-step"
BUSINESS_KEY = "order-1"
FINGERPRINT = "order-1:v1"
INTENT = {"order": BUSINESS_KEY, "amount_cents": 1250}

ONE_LIVE_HOLDER = "one-live-holder"
NO_STALE_WRITE = "no-stale-write"
ONE_EFFECT_PER_KEY = "one-effect-per-key"
ONE_SEND_PER_BUSINESS_KEY = "one-send-per-business-key"
NO_TAKEOVER_OF_FINISHED_WORK = "no-takeover-of-finished-work"
STORE_ERROR = "store-error"

INVARIANTS = (
    ONE_LIVE_HOLDER,
    NO_STALE_WRITE,
    ONE_EFFECT_PER_KEY,
    ONE_SEND_PER_BUSINESS_KEY,
    NO_TAKEOVER_OF_FINISHED_WORK,
    STORE_ERROR,
)
"""What the explorer checks after every step."""

# Operations an instance can be scheduled to make.
ACQUIRE = "acquire"
RENEW = "renew"
YIELD = "yield"
RECLAIM = "reclaim"
RELEASE = "release"
FINISH = "finish"
LEASE_STATE_OF = "lease_state_of"
EFFECT = "effect"
READ = "read"
RECORD = "record"
RECONCILE = "reconcile"
CLAIM = "claim"
SEND = "send"
SEND_REFUSED = "send-refused"
END = "end"
# The same moves made with a context the instance should no longer trust (an older epoch,
# a lease it yielded, released or was told it lost): a zombie, a buggy runtime, a replayed
# message. The parameter is the context's epoch.
STALE = "stale "
STALE_RENEW = STALE + RENEW
STALE_YIELD = STALE + YIELD
STALE_RECLAIM = STALE + RECLAIM
STALE_RELEASE = STALE + RELEASE
STALE_FINISH = STALE + FINISH
STALE_EFFECT = STALE + EFFECT
STALE_RECORD = STALE + RECORD
STALE_CLAIM = STALE + CLAIM
STALE_END = STALE + END
STALE_LEASE_MOVES = (RENEW, YIELD, RECLAIM, RELEASE, FINISH)
"""The lease moves an instance may make with any context it ever held."""
# The child queue's steps: the parameter of a restart or finish is `child * 1000 + attempt`.
CLAIM_CHILD = "claim-child"
RUNNING = "running"
RESTART = "restart"
FINISH_CHILD = "finish-child"
ATTEMPTS = 1000
# Time, as a scheduled step of its own.
WAIT_EXPIRY = "wait-to-expiry"
WAIT_1MS = "wait-1ms"
WAIT_HALF = "wait-half-lease"

TIME = -1
"""The "instance" of a time step."""

Action = tuple[int, str, int]
"""(instance index or `TIME`, operation, parameter): the parameter is a token for
`lease_state_of` (0: the latest granted epoch), the context's epoch for a stale move, and
unused otherwise."""

ABSENT = "absent"
"""An instance's view of a call that has no row."""

_PENDING = OutboundCallStatus.PENDING.value
_COMPLETED = OutboundCallStatus.COMPLETED.value
_FAILED = OutboundCallStatus.FAILED.value

View = tuple[str, int, str]
"""A call row as an instance saw it: (status, attempt, attempt owner)."""


class Broken(Exception):
    """A step broke an invariant."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant
        self.message = message


@dataclass(frozen=True, slots=True)
class World:
    """What the instances of one world do."""

    ident: str
    """The world's id in test names (`lease`, `fenced_effect`, ...)."""
    title: str
    lease_ops: tuple[str, ...]
    effect: bool = False
    call: bool = False
    business_key: bool = False
    trees: int = 1
    """How many trees the instances work on: instance `i` works on tree `i % trees`."""
    queue: bool = False
    """The world drives the child queue (and no lease)."""
    needs: tuple[str, ...] = ("execution_lease",)
    """The store contracts the world needs."""
    fencing: tuple[str, ...] = ()
    """The fencing contracts whose guarantees the world tests (refused for a store that
    opted out of the lease check, unless the opt-out is accepted)."""
    setup: tuple[Action, ...] = ()
    """Steps every schedule starts from, made (and checked) before the scheduler's first
    choice: where the world's story begins."""


LEASE_WORLD = World(
    "lease",
    "lease world",
    (ACQUIRE, RENEW, YIELD, RECLAIM, RELEASE, FINISH, LEASE_STATE_OF),
)
FENCED_EFFECT_WORLD = World(
    "fenced_effect",
    "fenced-effect world",
    (ACQUIRE, RENEW, YIELD, RECLAIM, RELEASE, FINISH),
    effect=True,
    needs=("execution_lease", "fenced_effect"),
    fencing=("fenced_effect",),
)
HANDOVER_WORLD = World(
    "outbound_call_handover",
    "outbound-call hand-over world",
    (ACQUIRE, RENEW, YIELD, RECLAIM, RELEASE),
    call=True,
    needs=("execution_lease", "outbound_call"),
    fencing=("outbound_call",),
)
BUSINESS_KEY_WORLD = World(
    "outbound_call_business_key",
    "outbound-call business-key world",
    (ACQUIRE, RENEW, YIELD, RECLAIM, RELEASE),
    call=True,
    business_key=True,
    trees=2,
    needs=("execution_lease", "outbound_call"),
    fencing=("outbound_call",),
)

TAKEOVER_WORLD = World(
    "outbound_call_takeover",
    "outbound-call takeover world",
    (ACQUIRE, RELEASE, FINISH),
    call=True,
    business_key=True,
    trees=2,
    needs=("execution_lease", "outbound_call"),
    fencing=("outbound_call",),
    setup=(
        # instance-1 took tree-1, recorded the call under the business key and claimed its
        # first attempt, then stopped (a pause, a lost network) until its lease ran out.
        (0, ACQUIRE, 0),
        (0, RECORD, 0),
        (0, CLAIM, 0),
        (TIME, WAIT_EXPIRY, 0),
        # instance-2 holds tree-2, whose step makes the same call (the same business key).
        (1, ACQUIRE, 0),
    ),
)
"""Takeovers mixed with reconciliation: every schedule starts with instance-1's claimed
attempt pending under tree-1's expired lease and instance-2 holding tree-2 under the same
business key. From there tree-1 is taken over (by instance-1 coming back, at its next
epoch, or by instance-3 in the walks) while tree-2 reconciles the pending attempt, and
each claims the next attempt after its own reconciliation, racing the stopped claimer's
marks made with its old context."""

CHILD_QUEUE_WORLD = World(
    "child_queue",
    "child-queue world",
    (),
    queue=True,
    needs=("child_queue",),
)

WORLDS: dict[str, World] = {
    world.ident: world
    for world in (
        LEASE_WORLD,
        FENCED_EFFECT_WORLD,
        HANDOVER_WORLD,
        BUSINESS_KEY_WORLD,
        TAKEOVER_WORLD,
        CHILD_QUEUE_WORLD,
    )
}
"""The six worlds by id: the lease; the step's fenced effect; an outbound call handed
over on one tree; an outbound call under one business key from two trees; takeovers of a
tree whose claimed attempt is pending while the other tree under the business key
reconciles it; a parent's two children in the child queue (claim, restart, finish races,
the last child's wake)."""

CHILDREN = 2
"""How many children the child-queue world queues under its parent."""


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


def _rel(time_ms: int | None, now: int) -> int | None:
    """A deadline relative to now: any time already past is alike (-1)."""
    if time_ms is None:
        return None
    return time_ms - now if time_ms >= now else -1


def _article(reason: str) -> str:
    return f"an {reason}" if reason[0] in "aeiou" else f"a {reason}"


class Sim:
    """The instances and the model of one run, over the stores of one skew."""

    def __init__(
        self,
        world: World,
        stores: Sequence[InstanceStores],
        clock: VirtualClock,
        business_rows: BusinessRows | None,
        *,
        lease_state_of: bool,
    ) -> None:
        self.world = world
        self.stores = list(stores)
        self.clock = clock
        self.business_rows = business_rows
        self.has_state = lease_state_of and any(s.calls is not None for s in stores)
        self.tenant = "tenant-1"
        self.prefix = ""
        self.trees: list[TreeModel] = []
        self.insts: list[Inst] = []
        self.effect_by: str | None = None
        self.effect_value: Any = None
        self.rows: dict[str, View] = {}
        self.charges: list[tuple[str, int, str, str]] = []
        self.children: list[ChildModel] = []
        self.woken_by = ""
        """Which finish answered that no sibling is left (the last child's wake)."""
        self.setup_log: list[str] = []
        """The world's set-up steps, each with the store's answer, as last made."""
        self.suffix = ""
        self.last = ""
        self.outcome = ""
        self.outcomes: dict[str, int] = {}
        """How often each kind of answer was seen in checked steps (what the search
        reached)."""
        self._keys: dict[tuple[str, int, str], FencedEffectKey] = {}
        self._owners: dict[tuple[str, int, int], str] = {}
        self._short: dict[str, tuple[str, int] | str] = {}
        self._identities: dict[str, str] = {}

    # --- a schedule -----------------------------------------------------------------

    def start(self, tenant: str, prefix: str) -> None:
        """Begin a schedule: time at the start, nobody holding anything, nothing sent."""
        self.clock.set(START_MS)
        if tenant != self.tenant:
            self._keys.clear()
            self._owners.clear()
            self._short.clear()
            self._identities.clear()
        self.tenant = tenant
        self.prefix = prefix
        self.trees = [TreeModel(t) for t in range(self.world.trees)]
        self.insts = [
            Inst(i, stores, self.trees[i % self.world.trees])
            for i, stores in enumerate(self.stores)
        ]
        self.effect_by = None
        self.effect_value = None
        self.rows = {}
        self.charges = []
        self.children = [ChildModel(c) for c in range(CHILDREN if self.world.queue else 0)]
        self.woken_by = ""
        self.suffix = "" if tenant == "tenant-1" else f"-{tenant}"

    async def setup(self) -> None:
        """What a schedule starts from: the world's set-up steps made and checked (`Broken`
        when a store breaks an invariant there, or answers otherwise than the contract
        does); the child-queue world's parent has its children queued."""
        if self.world.setup:
            log: list[str] = []
            self.setup_log = log
            for action in self.world.setup:
                try:
                    await self.run(action, True, log)
                except Broken as broken:
                    raise Broken(
                        broken.invariant,
                        f"in the world's set-up ({'; '.join(log)}): {broken.message}",
                    ) from None
            first = self.insts[0]
            if first.claimed is None or not all(i.holding for i in self.insts[:2]):
                raise Broken(
                    STORE_ERROR,
                    f"the world's set-up did not reach its start ({'; '.join(log)}): the "
                    "contract grants each of these steps",
                )
        if not self.world.queue:
            return
        queue = self.insts[0].stores.queue
        assert queue is not None
        for child in self.children:
            await queue.enqueue(
                QueuedChild(
                    tenant_id=self.tenant,
                    root_execution_id=f"root{self.suffix}",
                    parent_execution_id=f"parent{self.suffix}",
                    child_execution_id=self.child_id(child.index),
                    depth=1,
                    payload={"child": child.index + 1},
                )
            )

    def child_id(self, index: int) -> str:
        return f"child-{index + 1}{self.suffix}"

    def child_index(self, child_execution_id: str) -> int | None:
        for child in self.children:
            if self.child_id(child.index) == child_execution_id:
                return child.index
        return None

    @property
    def now(self) -> int:
        """The run's time: what the store decides by."""
        return self.clock.now()

    # --- keys -----------------------------------------------------------------------

    def key_of(self, tree: TreeModel, epoch: int, holder: str = "instance-1") -> FencedEffectKey:
        """The step's key under `tree`'s lease at `epoch`, granted to `holder` (the holder
        is no part of the key's identity, nor of its attempt owner)."""
        cache = (tree.name, epoch, holder)
        key = self._keys.get(cache)
        if key is None:
            lease = ExecutionLease(self.tenant, tree.name, holder, epoch, 0)
            ctx = ExecutionContext(
                tenant_id=self.tenant,
                root_execution_id=tree.name,
                execution_id=tree.name,
                lease=lease,
                step=StepRef(tree.name, STEP_KEY, STEP_NAME),
            )
            business = self.world.business_key
            key = fenced_effect_key_of(
                ctx,
                EFFECT_NAME,
                business_key=BUSINESS_KEY if business else None,
                fingerprint=FINGERPRINT if business else None,
            )
            self._keys[cache] = key
        return key

    def owner_of(self, tree: TreeModel, epoch: int) -> str:
        """The attempt owner text of `tree`'s lease at `epoch`."""
        cache = (tree.name, epoch, 1)
        owner = self._owners.get(cache)
        if owner is None:
            owner = self._owners[cache] = attempt_owner_of(self.key_of(tree, epoch))
        return owner

    def identity_of(self, tree: TreeModel) -> str:
        """What the other system charges once: the business key, else the call's key."""
        found = self._identities.get(tree.name)
        if found is None:
            key = self.key_of(tree, 0)
            found = business_identity_of(key) or fenced_key_identity_of(key)
            self._identities[tree.name] = found
        return found

    def short(self, owner: str) -> tuple[str, int] | str:
        """An owner text as (tree, token), the same whatever the tenant."""
        found = self._short.get(owner)
        if found is None:
            parsed = parse_attempt_owner(owner)
            found = owner if parsed is None else (parsed.execution_id, parsed.token)
            self._short[owner] = found
        return found

    def owner_text(self, owner: str) -> str:
        """An owner text as printed: `tree-1 at 2`."""
        short = self.short(owner)
        if isinstance(short, str):
            return f"owner {short!r}"
        return f"{short[0]} at {short[1]}"

    def view_text(self, view: View | str | None) -> str:
        """A call as an instance saw it, as printed."""
        if view is None:
            return "unread"
        if isinstance(view, str):
            return view
        status, attempt, owner = view
        return f"{status} attempt {attempt} of {self.owner_text(owner)}"

    def call_text(self) -> str:
        """The world's outbound call, as printed."""
        return (
            f"{EFFECT_NAME} (business key {BUSINESS_KEY})"
            if self.world.business_key
            else f"{EFFECT_NAME} of {self.trees[0].name} {STEP_KEY}"
        )

    # --- the state ------------------------------------------------------------------

    def key(self) -> tuple[Any, ...]:
        """The state: the contract's model built from the store's answers, and what each
        instance believes, with times relative to now."""
        now = self.now
        trees = tuple(
            (
                t.epoch,
                t.holder,
                _rel(t.expires_at, now) if t.epoch else None,
                t.released,
                t.yielded,
                t.finished,
                t.closed,
            )
            for t in self.trees
        )
        short = self.short
        insts = tuple(
            (
                inst.lease.lease_epoch if inst.lease and (inst.holding or inst.yielded) else 0,
                inst.holding,
                inst.yielded,
                _rel(inst.expiry, now) if inst.holding else None,
                inst.effect_done,
                (inst.view[0], inst.view[1], short(inst.view[2]))
                if isinstance(inst.view, tuple)
                else inst.view,
                (inst.claimed.attempt, short(inst.claimed.attempt_owner)) if inst.claimed else None,
                inst.sent,
                inst.reconciled,
                inst.done,
                tuple(sorted(inst.contexts)),
                tuple(sorted(inst.attempts)),
            )
            for inst in self.insts
        )
        rows = tuple(sorted((s, a, short(o)) for s, a, o in self.rows.values()))
        charges = tuple((a, short(o)) for _, a, o, _ in self.charges)
        children = tuple(child.key() for child in self.children)
        return (trees, insts, self.effect_by, rows, charges, children, bool(self.woken_by))

    def deadlines(self) -> list[int]:
        """The instants a lease ends: the contract's expiries and the ones instances
        were answered."""
        found = [t.expires_at for t in self.trees if t.open()]
        found.extend(i.expiry for i in self.insts if i.holding and i.expiry is not None)
        return found

    # --- what may happen next -------------------------------------------------------

    def enabled(self) -> list[Action]:
        """Every step the scheduler may choose now."""
        world = self.world
        ops = world.lease_ops
        now = self.now
        out: list[Action] = []
        for inst in self.insts:
            i = inst.index
            if world.queue:
                out.append((i, CLAIM_CHILD, 0))
                out.append((i, RUNNING, 0))
                for child, attempt in sorted(inst.attempts):
                    out.append((i, RESTART, child * ATTEMPTS + attempt))
                    out.append((i, FINISH_CHILD, child * ATTEMPTS + attempt))
                continue
            if ACQUIRE in ops and inst.trust_left(now) == 0:
                out.append((i, ACQUIRE, 0))
            if inst.holding:
                if RENEW in ops:
                    out.append((i, RENEW, 0))
                if YIELD in ops:
                    out.append((i, YIELD, 0))
                if RELEASE in ops:
                    out.append((i, RELEASE, 0))
                if FINISH in ops:
                    out.append((i, FINISH, 0))
                if world.effect and not inst.effect_done:
                    out.append((i, EFFECT, 0))
            elif inst.yielded:
                if RECLAIM in ops:
                    out.append((i, RECLAIM, 0))
                if RELEASE in ops:
                    out.append((i, RELEASE, 0))
            if LEASE_STATE_OF in ops and self.has_state and inst.tree.epoch:
                out.append((i, LEASE_STATE_OF, 0))
            if world.call and not inst.done:
                self._protocol(inst, now, out)
            self._stale_moves(inst, out)
        deadlines = self.deadlines()
        if any(d > now for d in deadlines):
            out.append((TIME, WAIT_EXPIRY, 0))
            out.append((TIME, WAIT_HALF, 0))
        if now in deadlines:
            out.append((TIME, WAIT_1MS, 0))
        return out

    def _stale_moves(self, inst: Inst, out: list[Action]) -> None:
        """What `inst` may do out of turn, as a zombie, a buggy runtime or a replayed
        message would: with every context it ever held, every lease move of the world, the
        fenced effect, and the call's record, claim and end, but those it makes in good
        faith (with the lease it holds, every move but reclaim; with the lease it yielded,
        reclaim and release)."""
        i = inst.index
        world = self.world
        view = inst.view
        acting = inst.acting()
        for epoch, lease in inst.contexts.items():
            moves: list[str] = [m for m in STALE_LEASE_MOVES if m in world.lease_ops]
            if world.effect:
                moves.append(EFFECT)
            if world.call:
                moves.append(RECORD)
                if isinstance(view, tuple) and view[0] != _COMPLETED:
                    moves.append(CLAIM)
                    if view[0] == _PENDING and view[1] > 0:
                        moves.append(END)
            if lease is acting:
                if inst.holding:
                    good = {RENEW, YIELD, RELEASE, FINISH, RECORD, CLAIM, END}
                    if not inst.effect_done:
                        good.add(EFFECT)
                else:
                    good = {RECLAIM, RELEASE}
                moves = [m for m in moves if m not in good]
            out.extend((i, STALE + move, epoch) for move in moves)

    def _protocol(self, inst: Inst, now: int, out: list[Action]) -> None:
        """The outbound-call protocol's next steps for `inst`: read the intent, record it,
        reconcile another owner's pending attempt, claim the next attempt, send, end it."""
        i = inst.index
        view = inst.view
        if view is None or inst.reconciled == "live":
            # Read when it has not seen the row (at first, or after a compare-and-set it
            # lost), or while it waits for another owner's live lease.
            out.append((i, READ, 0))
        if not inst.holding or inst.lease is None:
            return
        mine = self.owner_of(inst.tree, inst.lease.lease_epoch)
        ends = False
        if view is None or view == ABSENT:
            out.append((i, RECORD, 0))
        elif isinstance(view, tuple):
            status, attempt, owner = view
            if status == _PENDING:
                if attempt == 0:
                    # Attempt 0 is the recorded intent, never sent: a compare-and-set claim
                    # of it is safe whoever recorded it.
                    out.append((i, CLAIM, 0))
                elif owner != mine:
                    if inst.reconciled in (None, "live"):
                        out.append((i, RECONCILE, 0))
                    elif inst.reconciled == "not-landed":
                        out.append((i, CLAIM, 0))
                    elif inst.reconciled == "landed":
                        ends = True
            elif status == _FAILED:
                out.append((i, CLAIM, 0))
        claimed = inst.claimed
        if claimed is not None:
            if inst.sent is None:
                # A send only under the lease it was claimed by, and only while trusted.
                if claimed.attempt_owner == mine and inst.trust_left(now) > 0:
                    out.append((i, SEND, 0))
                    out.append((i, SEND_REFUSED, 0))
            else:
                ends = True
        if ends:
            out.append((i, END, 0))

    # --- one step -------------------------------------------------------------------

    async def run(self, action: Action, check: bool, log: list[str] | None) -> None:
        """Make one step; with `check`, raise `Broken` on the first invariant it broke.
        With `log`, append the step and the store's answer, and keep the answer's summary
        in `last`."""
        index, op, param = action
        self.outcome = op
        if index == TIME:
            self._time(op, log)
        else:
            await self._step(self.insts[index], op, param, check, log)
        if check:
            seen = self.outcomes
            seen[self.outcome] = seen.get(self.outcome, 0) + 1

    async def _step(
        self, inst: Inst, op: str, param: int, check: bool, log: list[str] | None
    ) -> None:
        if op.startswith(STALE):
            await self._stale_step(inst, op[len(STALE) :], inst.contexts[param], check, log)
        elif op == CLAIM_CHILD:
            await self._claim_child(inst, check, log)
        elif op == RUNNING:
            await self._running(inst, log)
        elif op == RESTART:
            await self._restart(inst, *divmod(param, ATTEMPTS), check, log)
        elif op == FINISH_CHILD:
            await self._finish_child(inst, *divmod(param, ATTEMPTS), check, log)
        elif op == ACQUIRE:
            await self._acquire(inst, check, log)
        elif op == RENEW:
            await self._renew(inst, check, log)
        elif op == YIELD:
            await self._yield(inst, check, log)
        elif op == RECLAIM:
            await self._reclaim(inst, check, log)
        elif op in (RELEASE, FINISH):
            await self._let_go(inst, op == FINISH, check, log)
        elif op == LEASE_STATE_OF:
            tree = inst.tree
            await self._lease_state_of(inst, tree, param or tree.epoch, check, log)
        elif op == EFFECT:
            await self._effect(inst, check, log)
        elif op == READ:
            await self._read(inst, log)
        elif op == RECORD:
            await self._record(inst, check, log)
        elif op == RECONCILE:
            await self._reconcile(inst, check, log)
        elif op == CLAIM:
            await self._claim(inst, check, log)
        elif op in (SEND, SEND_REFUSED):
            self._send(inst, op == SEND, check, log)
        elif op == END:
            await self._end(inst, check, log)
        else:
            raise ValueError(f"unknown operation {op!r}")

    async def _stale_step(
        self,
        inst: Inst,
        op: str,
        lease: ExecutionLease,
        check: bool,
        log: list[str] | None,
    ) -> None:
        """`op` made with `lease`, a context `inst` should no longer trust. The store's
        answer is checked against the model as for any move; a refusal changes nothing of
        what the instance believes (it acted as a zombie would, and goes on)."""
        if op == RENEW:
            await self._renew(inst, check, log, lease)
        elif op == YIELD:
            await self._yield(inst, check, log, lease)
        elif op == RECLAIM:
            await self._reclaim(inst, check, log, lease)
        elif op in (RELEASE, FINISH):
            await self._let_go(inst, op == FINISH, check, log, lease)
        elif op == EFFECT:
            await self._effect(inst, check, log, lease)
        elif op == RECORD:
            await self._record(inst, check, log, lease)
        elif op == CLAIM:
            await self._claim(inst, check, log, lease)
        elif op == END:
            await self._end(inst, check, log, lease)
        else:
            raise ValueError(f"unknown stale operation {op!r}")
        self.outcome = f"stale {self.outcome}"

    @staticmethod
    def _with(lease: ExecutionLease, stale: bool) -> str:
        """How a step made out of turn names the context it was made with."""
        return f" (out of turn, with its context at {lease.lease_epoch})" if stale else ""

    def _said(self, log: list[str] | None, text: str, answer: str) -> None:
        if log is not None:
            self.last = answer
            log.append(f"{text} → {answer}")

    def _error(self, inst: Inst, what: str, exc: BaseException) -> Broken:
        return Broken(
            STORE_ERROR,
            f"{inst.name} {what} raised {type(exc).__name__}: {exc}: a store operation throws "
            "nothing but the fence's refusal (ExecutionFencedError)",
        )

    # --- time -----------------------------------------------------------------------

    def _time(self, op: str, log: list[str] | None) -> None:
        now = self.now
        why = ""
        if op == WAIT_EXPIRY:
            target = min(d for d in self.deadlines() if d > now)
            ends = [
                f"{t.name} at {t.epoch}" for t in self.trees if t.open() and t.expires_at == target
            ]
            ends += [
                f"{i.name}'s answered lease"
                for i in self.insts
                if i.holding and i.expiry == target and not ends
            ]
            why = f" (to the expiry of {', '.join(ends)})"
        elif op == WAIT_1MS:
            target = now + 1
        else:
            target = now + LEASE_MS // 2
        self.clock.set(target)
        self.outcome = f"time: {op}"
        if log is not None:
            self.last = f"+{target - now} ms"
            log.append(f"time +{target - now} ms{why}, now start +{target - START_MS} ms")

    # --- leases ---------------------------------------------------------------------

    def _lease_answer(self, lease: ExecutionLease | None) -> str:
        if lease is None:
            return "refused"
        text = f"epoch {lease.lease_epoch}, {lease.remaining_ms} ms left"
        came = lease.taken_over_from
        if came is not None:
            text += f", taken over from {came.instance_id} at {came.lease_epoch}"
        return text

    def _check_grant(self, inst: Inst, tree: TreeModel, epoch: int, how: str) -> None:
        now = self.now
        if tree.finished:
            raise Broken(
                NO_TAKEOVER_OF_FINISHED_WORK,
                f"{inst.name} was granted epoch {epoch} of {tree.name} by {how} after its work "
                f"was finished ({tree.finished_by}): finished work is never granted again",
            )
        if epoch in tree.granted:
            raise Broken(
                ONE_LIVE_HOLDER,
                f"{inst.name} was granted epoch {epoch} of {tree.name} by {how}, an epoch "
                f"already granted to {tree.granted[epoch]}: an epoch granted twice",
            )
        for other in self.insts:
            if other is inst or other.tree is not tree or other.lease is None:
                continue
            left = other.trust_left(now)
            if left > 0 and other.lease.lease_epoch != epoch:
                raise Broken(
                    ONE_LIVE_HOLDER,
                    f"{inst.name} was granted epoch {epoch} of {tree.name} while {other.name} "
                    f"still trusts epoch {other.lease.lease_epoch} for {left} ms: two live "
                    "holders",
                )

    def _check_holders(self, tree: TreeModel, what: str) -> None:
        now = self.now
        trusting = [
            i
            for i in self.insts
            if i.tree is tree and i.lease is not None and i.trust_left(now) > 0
        ]
        for a in trusting:
            for b in trusting:
                if (
                    a.index < b.index
                    and a.lease
                    and b.lease
                    and a.lease.lease_epoch != b.lease.lease_epoch
                ):
                    raise Broken(
                        ONE_LIVE_HOLDER,
                        f"{what} while {a.name} trusts epoch {a.lease.lease_epoch} for "
                        f"{a.trust_left(now)} ms and {b.name} epoch "
                        f"{b.lease.lease_epoch} for {b.trust_left(now)} ms: two live "
                        "holders",
                    )

    def _grant(self, inst: Inst, tree: TreeModel, lease: ExecutionLease, how: str) -> None:
        now = self.now
        epoch = lease.lease_epoch
        tree.granted[epoch] = f"{inst.name} by {how}"
        tree.epoch = epoch
        tree.holder = inst.index
        tree.expires_at = now + LEASE_MS
        tree.released = tree.yielded = tree.closed = False
        inst.lease = lease
        inst.contexts[epoch] = lease
        inst.holding = True
        inst.yielded = False
        inst.expiry = now + lease.remaining_ms
        inst.effect_done = False
        inst.reconciled = None

    @staticmethod
    def _leases(inst: Inst) -> ExecutionLeaseRepository:
        leases = inst.stores.leases
        assert leases is not None
        return leases

    def _lost(self, inst: Inst) -> None:
        """The store told it its lease is over: it stops, keeping the lease as a zombie's."""
        inst.holding = False
        inst.yielded = False
        inst.expiry = None

    async def _acquire(self, inst: Inst, check: bool, log: list[str] | None) -> None:
        tree = inst.tree
        try:
            lease = await self._leases(inst).acquire(self.tenant, tree.name, LEASE_MS)
        except Exception as exc:
            raise self._error(inst, f"acquire {tree.name}", exc) from exc
        if log is not None:
            self._said(log, f"{inst.name} acquire {tree.name}", self._lease_answer(lease))
        if lease is None:
            self.outcome = "acquire: refused"
            return
        self.outcome = "acquire: taken over" if lease.taken_over_from else "acquire: granted"
        if check:
            self._check_grant(inst, tree, lease.lease_epoch, "acquire")
        self._grant(inst, tree, lease, "acquire")

    async def _renew(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        assert lease is not None
        stale = given is not None
        epoch = lease.lease_epoch
        now = self.now
        try:
            remaining = await self._leases(inst).renew(lease, LEASE_MS)
        except Exception as exc:
            raise self._error(inst, f"renew {tree.name} at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                f"{inst.name} renew {tree.name} at {epoch}{self._with(lease, stale)}",
                "over" if remaining is None else f"{remaining} ms left",
            )
        if remaining is None:
            self.outcome = "renew: over"
            if not stale:
                self._lost(inst)
            return
        self.outcome = "renew: renewed"
        reason = tree.refusal(epoch, inst.index, now)
        if check and reason is not None:
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s renewal of epoch {epoch} of {tree.name} was accepted "
                f"({remaining} ms left) at {_article(reason)} token",
            )
        if reason is None:
            tree.expires_at = max(tree.expires_at, now + LEASE_MS)
        if stale and reason is not None:
            return
        inst.lease = lease
        inst.holding = True
        inst.expiry = now + remaining
        if check:
            self._check_holders(
                tree, f"{inst.name}'s renewal of epoch {epoch} of {tree.name} was accepted"
            )

    async def _yield(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        assert lease is not None
        stale = given is not None
        epoch = lease.lease_epoch
        now = self.now
        try:
            done = await self._leases(inst).yield_lease(lease)
        except Exception as exc:
            raise self._error(inst, f"yield {tree.name} at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                f"{inst.name} yield {tree.name} at {epoch}{self._with(lease, stale)}",
                "yielded" if done else "refused",
            )
        self.outcome = "yield: yielded" if done else "yield: refused"
        if not done:
            if not stale:
                self._lost(inst)
            return
        reason = tree.refusal(epoch, inst.index, now, yielded_ok=True)
        if check and reason is not None:
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s yield of epoch {epoch} of {tree.name} was accepted at "
                f"{_article(reason)} token",
            )
        if reason is None:
            tree.yielded = True
        if stale and reason is not None:
            return
        inst.lease = lease
        inst.holding = False
        inst.yielded = True
        inst.expiry = None

    async def _reclaim(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        assert lease is not None
        stale = given is not None
        epoch = lease.lease_epoch
        now = self.now
        try:
            new = await self._leases(inst).reclaim(lease, LEASE_MS)
        except Exception as exc:
            raise self._error(inst, f"reclaim {tree.name} at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                f"{inst.name} reclaim {tree.name} at {epoch}{self._with(lease, stale)}",
                self._lease_answer(new),
            )
        self.outcome = "reclaim: refused" if new is None else "reclaim: granted"
        if new is None:
            if not stale:
                self._lost(inst)
            return
        if check:
            reason = tree.refusal(epoch, inst.index, now, yielded_ok=True)
            if reason is None and not tree.yielded:
                reason = "unyielded"
            if reason is not None:
                raise Broken(
                    NO_STALE_WRITE,
                    f"{inst.name}'s reclaim of epoch {epoch} of {tree.name} was accepted at "
                    f"{_article(reason)} token",
                )
            self._check_grant(inst, tree, new.lease_epoch, "reclaim")
        self._grant(inst, tree, new, "reclaim")

    async def _let_go(
        self,
        inst: Inst,
        finish: bool,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        assert lease is not None
        stale = given is not None
        epoch = lease.lease_epoch
        what = "finish" if finish else "release"
        try:
            leases = self._leases(inst)
            done = await (leases.finish(lease) if finish else leases.release(lease))
        except Exception as exc:
            raise self._error(inst, f"{what} {tree.name} at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                f"{inst.name} {what} {tree.name} at {epoch}{self._with(lease, stale)}",
                ("finished" if finish else "released") if done else "refused",
            )
        reason = (
            tree.refusal(epoch, inst.index, self.now, live=False, yielded_ok=True)
            if done
            else "refused"
        )
        if not stale or reason is None:
            inst.holding = False
            inst.yielded = False
            inst.expiry = None
        self.outcome = f"{what}: {'done' if done else 'refused'}"
        if not done:
            return
        if check and reason in (FenceRefusal.SUPERSEDED, "never granted"):
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s {what} of epoch {epoch} of {tree.name} was accepted at "
                f"{_article(str(reason))} token: a zombie lets go of the new holder's lease",
            )
        if reason is None:
            tree.released = True
            if finish:
                tree.finished = True
                tree.finished_by = f"by {inst.name} at {epoch}"

    async def _lease_state_of(
        self, inst: Inst, tree: TreeModel, token: int, check: bool, log: list[str] | None
    ) -> LeaseState:
        calls = inst.stores.calls
        assert calls is not None
        try:
            state = await calls.lease_state_of(self.tenant, tree.name, token)
        except Exception as exc:
            raise self._error(inst, f"lease_state_of {tree.name} at {token}", exc) from exc
        state = LeaseState(state)
        self.outcome = f"lease_state_of: {state.value}"
        if log is not None:
            self._said(log, f"{inst.name} lease_state_of {tree.name} at {token}", state.value)
        self._after_state(inst, tree, token, state, check)
        return state

    def _after_state(
        self, inst: Inst, tree: TreeModel, token: int, state: LeaseState, check: bool
    ) -> None:
        if check and state is not LeaseState.LIVE:
            now = self.now
            for other in self.insts:
                if other.tree is tree and other.lease and other.lease.lease_epoch == token:
                    left = other.trust_left(now)
                    if left > 0:
                        raise Broken(
                            ONE_LIVE_HOLDER,
                            f"{inst.name} was told epoch {token} of {tree.name} is "
                            f"{state.value} while {other.name} still trusts it for {left} "
                            "ms: two live holders",
                        )
        if (
            state is LeaseState.SUPERSEDED
            and token == tree.epoch
            and not tree.released
            and not tree.finished
        ):
            # The store closed it in the step that read it.
            tree.closed = True
            tree.released = True

    # --- the step's fenced effect ---------------------------------------------------

    def _stale_write(self, inst: Inst, what: str, epoch: int) -> None:
        reason = inst.tree.refusal(epoch, inst.index, self.now)
        if reason is not None:
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s {what} at token {epoch} of {inst.tree.name} was accepted at "
                f"{_article(reason)} token",
            )

    async def _effect(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        stale = given is not None
        effects = inst.stores.effects
        assert lease is not None and effects is not None
        epoch = lease.lease_epoch
        key = self.key_of(tree, epoch, lease.holder_instance_id)
        row = f"{self.prefix}{tree.name}/{STEP_KEY}/{EFFECT_NAME} by {inst.name} at {epoch}"
        value = {"written_by": inst.name, "token": epoch}
        rows = self.business_rows

        async def work(tx: Any) -> Any:
            if rows is not None:
                await rows.insert(tx, row)
            return value

        text = (
            f"{inst.name} fenced effect {EFFECT_NAME} of {tree.name} {STEP_KEY} at {epoch}"
            f"{self._with(lease, stale)}"
            if log is not None
            else ""
        )
        try:
            result = await effects.save_result_if_absent(key, work)
        except ExecutionFencedError as exc:
            self.outcome = f"effect: refused ({exc.reason})"
            if log is not None:
                self._said(log, text, f"refused ({exc.reason})")
            if not stale:
                self._lost(inst)
            if check:
                await self._check_rows(tree)
            return
        except Exception as exc:
            raise self._error(inst, f"fenced effect at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                text,
                "replayed" if result.replayed else "written",
            )
        self.outcome = "effect: replayed" if result.replayed else "effect: written"
        if check:
            self._stale_write(inst, "fenced effect", epoch)
        if result.replayed:
            if check and result.value != self.effect_value:
                raise Broken(
                    ONE_EFFECT_PER_KEY,
                    f"{inst.name}'s fenced effect at token {epoch} replayed {result.value!r}, "
                    f"which no write stored (stored: {self.effect_value!r})",
                )
        else:
            if check and self.effect_by is not None:
                raise Broken(
                    ONE_EFFECT_PER_KEY,
                    f"the step's fenced effect {EFFECT_NAME} of {tree.name} ran again: "
                    f"{inst.name} at token {epoch} wrote it after {self.effect_by} had",
                )
            if self.effect_by is None:
                self.effect_by = f"{inst.name} at token {epoch}"
                self.effect_value = value
        if not stale:
            inst.effect_done = True
        if check:
            await self._check_rows(tree)

    async def _check_rows(self, tree: TreeModel) -> None:
        rows = self.business_rows
        if rows is None:
            return
        prefix = self.prefix
        mine = [r[len(prefix) :] for r in await rows.committed() if r.startswith(prefix)]
        if len(mine) > 1:
            raise Broken(
                ONE_EFFECT_PER_KEY,
                f"the step's fenced effect {EFFECT_NAME} of {tree.name} wrote {len(mine)} "
                f"business rows ({'; '.join(mine)}): one effect per key",
            )

    # --- the outbound call ----------------------------------------------------------

    def _see(self, inst: Inst, view: View | str) -> None:
        if view != inst.view:
            inst.reconciled = None
        inst.view = view
        if isinstance(view, tuple) and view[0] == _COMPLETED:
            inst.done = True

    @staticmethod
    def _view_of(call: Any) -> View:
        return (OutboundCallStatus(call.status).value, int(call.attempt), str(call.attempt_owner))

    async def _read(self, inst: Inst, log: list[str] | None) -> None:
        calls = inst.stores.calls
        assert calls is not None
        epoch = inst.lease.lease_epoch if inst.lease else 0
        try:
            call = await calls.get(self.key_of(inst.tree, epoch, inst.name))
        except Exception as exc:
            raise self._error(inst, "read the call", exc) from exc
        view: View | str = ABSENT if call is None else self._view_of(call)
        self.outcome = "read: absent" if call is None else f"read: {view[0]}"
        if log is not None:
            self._said(log, f"{inst.name} read the call {self.call_text()}", self.view_text(view))
        self._see(inst, view)

    async def _record(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        calls = inst.stores.calls
        lease = given or inst.lease
        stale = given is not None
        assert calls is not None and lease is not None
        tree = inst.tree
        epoch = lease.lease_epoch
        text = (
            f"{inst.name} record the call {self.call_text()} at {tree.name} {epoch}"
            f"{self._with(lease, stale)}"
            if log is not None
            else ""
        )
        try:
            saved = await calls.save_if_absent(
                self.key_of(tree, epoch, lease.holder_instance_id), INTENT, self.now
            )
        except ExecutionFencedError as exc:
            self.outcome = f"record: refused ({exc.reason})"
            if log is not None:
                self._said(log, text, f"refused ({exc.reason})")
            if not stale:
                self._lost(inst)
            return
        except Exception as exc:
            raise self._error(inst, f"record the call at {epoch}", exc) from exc
        view = self._view_of(saved.call)
        self.outcome = "record: created" if saved.created else "record: found"
        if log is not None:
            self._said(
                log, text, f"{'created' if saved.created else 'found'}, {self.view_text(view)}"
            )
        if check:
            self._stale_write(inst, "record of the call", epoch)
        if saved.created:
            self.rows[self.identity_of(tree)] = view
        self._see(inst, view)

    async def _reconcile(self, inst: Inst, check: bool, log: list[str] | None) -> None:
        view = inst.view
        assert isinstance(view, tuple)
        _, attempt, owner = view
        parsed = parse_attempt_owner(owner)
        if parsed is None:
            raise Broken(
                STORE_ERROR,
                f"{inst.name} read attempt {attempt} of the call owned by {owner!r}, which "
                "names no lease",
            )
        tree = next((t for t in self.trees if t.name == parsed.execution_id), None)
        calls = inst.stores.calls
        assert calls is not None
        try:
            state = LeaseState(
                await calls.lease_state_of(parsed.tenant_id, parsed.execution_id, parsed.token)
            )
        except Exception as exc:
            raise self._error(
                inst, f"lease_state_of {parsed.execution_id} at {parsed.token}", exc
            ) from exc
        self.outcome = f"reconcile: {state.value}"
        if tree is not None:
            self._after_state(inst, tree, parsed.token, state, check)
        if state is LeaseState.LIVE:
            inst.reconciled = "live"
            found = "its owner may still send it: wait"
        else:
            identity = self.identity_of(inst.tree)
            landed = any(
                c[0] == identity and c[1] == attempt and c[2] == owner for c in self.charges
            )
            inst.reconciled = "landed" if landed else "not-landed"
            self.outcome = f"reconcile: {state.value}, {inst.reconciled}"
            found = "the other system has it" if landed else "the other system never got it"
        if log is not None:
            self._said(
                log,
                f"{inst.name} reconcile attempt {attempt} of {self.owner_text(owner)}",
                f"lease_state_of {parsed.execution_id} at {parsed.token}: {state.value}; {found}",
            )

    async def _claim(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        calls = inst.stores.calls
        lease = given or inst.lease
        stale = given is not None
        view = inst.view
        assert calls is not None and lease is not None and isinstance(view, tuple)
        tree = inst.tree
        epoch = lease.lease_epoch
        status, attempt, owner = view
        mine = self.owner_of(tree, epoch)
        expected = AttemptRef(OutboundCallStatus(status), attempt, owner)
        text = (
            f"{inst.name} claim attempt {attempt + 1} after {self.view_text(view)}, at "
            f"{tree.name} {epoch}{self._with(lease, stale)}"
            if log is not None
            else ""
        )
        try:
            claimed = await calls.mark_pending(
                self.key_of(tree, epoch, lease.holder_instance_id), expected, mine
            )
        except ExecutionFencedError as exc:
            self.outcome = f"claim: refused ({exc.reason})"
            if log is not None:
                self._said(log, text, f"refused ({exc.reason})")
            if not stale:
                self._lost(inst)
            return
        except Exception as exc:
            raise self._error(inst, f"claim attempt {attempt + 1}", exc) from exc
        if log is not None:
            self._said(
                log, text, f"claimed attempt {attempt + 1}" if claimed else "lost (the row moved)"
            )
        self.outcome = f"claim: claimed after {status}" if claimed else "claim: lost"
        if not claimed:
            inst.view = None
            inst.reconciled = None
            return
        if check:
            self._stale_write(inst, f"claim of attempt {attempt + 1}", epoch)
        new: View = (_PENDING, attempt + 1, mine)
        self.rows[self.identity_of(tree)] = new
        inst.claimed = AttemptRef(OutboundCallStatus.PENDING, attempt + 1, mine)
        inst.sent = None
        self._see(inst, new)

    def _send(self, inst: Inst, charged: bool, check: bool, log: list[str] | None) -> None:
        claimed = inst.claimed
        assert claimed is not None
        identity = self.identity_of(inst.tree)
        if charged:
            self.charges.append((identity, claimed.attempt, claimed.attempt_owner, inst.name))
        inst.sent = "charged" if charged else "refused"
        self.outcome = f"send: {inst.sent}"
        if log is not None:
            self._said(
                log,
                f"{inst.name} send attempt {claimed.attempt} of the call",
                "charged" if charged else "refused by the other system (not charged)",
            )
        if check and charged:
            sends = [c for c in self.charges if c[0] == identity]
            if len(sends) > 1:
                what = (
                    f"business key {BUSINESS_KEY}"
                    if self.world.business_key
                    else f"the call {self.call_text()}"
                )
                detail = "; ".join(
                    f"attempt {a} sent by {who} under {self.owner_text(o)}"
                    for _, a, o, who in sends
                )
                raise Broken(
                    ONE_SEND_PER_BUSINESS_KEY,
                    f"the other system was charged {len(sends)} times for {what}: {detail}",
                )

    async def _end(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        calls = inst.stores.calls
        lease = given or inst.lease
        stale = given is not None
        assert calls is not None and lease is not None
        tree = inst.tree
        epoch = lease.lease_epoch
        if inst.claimed is not None:
            ref = inst.claimed
            completed = inst.sent != "refused"
            whose = "its"
        else:
            view = inst.view
            assert isinstance(view, tuple)
            ref = AttemptRef(OutboundCallStatus.PENDING, view[1], view[2])
            completed = True
            whose = f"{self.owner_text(view[2])}'s"
        key = self.key_of(tree, epoch, lease.holder_instance_id)
        verb = "complete" if completed else "fail"
        text = (
            f"{inst.name} {verb} {whose} attempt {ref.attempt}, at {tree.name} {epoch}"
            f"{self._with(lease, stale)}"
            if log is not None
            else ""
        )
        try:
            if completed:
                ended = await calls.mark_completed(key, ref, {"charged": True})
            else:
                ended = await calls.mark_failed(key, ref, {"refused": True})
        except ExecutionFencedError as exc:
            self.outcome = f"end: refused ({exc.reason})"
            if log is not None:
                self._said(log, text, f"refused ({exc.reason})")
            if not stale:
                self._lost(inst)
            return
        except Exception as exc:
            raise self._error(inst, f"{verb} attempt {ref.attempt}", exc) from exc
        if log is not None:
            self._said(
                log,
                text,
                ("completed" if completed else "failed") if ended else "lost (the row moved)",
            )
        self.outcome = f"end: {'completed' if completed else 'failed'}" if ended else "end: lost"
        if whose != "its":
            self.outcome += " for another owner"
        inst.claimed = None
        inst.sent = None
        if not ended:
            inst.view = None
            inst.reconciled = None
            return
        if check:
            self._stale_write(inst, f"{verb} of attempt {ref.attempt}", epoch)
        new: View = (_COMPLETED if completed else _FAILED, ref.attempt, ref.attempt_owner)
        self.rows[self.identity_of(tree)] = new
        self._see(inst, new)

    # --- the child queue ------------------------------------------------------------

    def _queue(self, inst: Inst) -> ChildExecutionQueueRepository:
        queue = inst.stores.queue
        assert queue is not None
        return queue

    def _child_seen(self, inst: Inst, found: Any, how: str, check: bool) -> int | None:
        """The model's child of a claimed child `found`, its attempt checked: an attempt
        is given to one claimer."""
        index = self.child_index(found.child_execution_id)
        if index is None:
            if check:
                raise Broken(
                    ONE_LIVE_HOLDER,
                    f"{inst.name}'s {how} returned {found.child_execution_id!r}, a child this "
                    "schedule never queued",
                )
            return None
        inst.attempts.add((index, int(found.attempt)))
        return index

    async def _claim_child(self, inst: Inst, check: bool, log: list[str] | None) -> None:
        queue = self._queue(inst)
        try:
            found = await queue.claim(inst.name)
        except Exception as exc:
            raise self._error(inst, "claim a child", exc) from exc
        answer = (
            "none queued"
            if found is None
            else (f"{found.child_execution_id} attempt {found.attempt}")
        )
        self._said(log, f"{inst.name} claim a child", answer)
        self.outcome = "claim-child: none" if found is None else "claim-child: claimed"
        if found is None:
            return
        index = self._child_seen(inst, found, "claim", check)
        if index is None:
            return
        child = self.children[index]
        if check and (child.status is not ChildStatus.QUEUED or found.attempt != child.attempt + 1):
            raise Broken(
                ONE_LIVE_HOLDER,
                f"{inst.name} claimed {found.child_execution_id} at attempt {found.attempt} "
                f"while it was {child.status.value} at attempt {child.attempt}: a queued child "
                "is claimed once, at its next attempt",
            )
        child.status = ChildStatus.RUNNING
        child.attempt = int(found.attempt)

    async def _running(self, inst: Inst, log: list[str] | None) -> None:
        queue = self._queue(inst)
        try:
            rows = await queue.running(10)
        except Exception as exc:
            raise self._error(inst, "list the running children", exc) from exc
        seen = []
        for row in rows:
            index = self.child_index(row.child_execution_id)
            if index is not None:
                inst.attempts.add((index, int(row.attempt)))
                seen.append(f"{row.child_execution_id} attempt {row.attempt}")
        self.outcome = f"running: {len(seen)}"
        self._said(log, f"{inst.name} list the running children", ", ".join(seen) or "none")

    async def _restart(
        self, inst: Inst, index: int, attempt: int, check: bool, log: list[str] | None
    ) -> None:
        queue = self._queue(inst)
        name = self.child_id(index)
        try:
            found = await queue.restart(name, attempt)
        except Exception as exc:
            raise self._error(inst, f"restart {name} at attempt {attempt}", exc) from exc
        self._said(
            log,
            f"{inst.name} restart {name} at attempt {attempt}",
            "refused" if found is None else f"attempt {found.attempt}",
        )
        self.outcome = "restart: refused" if found is None else "restart: restarted"
        if found is None:
            return
        child = self.children[index]
        if check and (
            child.status is not ChildStatus.RUNNING
            or child.attempt != attempt
            or found.attempt != attempt + 1
        ):
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s restart of {name} at attempt {attempt} was accepted (attempt "
                f"{found.attempt}) while it was {child.status.value} at attempt "
                f"{child.attempt}: a restart compares the attempt",
            )
        self._child_seen(inst, found, "restart", check)
        child.attempt = int(found.attempt)

    async def _finish_child(
        self, inst: Inst, index: int, attempt: int, check: bool, log: list[str] | None
    ) -> None:
        queue = self._queue(inst)
        name = self.child_id(index)
        try:
            result = await queue.finish(name, {"by": inst.name}, attempt=attempt)
        except Exception as exc:
            raise self._error(inst, f"finish {name} at attempt {attempt}", exc) from exc
        finished, remaining = bool(result.finished), int(result.remaining)
        self._said(
            log,
            f"{inst.name} finish {name} at attempt {attempt}",
            f"finished, {remaining} left" if finished else f"refused, {remaining} left",
        )
        child = self.children[index]
        replay = child.status is ChildStatus.FINISHED and child.finished_attempt == attempt
        self.outcome = (
            "finish-child: refused"
            if not finished
            else "finish-child: replayed"
            if replay
            else f"finish-child: finished, {'none' if remaining == 0 else 'some'} left"
        )
        if not finished:
            return
        if replay:
            if check and remaining != child.remaining:
                raise Broken(
                    ONE_EFFECT_PER_KEY,
                    f"{inst.name}'s retry of the finish of {name} at attempt {attempt} "
                    f"answered {remaining} left where the finish answered {child.remaining}: "
                    "a retried finish answers what it answered",
                )
            return
        if check and (child.status is not ChildStatus.RUNNING or child.attempt != attempt):
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s finish of {name} at attempt {attempt} was accepted while it "
                f"was {child.status.value} at attempt {child.attempt}: a finish compares the "
                "attempt",
            )
        child.status = ChildStatus.FINISHED
        child.finished_attempt = attempt
        child.remaining = remaining
        left = sum(1 for c in self.children if c.status is not ChildStatus.FINISHED)
        if check and remaining != left:
            raise Broken(
                ONE_EFFECT_PER_KEY,
                f"{inst.name}'s finish of {name} at attempt {attempt} answered {remaining} "
                f"left where {left} of the parent's children are unfinished: exactly one "
                "finisher of the last child wakes the parent",
            )
        if remaining == 0:
            if check and self.woken_by:
                raise Broken(
                    ONE_EFFECT_PER_KEY,
                    f"{inst.name}'s finish of {name} at attempt {attempt} answered none left "
                    f"after {self.woken_by} had: the parent is woken twice",
                )
            self.woken_by = f"{inst.name}'s finish of {name} at attempt {attempt}"


__all__ = [
    "ABSENT",
    "ACQUIRE",
    "BUSINESS_KEY",
    "BUSINESS_KEY_WORLD",
    "CHILD_QUEUE_WORLD",
    "TAKEOVER_WORLD",
    "CLAIM_CHILD",
    "FINISH_CHILD",
    "RESTART",
    "RUNNING",
    "CLAIM",
    "EFFECT",
    "END",
    "FENCED_EFFECT_WORLD",
    "FINISH",
    "HANDOVER_WORLD",
    "INVARIANTS",
    "LEASE_MS",
    "LEASE_STATE_OF",
    "LEASE_WORLD",
    "NO_STALE_WRITE",
    "NO_TAKEOVER_OF_FINISHED_WORK",
    "ONE_EFFECT_PER_KEY",
    "ONE_LIVE_HOLDER",
    "ONE_SEND_PER_BUSINESS_KEY",
    "READ",
    "RECLAIM",
    "RECONCILE",
    "RECORD",
    "RELEASE",
    "RENEW",
    "SEND",
    "SEND_REFUSED",
    "SKEWS",
    "START_MS",
    "STORE_ERROR",
    "TIME",
    "WAIT_1MS",
    "WAIT_EXPIRY",
    "WAIT_HALF",
    "WORLDS",
    "YIELD",
    "Action",
    "Broken",
    "InstanceStores",
    "Sim",
    "World",
]
