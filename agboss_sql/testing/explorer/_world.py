"""The explorer's worlds and their vocabulary: the invariants, the steps an instance may
make, the timings, and the six worlds by id."""

from __future__ import annotations

from dataclasses import dataclass

from agboss_sql.contracts.types import OutboundCallStatus

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
CLAIM_CHILDREN = "claim-children"
"""A batch claim (`claim_many`); the parameter is how many children it asks for."""
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
