"""Both orders of every two-outcome race, each checked against the contract's outcome.

A race is a set-up, two sides (each one or more steps), and what the contract
answers to each step when the first side goes first and when the second does.
The explorer sends one operation at a time, so "first" is exactly the order the
store sees. Every step is also checked against the invariants, as in a search.
"""

from __future__ import annotations

from dataclasses import dataclass

from agboss_sql.contracts.types import LeaseState
from agboss_sql.testing.explorer._world import (
    ACQUIRE,
    ATTEMPTS,
    CANCEL,
    CLAIM,
    CLAIM_CHILD,
    CLAIM_CHILDREN,
    CLOSED_EPOCH_NEVER_MOVES,
    EFFECT,
    END,
    FINISH,
    FINISH_CHILD,
    LEASE_MS,
    LEASE_STATE_OF,
    NO_STALE_WRITE,
    NO_TAKEOVER_OF_FINISHED_WORK,
    ONE_EFFECT_PER_KEY,
    ONE_LIVE_HOLDER,
    ONE_SEND_PER_BUSINESS_KEY,
    PARENT_WOKEN_ONCE,
    PAUSE_ANSWERED_ONCE,
    READ,
    RECONCILE,
    RECORD,
    RECORD_COST,
    RELEASE,
    RENEW,
    RESERVE,
    RESERVE_TOGETHER,
    RESOLVE,
    RESTART,
    RUNNING,
    SPEND_WITHIN_BUDGET,
    STALE,
    TAKE,
    TIME,
    WAIT_EXPIRY,
    Action,
)

RACE_OUTCOME = "race-outcome"
"""The rule a race breaks when a store refuses what the contract grants it (no safety
invariant is broken, but the store does not keep the contract)."""

REFUSED = "refused"

Expect = tuple[str | None, str]
"""What the contract answers to one step (`None`: anything), and the invariant a store
breaks by answering otherwise."""


def _any() -> Expect:
    return (None, RACE_OUTCOME)


def _is(answer: str, invariant: str = RACE_OUTCOME) -> Expect:
    return (answer, invariant)


FIRST = f"epoch 1, {LEASE_MS} ms left"
NEXT = f"epoch 2, {LEASE_MS} ms left"
TAKEOVER = f"epoch 2, {LEASE_MS} ms left, taken over from instance-1 at 1"


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a race: a label and its steps."""

    label: str
    steps: tuple[Action, ...]


@dataclass(frozen=True, slots=True)
class Race:
    """A two-outcome race of one world."""

    name: str
    world: str
    setup: tuple[tuple[Action, Expect], ...]
    first: Side
    second: Side
    first_first: tuple[Expect, ...]
    """The contract's answers when `first` goes first: its steps, `second`'s, `after`'s."""
    second_first: tuple[Expect, ...]
    """The contract's answers when `second` goes first: its steps, `first`'s, `after`'s."""
    after: tuple[Action, ...] = ()
    needs_lease_state_of: bool = False

    def orders(self) -> tuple[tuple[str, tuple[Action, ...], tuple[Expect, ...]], ...]:
        """Each order: its label, its steps after the set-up, and the contract's answers."""
        return (
            (
                f"{self.first.label} first",
                self.first.steps + self.second.steps + self.after,
                self.first_first,
            ),
            (
                f"{self.second.label} first",
                self.second.steps + self.first.steps + self.after,
                self.second_first,
            ),
        )


def matches(answer: str, expected: str | None) -> bool:
    """The store's answer is the contract's (a refusal of any reason matches "refused")."""
    if expected is None:
        return True
    return answer == expected or (expected == REFUSED and answer.startswith(REFUSED + " ("))


def _a(index: int, op: str, param: int = 0) -> Action:
    return (index, op, param)


_WAIT = _a(TIME, WAIT_EXPIRY)
_TAKEN_PAST_LEASE = ((_a(0, ACQUIRE), _is(FIRST)), (_WAIT, _any()))

