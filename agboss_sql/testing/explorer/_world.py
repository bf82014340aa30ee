"""The explorer's worlds and their vocabulary: the invariants, the steps an instance may
make, the timings, and the ten worlds by id."""

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
CLOSED_EPOCH_NEVER_MOVES = "closed-epoch-never-moves"
PAUSE_ANSWERED_ONCE = "pause-answered-once"
SPEND_WITHIN_BUDGET = "spend-within-budget"
PARENT_WOKEN_ONCE = "parent-woken-once"

INVARIANTS = (
    ONE_LIVE_HOLDER,
    NO_STALE_WRITE,
    ONE_EFFECT_PER_KEY,
    ONE_SEND_PER_BUSINESS_KEY,
    NO_TAKEOVER_OF_FINISHED_WORK,
    STORE_ERROR,
    CLOSED_EPOCH_NEVER_MOVES,
    PAUSE_ANSWERED_ONCE,
    SPEND_WITHIN_BUDGET,
    PARENT_WOKEN_ONCE,
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
FINISH_CHILDREN = "finish-children"
"""A batch finish (`finish_many`) made by the instances after the first: the parameter
(`child * 1000 + attempt`) is its first entry; then every other child the instance saw, at
the latest attempt it saw, and in the child-queue world the other tenant's child."""
ATTEMPTS = 1000
# The deep tree's steps (the parameter of a wait is `child * 1000 + attempt`; of a wake's
# claim and mark, the child that owes the wake).
WAIT_CHILDREN = "wait-for-children"
UNWOKEN = "unwoken"
CLAIM_WAKE = "claim-wake"
MARK_WOKEN = "mark-woken"
# The pauses' steps: the parameter is the tenant (0 or 1).
RESOLVE = "resolve"
TAKE = "take"
CANCEL = "cancel"
GET = "get"
# The cost ledger's steps: the parameter of a reservation is its amount in micros, of a
# record its tenant (0 or 1).
RESERVE = "reserve"
RESERVE_TOGETHER = "reserve-together"
"""Every instance reserves at once (sent together): the parameter as a reservation's."""
RECORD_COST = "record-cost"
TOTAL = "total"
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
    deep: bool = False
    """The child-queue world's tree is two levels deep: a child waits for its own children."""
    batch_finish: bool = False
    """The instances after the first finish children in batches (`finish_many`), the first
    one at a time."""
    store: str = ""
    """For a world of a store that is no fencing store (`paused_execution`, `cost_ledger`):
    that store, and no lease."""
    tokens: bool = False
    """`lease_state_of` is asked at every token (each granted one and the next), not only the
    latest, and an epoch it closed is watched (`closed-epoch-never-moves`)."""
    invariant: str = ""
    """The invariant the world adds to the ones every world checks, as printed in docs."""
    shallower: int = 0
    """How many levels less than the asked depth `register` searches this world (its
    states grow faster per level than the others')."""
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
    batch_finish=True,
    needs=("child_queue",),
)
"""A parent's two children in the child queue, and another tenant's child under a parent of
the same id, claimed by instance-1 in the set-up. The first instance claims and finishes
one child at a time, the others in batches; any instance lists the running children and
restarts (rescues) or finishes with any attempt it saw. A batch finish mixes live,
superseded, already finished and the other tenant's entries, and may be sent again: each
entry answers what one finish after another would, a superseded one changes nothing, no
child is finished twice, exactly one finish of the parent's last child answers none left,
and each tenant's parent is counted apart."""

LEASE_CLOSING_WORLD = World(
    "lease_closing",
    "lease-closing world",
    (ACQUIRE, RENEW, YIELD, RECLAIM, RELEASE, FINISH, LEASE_STATE_OF),
    needs=("execution_lease", "outbound_call"),
    fencing=("outbound_call",),
    tokens=True,
    invariant=CLOSED_EPOCH_NEVER_MOVES,
)
"""`lease_state_of` asked by any instance at every token (older epochs, the latest, one
never granted) between the holder's own moves and its moves out of turn: once it answered
an epoch is over (superseded, released, finished), that epoch is never live again and no
renew, yield, reclaim, release or finish at it is accepted; each answer is the contract's
for the lease as the store's answers built it."""

