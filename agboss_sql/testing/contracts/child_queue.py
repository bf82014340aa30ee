"""Contract suite of `ChildExecutionQueueRepository` (docs/contracts.md): children on any instance.

A child is claimed once (deepest first, then oldest), restarted by compare-and-set on
the attempt it was read at, finished once — only by its current attempt when one is
given, a retry of one attempt's finish answering as the first — and exactly one
finisher of a parent's children sees none left; the parent's wake it owes is claimed by
one claimer (compare-and-set, with a claim that runs out) and marked done once. A child
whose own children run waits (`wait_for_children`): neither claimed nor rescued while it
waits, and made claimable again by the finish of its last child in the same step, so a
wait raced against that finish never loses the wake. A batch (`enqueue_many`, `claim_many`,
`finish_many`) keeps every one of these per child. Every case runs two instances on one
backing store; the races go through both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._child_queue_batches import (
    answers_each_batch_claimed_child_as_it_was_queued,
    claims_a_batch_in_claim_order_each_at_its_own_attempt,
    never_gives_one_child_to_two_concurrent_batch_claimers,
    queues_a_batch_once_skipping_ids_already_queued,
    queues_and_counts_each_id_once_among_concurrent_batches,
)
from agboss_sql.testing.contracts._child_queue_claims import (
    claims_deepest_first_then_oldest,
    claims_every_queued_child_when_claimers_outnumber_them,
    claims_nothing_from_an_empty_queue,
    marks_a_claimed_child_running_for_its_claimer,
    never_gives_one_child_to_two_concurrent_claimers,
    queues_a_child_id_once,
    refuses_concurrent_duplicate_enqueues_but_one,
)
from agboss_sql.testing.contracts._child_queue_finish_many import (
    finishes_a_batch_each_at_its_own_attempt,
    keeps_tenants_apart_in_a_batch,
    lowers_each_parents_count_by_its_own_finishes_in_a_batch,
    queues_a_waiting_parent_again_from_a_batch,
    wakes_the_parent_exactly_once_among_concurrent_batch_finishers,
)
from agboss_sql.testing.contracts._child_queue_finishes import (
    answers_a_retried_finish_of_one_attempt_as_the_first,
    counts_only_its_tenants_siblings,
    counts_unfinished_siblings_only_of_the_parent,
    finishes_a_running_child_once,
    ignores_a_superseded_attempts_late_finish,
    lets_one_of_concurrent_restarts_of_one_attempt_win,
    lets_only_the_current_attempt_win_a_finish_race,
    restarts_a_running_child_by_compare_and_set,
    wakes_the_parent_exactly_once_among_concurrent_finishers,
)
from agboss_sql.testing.contracts._child_queue_more import more_cases
from agboss_sql.testing.contracts._child_queue_support import CONTRACT
from agboss_sql.testing.contracts._child_queue_waits import (
    never_loses_the_wake_of_a_wait_raced_by_the_last_finish,
    refuses_a_wait_not_of_the_running_attempt,
    waits_for_its_children_unclaimed_and_unrescued_until_the_last_finishes,
)
from agboss_sql.testing.contracts._child_queue_wakes import (
    claims_and_marks_the_parents_wake_once,
    hands_a_run_out_wake_claim_to_another_claimer,
    lets_one_of_concurrent_wake_claimers_win,
    lists_a_parents_children_per_tenant,
    lists_children_in_queue_order_and_running_ones_oldest_first,
    lists_owed_wakes_oldest_finish_first,
    marks_only_its_own_childs_wake,
)
from agboss_sql.testing.contracts._limits import limit_cases
from agboss_sql.testing.contracts._matrix import attempt_cases

CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("lists a parent's children per tenant", lists_a_parents_children_per_tenant),
    ("counts only its tenant's siblings", counts_only_its_tenants_siblings),
    ("claims nothing from an empty queue", claims_nothing_from_an_empty_queue),
    ("claims deepest first, then oldest", claims_deepest_first_then_oldest),
    (
        "marks a claimed child running for its claimer",
        marks_a_claimed_child_running_for_its_claimer,
    ),
    ("queues a child id once", queues_a_child_id_once),
    (
        "refuses concurrent duplicate enqueues but one",
        refuses_concurrent_duplicate_enqueues_but_one,
    ),
    (
        "never gives one child to two concurrent claimers",
        never_gives_one_child_to_two_concurrent_claimers,
    ),
    (
        "claims every queued child when claimers outnumber them",
        claims_every_queued_child_when_claimers_outnumber_them,
    ),
    (
        "restarts a running child by compare-and-set on its attempt",
        restarts_a_running_child_by_compare_and_set,
    ),
    (
        "lets one of concurrent restarts of one attempt win",
        lets_one_of_concurrent_restarts_of_one_attempt_win,
    ),
    ("finishes a running child once", finishes_a_running_child_once),
    (
        "wakes the parent exactly once among concurrent finishers",
        wakes_the_parent_exactly_once_among_concurrent_finishers,
    ),
    (
        "counts unfinished siblings only of the parent",
        counts_unfinished_siblings_only_of_the_parent,
    ),
    ("ignores a superseded attempt's late finish", ignores_a_superseded_attempts_late_finish),
    (
        "lets only the current attempt win a finish race",
        lets_only_the_current_attempt_win_a_finish_race,
    ),
    (
        "lists children in queue order and running ones oldest first",
        lists_children_in_queue_order_and_running_ones_oldest_first,
    ),
    (
        "answers a retried finish of one attempt as the first",
        answers_a_retried_finish_of_one_attempt_as_the_first,
    ),
    ("claims and marks the parent's wake once", claims_and_marks_the_parents_wake_once),
    ("lists owed wakes oldest finish first", lists_owed_wakes_oldest_finish_first),
    ("marks only its own child's wake", marks_only_its_own_childs_wake),
    (
        "hands a run-out wake claim to another claimer",
        hands_a_run_out_wake_claim_to_another_claimer,
    ),
    ("lets one of concurrent wake claimers win", lets_one_of_concurrent_wake_claimers_win),
    (
        "waits for its children unclaimed and unrescued until the last one finishes",
        waits_for_its_children_unclaimed_and_unrescued_until_the_last_finishes,
    ),
    ("refuses a wait not of the running attempt", refuses_a_wait_not_of_the_running_attempt),
    (
        "never loses the wake of a wait raced by the last finish",
        never_loses_the_wake_of_a_wait_raced_by_the_last_finish,
    ),
    (
        "queues a batch once, skipping ids already queued",
        queues_a_batch_once_skipping_ids_already_queued,
    ),
    (
        "claims a batch in claim order, each at its own attempt",
        claims_a_batch_in_claim_order_each_at_its_own_attempt,
    ),
    (
        "answers each batch-claimed child as it was queued",
        answers_each_batch_claimed_child_as_it_was_queued,
    ),
    (
        "never gives one child to two concurrent batch claimers",
        never_gives_one_child_to_two_concurrent_batch_claimers,
    ),
    (
        "queues and counts each id once among concurrent batches",
        queues_and_counts_each_id_once_among_concurrent_batches,
    ),
    (
        "finishes a batch, each at its own attempt",
        finishes_a_batch_each_at_its_own_attempt,
    ),
    (
        "wakes the parent exactly once among concurrent batch finishers",
        wakes_the_parent_exactly_once_among_concurrent_batch_finishers,
    ),
    (
        "queues a waiting parent again from a batch",
        queues_a_waiting_parent_again_from_a_batch,
    ),
    ("keeps tenants apart in a batch", keeps_tenants_apart_in_a_batch),
    (
        "lowers each parent's count by its own finishes in a batch",
        lowers_each_parents_count_by_its_own_finishes_in_a_batch,
    ),
]


def cases() -> list[Case]:
    """The child queue's cases (none is a fencing case: the queue is not fenced)."""
    return (
        [Case(CONTRACT, name, run) for name, run in CASES]
        + more_cases()
        + attempt_cases()
        + limit_cases(CONTRACT)
    )


__all__ = ["CONTRACT", "cases"]