RACES: tuple[Race, ...] = (
    # --- the lease ---
    Race(
        "finish vs a take past the lease",
        "lease",
        _TAKEN_PAST_LEASE,
        Side("finish", (_a(0, FINISH),)),
        Side("take", (_a(1, ACQUIRE),)),
        (_is("finished"), _is(REFUSED, NO_TAKEOVER_OF_FINISHED_WORK)),
        (_is(TAKEOVER), _is(REFUSED, NO_STALE_WRITE)),
    ),
    Race(
        "release vs a take past the lease",
        "lease",
        _TAKEN_PAST_LEASE,
        Side("release", (_a(0, RELEASE),)),
        Side("take", (_a(1, ACQUIRE),)),
        (_is("released"), _is(NEXT)),
        (_is(TAKEOVER), _is(REFUSED, NO_STALE_WRITE)),
    ),
    Race(
        "release vs a take of a live lease",
        "lease",
        ((_a(0, ACQUIRE), _is(FIRST)),),
        Side("release", (_a(0, RELEASE),)),
        Side("take", (_a(1, ACQUIRE),)),
        (_is("released"), _is(NEXT)),
        (_is(REFUSED, ONE_LIVE_HOLDER), _is("released")),
    ),
    Race(
        "lease_state_of vs a take past the lease",
        "lease",
        _TAKEN_PAST_LEASE,
        Side("lease_state_of", (_a(1, LEASE_STATE_OF, 1),)),
        Side("take", (_a(1, ACQUIRE),)),
        (_is(LeaseState.SUPERSEDED.value), _is(TAKEOVER)),
        (_is(TAKEOVER), _is(LeaseState.SUPERSEDED.value)),
        needs_lease_state_of=True,
    ),
    Race(
        "lease_state_of vs finish past the lease",
        "lease",
        _TAKEN_PAST_LEASE,
        Side("lease_state_of", (_a(1, LEASE_STATE_OF, 1),)),
        Side("finish", (_a(0, FINISH),)),
        (_is(LeaseState.SUPERSEDED.value), _is(REFUSED, NO_STALE_WRITE)),
        (_is("finished"), _is("finished")),
        needs_lease_state_of=True,
    ),
    Race(
        "lease_state_of vs a late renewal",
        "lease",
        _TAKEN_PAST_LEASE,
        Side("lease_state_of", (_a(1, LEASE_STATE_OF, 1),)),
        Side("renewal", (_a(0, RENEW),)),
        (_is(LeaseState.SUPERSEDED.value), _is("over", NO_STALE_WRITE)),
        (_is("over", NO_STALE_WRITE), _is(LeaseState.SUPERSEDED.value)),
        needs_lease_state_of=True,
    ),
    Race(
        "two takes past the lease",
        "lease",
        _TAKEN_PAST_LEASE,
        Side("instance-1's take", (_a(0, ACQUIRE),)),
        Side("instance-2's take", (_a(1, ACQUIRE),)),
        (_is(TAKEOVER), _is(REFUSED, ONE_LIVE_HOLDER)),
        (_is(TAKEOVER), _is(REFUSED, ONE_LIVE_HOLDER)),
    ),
    # --- the step's fenced effect ---
    Race(
        "a write vs its lease's hand-over",
        "fenced_effect",
        ((_a(0, ACQUIRE), _is(FIRST)),),
        Side("write", (_a(0, EFFECT),)),
        Side("hand-over", (_a(0, RELEASE), _a(1, ACQUIRE))),
        (_is("written"), _is("released"), _is(NEXT), _is("replayed")),
        (_is("released"), _is(NEXT), _is(REFUSED, NO_STALE_WRITE), _is("written")),
        after=(_a(1, EFFECT),),
    ),
    Race(
        "a zombie's write vs the takeover",
        "fenced_effect",
        _TAKEN_PAST_LEASE,
        Side("write", (_a(0, EFFECT),)),
        Side("takeover", (_a(1, ACQUIRE),)),
        (_is(REFUSED, NO_STALE_WRITE), _is(TAKEOVER), _is("written")),
        (_is(TAKEOVER), _is(REFUSED, NO_STALE_WRITE), _is("written")),
        after=(_a(1, EFFECT),),
    ),
    # --- an outbound call handed over on one tree ---
    Race(
        "a claim vs its lease's hand-over",
        "outbound_call_handover",
        (
            (_a(0, ACQUIRE), _is(FIRST)),
            (_a(0, RECORD), _is("created, pending attempt 0 of tree-1 at 1")),
        ),
        Side("claim", (_a(0, CLAIM),)),
        Side("hand-over", (_a(0, RELEASE), _a(1, ACQUIRE))),
        (_is("claimed attempt 1"), _is("released"), _is(NEXT)),
        (_is("released"), _is(NEXT), _is(REFUSED, NO_STALE_WRITE)),
    ),
    Race(
        "an ending vs a newer claim after a hand-over",
        "outbound_call_handover",
        (
            (_a(0, ACQUIRE), _is(FIRST)),
            (_a(0, RECORD), _is("created, pending attempt 0 of tree-1 at 1")),
            (_a(0, CLAIM), _is("claimed attempt 1")),
            (_WAIT, _any()),
            (_a(1, ACQUIRE), _is(TAKEOVER)),
            (_a(1, READ), _is("pending attempt 1 of tree-1 at 1")),
            (
                _a(1, RECONCILE),
                _is("lease_state_of tree-1 at 1: superseded; the other system never got it"),
            ),
        ),
        Side("ending", (_a(0, END),)),
        Side("newer claim", (_a(1, CLAIM),)),
        (_is(REFUSED, NO_STALE_WRITE), _is("claimed attempt 2")),
        (_is("claimed attempt 2"), _is(REFUSED, NO_STALE_WRITE)),
    ),
    # --- an outbound call under one business key from two trees ---
    Race(
        "two executions recording one business key",
        "outbound_call_business_key",
        ((_a(0, ACQUIRE), _is(FIRST)), (_a(1, ACQUIRE), _is(FIRST))),
        Side("tree-1's record", (_a(0, RECORD),)),
        Side("tree-2's record", (_a(1, RECORD),)),
        (
            _is("created, pending attempt 0 of tree-1 at 1"),
            _is("found, pending attempt 0 of tree-1 at 1", ONE_SEND_PER_BUSINESS_KEY),
        ),
        (
            _is("created, pending attempt 0 of tree-2 at 1"),
            _is("found, pending attempt 0 of tree-2 at 1", ONE_SEND_PER_BUSINESS_KEY),
        ),
    ),
    Race(
        "two claims of one attempt",
        "outbound_call_business_key",
        (
            (_a(0, ACQUIRE), _is(FIRST)),
            (_a(1, ACQUIRE), _is(FIRST)),
            (_a(0, RECORD), _is("created, pending attempt 0 of tree-1 at 1")),
            (_a(1, READ), _is("pending attempt 0 of tree-1 at 1")),
        ),
        Side("tree-1's claim", (_a(0, CLAIM),)),
        Side("tree-2's claim", (_a(1, CLAIM),)),
        (_is("claimed attempt 1"), _is("lost (the row moved)", ONE_SEND_PER_BUSINESS_KEY)),
        (_is("claimed attempt 1"), _is("lost (the row moved)", ONE_SEND_PER_BUSINESS_KEY)),
    ),
    Race(
        "an ending vs a newer claim",
        "outbound_call_business_key",
        (
            (_a(0, ACQUIRE), _is(FIRST)),
            (_a(1, ACQUIRE), _is(FIRST)),
            (_a(0, RECORD), _is("created, pending attempt 0 of tree-1 at 1")),
            (_a(0, CLAIM), _is("claimed attempt 1")),
            (_a(1, READ), _is("pending attempt 1 of tree-1 at 1")),
        ),
        Side("ending", (_a(0, END),)),
        Side("newer claim", (_a(1, CLAIM),)),
        (_is("completed"), _is("lost (the row moved)", ONE_SEND_PER_BUSINESS_KEY)),
        (_is("claimed attempt 2"), _is("lost (the row moved)", ONE_SEND_PER_BUSINESS_KEY)),
    ),
    # --- takeovers mixed with reconciliation under one business key ---
    Race(
        "a claim after a takeover vs the other tree's claim",
        "outbound_call_takeover",
        (
            (_a(1, READ), _is("pending attempt 1 of tree-1 at 1")),
            (
                _a(1, RECONCILE),
                _is("lease_state_of tree-1 at 1: superseded; the other system never got it"),
            ),
            (_a(0, ACQUIRE), _is(TAKEOVER)),
            (
                _a(0, RECONCILE),
                _is("lease_state_of tree-1 at 1: superseded; the other system never got it"),
            ),
        ),
        Side("tree-1's claim after its takeover", (_a(0, CLAIM),)),
        Side("tree-2's claim", (_a(1, CLAIM),)),
        (_is("claimed attempt 2"), _is("lost (the row moved)", ONE_SEND_PER_BUSINESS_KEY)),
        (_is("claimed attempt 2"), _is("lost (the row moved)", ONE_SEND_PER_BUSINESS_KEY)),
    ),
    Race(
        "the stopped claimer's mark vs the reconciler's claim",
        "outbound_call_takeover",
        (
            (_a(1, READ), _is("pending attempt 1 of tree-1 at 1")),
            (
                _a(1, RECONCILE),
                _is("lease_state_of tree-1 at 1: superseded; the other system never got it"),
            ),
        ),
        Side("the stopped claimer's mark", (_a(0, STALE + END, 1),)),
        Side("the reconciler's claim", (_a(1, CLAIM),)),
        (_is(REFUSED, NO_STALE_WRITE), _is("claimed attempt 2")),
        (_is("claimed attempt 2"), _is(REFUSED, NO_STALE_WRITE)),
    ),
    # --- a parent's children in the child queue ---
    Race(
        "a finish vs a restart of its attempt",
        "child_queue",
        (
            (_a(0, CLAIM_CHILD), _is("child-1 attempt 1")),
            (_a(1, RUNNING), _is("child-1 attempt 1")),
        ),
        Side("finish", (_a(0, FINISH_CHILD, 1),)),
        Side("restart", (_a(1, RESTART, 1),)),
        (_is("finished, 1 left"), _is(REFUSED, NO_STALE_WRITE)),
        (_is("attempt 2"), _is("refused, 2 left", NO_STALE_WRITE)),
    ),
    Race(
        "the finishes of a parent's last two children",
        "child_queue",
        (
            (_a(0, CLAIM_CHILD), _is("child-1 attempt 1")),
            (_a(1, CLAIM_CHILD), _is("child-2 attempt 1")),
        ),
        Side("child-1's finish", (_a(0, FINISH_CHILD, 1),)),
        Side("child-2's finish", (_a(1, FINISH_CHILD, ATTEMPTS + 1),)),
        (_is("finished, 1 left"), _is("finished, 0 left", ONE_EFFECT_PER_KEY)),
        (_is("finished, 1 left"), _is("finished, 0 left", ONE_EFFECT_PER_KEY)),
    ),
    # --- lease_state_of's closing decisions ---
    Race(
        "lease_state_of at an expired epoch vs its holder's release",
        "lease_closing",
        _TAKEN_PAST_LEASE,
        Side("lease_state_of", (_a(1, LEASE_STATE_OF, 1),)),
        Side("release", (_a(0, RELEASE),)),
        (
            _is(LeaseState.SUPERSEDED.value, CLOSED_EPOCH_NEVER_MOVES),
            _is(REFUSED, CLOSED_EPOCH_NEVER_MOVES),
        ),
        (_is("released"), _is(LeaseState.RELEASED.value, CLOSED_EPOCH_NEVER_MOVES)),
        needs_lease_state_of=True,
    ),
    Race(
        "lease_state_of at an expired epoch vs its holder's finish",
        "lease_closing",
        _TAKEN_PAST_LEASE,
        Side("lease_state_of", (_a(1, LEASE_STATE_OF, 1),)),
        Side("finish", (_a(0, FINISH),)),
        (
            _is(LeaseState.SUPERSEDED.value, CLOSED_EPOCH_NEVER_MOVES),
            _is(REFUSED, CLOSED_EPOCH_NEVER_MOVES),
        ),
        (_is("finished"), _is(LeaseState.FINISHED.value, CLOSED_EPOCH_NEVER_MOVES)),
        needs_lease_state_of=True,
    ),
    # --- a tree two levels deep in the child queue ---
    Race(
        "the finishes of a waiting child's last two children",
        "child_tree",
        ((_a(1, CLAIM_CHILDREN, 2), _is("child-3 attempt 1, child-4 attempt 1")),),
        Side("child-3's finish", (_a(0, FINISH_CHILD, 2 * ATTEMPTS + 1),)),
        Side("child-4's finish", (_a(1, FINISH_CHILD, 3 * ATTEMPTS + 1),)),
        (_is("finished, 1 left"), _is("finished, 0 left", PARENT_WOKEN_ONCE), _any()),
        (_is("finished, 1 left"), _is("finished, 0 left", PARENT_WOKEN_ONCE), _any()),
        after=(_a(0, CLAIM_CHILD),),
    ),
    # --- pauses ---
    Race(
        "two answers of one pause",
        "pause",
        (),
        Side("instance-1's answer", (_a(0, RESOLVE, 0),)),
        Side("instance-2's answer", (_a(1, RESOLVE, 0),)),
        (_is("resolved"), _is("not pending", PAUSE_ANSWERED_ONCE)),
        (_is("resolved"), _is("not pending", PAUSE_ANSWERED_ONCE)),
    ),
    Race(
        "an answer vs a cancel",
        "pause",
        (),
        Side("answer", (_a(0, RESOLVE, 1),)),
        Side("cancel", (_a(1, CANCEL, 1),)),
        (_is("resolved"), _is("False", PAUSE_ANSWERED_ONCE)),
        (_is("True"), _is("not pending", PAUSE_ANSWERED_ONCE)),
    ),
    Race(
        "two takes of one answer",
        "pause",
        ((_a(0, RESOLVE, 0), _is("resolved")),),
        Side("instance-1's take", (_a(0, TAKE, 0),)),
        Side("instance-2's take", (_a(1, TAKE, 0),)),
        (_is("True"), _is("False", PAUSE_ANSWERED_ONCE)),
        (_is("True"), _is("False", PAUSE_ANSWERED_ONCE)),
    ),
    # --- the cost ledger ---
    Race(
        "two reservations past the budget",
        "cost_ledger",
        ((_a(0, RECORD_COST, 0), _is("recorded")),),
        Side("instance-1's reservation", (_a(0, RESERVE, 50),)),
        Side("instance-2's reservation", (_a(1, RESERVE, 50),)),
        (_is("granted"), _is(REFUSED, SPEND_WITHIN_BUDGET)),
        (_is("granted"), _is(REFUSED, SPEND_WITHIN_BUDGET)),
    ),
    Race(
        "reservations at once vs a reservation",
        "cost_ledger",
        ((_a(0, RECORD_COST, 0), _is("recorded")),),
        Side("reservations at once", (_a(0, RESERVE_TOGETHER, 50),)),
        Side("instance-2's reservation", (_a(1, RESERVE, 30),)),
        (_is("1 granted", SPEND_WITHIN_BUDGET), _is(REFUSED, SPEND_WITHIN_BUDGET)),
        (_is("granted"), _is("0 granted", SPEND_WITHIN_BUDGET)),
    ),
)
"""Both orders of every two-outcome race: finish vs take past the lease, release vs take,
lease_state_of vs take and vs finish (and vs a late renewal), a write vs its lease's
hand-over, two claims of one attempt, an ending vs a newer claim, two executions recording
one business key, a claim vs its hand-over, a child's finish vs a restart of its attempt,
the finishes of a parent's last two children, a claim after a takeover vs the other tree's
claim, the stopped claimer's mark vs the reconciler's claim, lease_state_of at an expired
epoch vs its holder's release and finish, the finishes of a waiting child's last two
children, two answers of one pause, an answer vs a cancel, two takes of one answer, two
reservations past the budget."""


def races_of(world: str, *, lease_state_of: bool) -> list[Race]:
    """The races of `world` a set can run (`lease_state_of` needs the outbound-call store)."""
    return [
        race
        for race in RACES
        if race.world == world and (lease_state_of or not race.needs_lease_state_of)
    ]


__all__ = ["RACES", "RACE_OUTCOME", "Race", "Side", "matches", "races_of"]