CHILD_TREE_WORLD = World(
    "child_tree",
    "child-tree world",
    (),
    queue=True,
    deep=True,
    batch_finish=True,
    needs=("child_queue",),
    invariant=PARENT_WOKEN_ONCE,
    shallower=3,
)
"""A tree two levels deep in the child queue: the root's children child-1 and child-2,
and child-1's own children child-3 and child-4. Every schedule starts with child-1 claimed
(attempt 1), its children queued and child-1 waiting for them. Instances claim and finish
(the first one at a time, the others in batches), list the running children, restart
(rescue) with any attempt they saw, ask `wait_for_children` at any attempt of child-1 they
saw, and wake the parent a finish owes its wake to (`unwoken`, `claim_wake`, `mark_woken`,
with time passing the wake's claim). A parent is woken exactly once per wait, and only
when the last child it waits for is done: child-1 is claimable again only after both its
children finished, and then claimed by one claimer; exactly one finish of a parent's last
child (alone or in a batch) answers none left; a wake is marked done by one claimer."""

PAUSE_WORLD = World(
    "pause",
    "pause world",
    (),
    store="paused_execution",
    needs=("paused_execution",),
    invariant=PAUSE_ANSWERED_ONCE,
)
"""One pause id pending in each of two tenants; instances resolve, take (as themselves),
cancel and read either tenant's pause in any order. A pause is answered once: resolved
only while pending, taken by one taker (its retry answers True again, anyone else False),
cancelled only while pending, each answer the contract's, and nothing done to one
tenant's pause moves the other's."""

COST_LEDGER_WORLD = World(
    "cost_ledger",
    "cost-ledger world",
    (),
    store="cost_ledger",
    needs=("cost_ledger",),
    invariant=SPEND_WITHIN_BUDGET,
)
"""Reservations of 50 and 30 micros against a limit of 100 on one execution's budget in
each of two tenants (the same execution id), and an entry of 30 micros recorded (and
replayed) in each, by any instance in any order; and every instance reserving 50 at once
(sent together, each on its own store: the store serialises them). A reservation is granted exactly when
the budget's total (entries and reservations) stays within the limit, an entry counts
once per tenant, and a total read is the contract's sum: spend never goes above budget."""

WORLDS: dict[str, World] = {
    world.ident: world
    for world in (
        LEASE_WORLD,
        FENCED_EFFECT_WORLD,
        HANDOVER_WORLD,
        BUSINESS_KEY_WORLD,
        TAKEOVER_WORLD,
        CHILD_QUEUE_WORLD,
        LEASE_CLOSING_WORLD,
        CHILD_TREE_WORLD,
        PAUSE_WORLD,
        COST_LEDGER_WORLD,
    )
}
"""The ten worlds by id: the lease; the step's fenced effect; an outbound call handed
over on one tree; an outbound call under one business key from two trees; takeovers of a
tree whose claimed attempt is pending while the other tree under the business key
reconciles it; a parent's two children in the child queue (claim, restart, finish races,
the last child's wake); `lease_state_of`'s closing decisions at every token between the
holder's moves; a tree two levels deep in the child queue; pauses in two tenants; the
cost ledger's reservations."""

CHILDREN = 2
"""How many children the child-queue world queues under its parent."""

OTHER_TENANT_CHILD = "child-b"
"""The child-queue world's child of the other tenant (`<tenant>-b`), under a parent of the
same id as the world's own children's: claimed at attempt 1 in the set-up, finished by the
first batch finish that names it."""

TREE = ((-1, 1), (-1, 1), (0, 2), (0, 2))
"""The child-tree world's children, by index: (parent's index, -1 for the root; depth)."""

BUDGET_MICROS = 100
"""The cost-ledger world's limit on each tenant's execution budget."""
RESERVATIONS = (50, 30)
"""The amounts the cost-ledger world reserves."""
ENTRY_MICROS = 30
"""The cost of the entry the cost-ledger world records."""
WAKE_CLAIM_MS = LEASE_MS
"""How long a wake's claim lasts in the child-tree world."""
