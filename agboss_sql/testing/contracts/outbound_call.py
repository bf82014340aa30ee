"""Contract suite of `OutboundCallRepository` (docs/contracts.md): one send per key.

An intent is recorded once per key and moved by compare-and-set on the attempt the
caller read; every fenced method checks the lease and the scope's mark in the step that
reads or writes the intent, and `lease_state_of` closes an expired lease in the step
that reads it. The cases marked fencing (skipped, with a note, for a store that opts out
of the lease check) are those only an atomic lease check passes: a stale or expired
lease refused 1 ms before / at / after expiry, the zombie's record and claim racing its
lease's hand-over, `lease_state_of` racing a late renewal, a take and a finish, and the
store's time deciding whatever the caller's own clock says.
"""

from __future__ import annotations

from agboss_sql.testing._case import Case
from agboss_sql.testing.contracts._fencing import BOUNDARIES, SKEWS, skew_text
from agboss_sql.testing.contracts._matrix import write_cases
from agboss_sql.testing.contracts._outbound_call_intents import (
    business_key_shared_across_executions,
    claims_attempts_by_compare_and_set,
    ends_only_the_current_attempt,
    invalid_keys_refused_first,
    moves_only_its_own_call,
    records_pending_intent_once,
    unreplayable_keys_refused_first,
)
from agboss_sql.testing.contracts._outbound_call_lease_check import (
    _lease_state_at,
    _record_at,
    _store_time,
    attempts_refused_at_expiry,
    database_time_decides,
    lease_states,
    zombie_moves_no_call,
)
from agboss_sql.testing.contracts._outbound_call_races import (
    lease_state_against_finish,
    lease_state_against_late_renewal,
    lease_state_against_take,
    two_attempts_of_one_intent,
    two_executions_record_one_business_key,
    zombie_record_and_claim_race_hand_over,
)
from agboss_sql.testing.contracts._outbound_call_support import CaseRun

CONTRACT = "outbound_call"


def cases() -> list[Case]:
    """The outbound call's cases; those only an atomic lease check passes are fencing."""
    named: list[tuple[str, CaseRun, bool]] = [
        (
            "save_if_absent records the pending intent exactly, once",
            records_pending_intent_once,
            False,
        ),
        (
            "mark_pending claims the next attempt by compare-and-set",
            claims_attempts_by_compare_and_set,
            False,
        ),
        (
            "mark_completed and mark_failed end only the current attempt",
            ends_only_the_current_attempt,
            False,
        ),
        ("a claim or an end moves its own call only", moves_only_its_own_call, False),
        (
            "a business key is one intent across executions",
            business_key_shared_across_executions,
            False,
        ),
        (
            "invalid names and business keys are refused before anything is written",
            invalid_keys_refused_first,
            False,
        ),
        (
            "keys, times and owners no later read could give back are refused first",
            unreplayable_keys_refused_first,
            False,
        ),
        ("lease_state_of answers each state", lease_states, False),
    ]
    for offset, label in BOUNDARIES:
        outcome = "is live" if offset < 0 else "closes the lease as superseded"
        named.append(
            (f"lease_state_of {label} expiry {outcome}", _lease_state_at(offset, label), False)
        )
    for offset, label in BOUNDARIES:
        outcome = "is accepted" if offset < 0 else "is refused"
        named.append(
            (f"recording an intent {label} expiry {outcome}", _record_at(offset, label), True)
        )
    named += [
        ("claiming and ending an attempt at expiry are refused", attempts_refused_at_expiry, True),
        ("a zombie records, claims and ends nothing", zombie_moves_no_call, True),
        ("race: lease_state_of against a late renewal", lease_state_against_late_renewal, True),
        ("race: lease_state_of against a take", lease_state_against_take, True),
        ("race: lease_state_of against a finish", lease_state_against_finish, True),
        (
            "race: a zombie's record and claim against its lease's hand-over",
            zombie_record_and_claim_race_hand_over,
            True,
        ),
        ("race: two attempts of one intent", two_attempts_of_one_intent, False),
        (
            "race: two executions recording one business key",
            two_executions_record_one_business_key,
            False,
        ),
    ]
    for skew in SKEWS:
        named.append(
            (
                f"the store's time is the authority with the caller's clock {skew_text(skew)}",
                _store_time(skew),
                True,
            )
        )
    named.append(
        ("database time decides, whatever the caller's clock", database_time_decides, True)
    )
    return [
        Case(CONTRACT, name, run, fencing=fencing) for name, run, fencing in named
    ] + write_cases(CONTRACT)


__all__ = ["CONTRACT", "cases"]
