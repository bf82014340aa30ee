"""Contract suite of `ExecutionLeaseRepository` (docs/contracts.md): one owner at a time.

Every case runs on the case's virtual store time with two (or three) instances on one
backing store. A lease is live while `expires_at > now` and only then: the boundary
cases pin 1 ms before, exactly at and 1 ms after expiry for acquire, renew, yield and
reclaim. Epochs are never granted twice, a finished lease never again, a renewal never
shortens, a zombie moves nothing, `taken_over_from` tells a takeover from a hand-over,
and the races (two takes, finish or release against a take) run round after round in
both orders. The other instance's own clock is skewed by +-lease/2, +-lease and
+-10 x lease in "the store's time is the authority" cases, with unchanged outcomes.
"""

from __future__ import annotations

from agboss_sql.testing._case import Case
from agboss_sql.testing.contracts._execution_lease_boundaries import (
    _acquire_at,
    _reclaim_at,
    _renew_at,
    _store_time,
    _yield_at,
    database_time_decides,
)
from agboss_sql.testing.contracts._execution_lease_grants import (
    acquire_grants_epoch_one,
    handed_back_leases_checked,
    invalid_identifiers_refused,
    live_lease_refused_to_everyone,
    long_identifiers_round_trip,
    other_tenant_is_another_lease,
    renewal_answers_its_own_lease,
    renewal_extends_from_now,
    renewal_never_shortens,
)
from agboss_sql.testing.contracts._execution_lease_moves import (
    epochs_grow_by_one,
    execution_ids_once_across_tenants,
    finished_never_granted_again,
    lease_ms_is_a_positive_whole_number,
    only_the_holder_moves_its_lease,
    reclaim_needs_a_yielded_lease,
    released_lease_moves_nothing,
    taken_over_from_names_takeovers,
    yielded_lease_moves,
    zombie_moves_nothing,
)
from agboss_sql.testing.contracts._execution_lease_races import (
    concurrent_takeovers_of_an_expired_lease,
    concurrent_takes_of_a_new_lease,
    finish_against_take_past_the_lease,
    release_against_take,
)
from agboss_sql.testing.contracts._execution_lease_support import CaseRun
from agboss_sql.testing.contracts._fencing import BOUNDARIES, SKEWS, skew_text
from agboss_sql.testing.contracts._limits import limit_cases
from agboss_sql.testing.contracts._matrix import move_cases

CONTRACT = "execution_lease"


def cases() -> list[Case]:
    """The lease cases (the lease store has no opt-out: none is marked fencing)."""
    named: list[tuple[str, CaseRun]] = [
        ("acquire grants epoch 1 of a new lease", acquire_grants_epoch_one),
        (
            "a live lease is refused to every instance, its holder included",
            live_lease_refused_to_everyone,
        ),
        ("the same execution in another tenant is another lease", other_tenant_is_another_lease),
        ("255-character identifiers round-trip", long_identifiers_round_trip),
        ("invalid identifiers are refused", invalid_identifiers_refused),
        (
            "a lease handed back that is not one is refused before anything moves",
            handed_back_leases_checked,
        ),
    ]
    for offset, label in BOUNDARIES:
        outcome = "is refused" if offset < 0 else "takes the lease over"
        named.append((f"acquire {label} expiry {outcome}", _acquire_at(offset, label)))
    for offset, label in BOUNDARIES:
        outcome = "renews" if offset < 0 else "is refused"
        named.append((f"renew {label} expiry {outcome}", _renew_at(offset, label)))
    for offset, label in BOUNDARIES:
        outcome = "yields" if offset < 0 else "is refused"
        named.append((f"yield {label} expiry {outcome}", _yield_at(offset, label)))
    for offset, label in BOUNDARIES:
        outcome = "takes the next epoch" if offset < 0 else "is refused"
        named.append((f"reclaim {label} expiry {outcome}", _reclaim_at(offset, label)))
    named += [
        ("a renewal never shortens", renewal_never_shortens),
        ("a renewal answers its own lease's time left", renewal_answers_its_own_lease),
        ("a renewal extends from now, not from the old expiry", renewal_extends_from_now),
        ("epochs grow by one and are never granted twice", epochs_grow_by_one),
        ("a finished lease is never granted again", finished_never_granted_again),
        ("a zombie renews, yields, reclaims, releases and finishes nothing", zombie_moves_nothing),
        ("a released lease moves no more", released_lease_moves_nothing),
        ("a yielded lease is taken by another, not reclaimed", yielded_lease_moves),
        (
            "only the holder moves its lease, and a lease never granted moves nothing",
            only_the_holder_moves_its_lease,
        ),
        ("reclaim needs a lease its holder yielded and still holds", reclaim_needs_a_yielded_lease),
        (
            "lease_ms is a positive whole number of milliseconds",
            lease_ms_is_a_positive_whole_number,
        ),
        ("taken_over_from names a takeover, also from itself", taken_over_from_names_takeovers),
        (
            "save_execution_id_if_absent inserts an id once across tenants",
            execution_ids_once_across_tenants,
        ),
        ("race: three takes of a new lease give one holder", concurrent_takes_of_a_new_lease),
        (
            "race: three takeovers of an expired lease give one holder",
            concurrent_takeovers_of_an_expired_lease,
        ),
        ("race: finish against a take past the lease", finish_against_take_past_the_lease),
        ("race: release against a take", release_against_take),
    ]
    for skew in SKEWS:
        named.append(
            (
                f"the store's time is the authority with the other clock {skew_text(skew)}",
                _store_time(skew),
            )
        )
    named.append(("database time decides, whatever the instances' clocks", database_time_decides))
    return [Case(CONTRACT, name, run) for name, run in named] + move_cases() + limit_cases(CONTRACT)


__all__ = ["CONTRACT", "cases"]
