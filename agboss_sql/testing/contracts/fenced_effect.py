"""Contract suite of `FencedEffectRepository` (docs/contracts.md): one effect per key.

Writes and replays, the key's rules, business keys and rollback run for every store. The
cases marked fencing (skipped, with a note, for a store that opts out of the lease check)
are those only an atomic lease check passes: a stale, released, yielded, finished or
expired lease refused 1 ms before / at / after expiry, a zombie's write racing its lease's
hand-over, and the store's time deciding whatever the writer's own clock says.
"""

from __future__ import annotations

from agboss_sql.testing._case import Case
from agboss_sql.testing.contracts._fenced_effect_fencing import (
    _store_time,
    _write_at,
    database_time_decides,
    ended_leases_refused,
    holder_decided_before_lease_state,
    two_executions_one_business_key,
    two_instances_one_key,
    ungranted_tokens_refused,
    zombie_write_races_hand_over,
    zombie_write_refused,
)
from agboss_sql.testing.contracts._fenced_effect_reads import (
    read_answers_as_a_replay,
    read_fingerprint_conflict,
    read_in_own_tenant_only,
    read_nothing_after_raising_work,
    read_nothing_after_refused_write,
    read_of_nothing_stored,
    read_waits_for_no_write,
    zombie_read_answers_and_writes_nothing,
)
from agboss_sql.testing.contracts._fenced_effect_support import CaseRun
from agboss_sql.testing.contracts._fenced_effect_writes import (
    business_key_replays_with_replayed_from,
    fingerprint_conflict,
    first_write_runs_once,
    invalid_business_keys_refused_first,
    invalid_names_refused_first,
    kept_transaction_ends_with_the_effect,
    raising_work_leaves_nothing,
    replay_returns_stored_result,
    result_json_refuses_leaves_nothing,
    separate_keys_separate_effects,
    unreplayable_keys_refused_first,
)
from agboss_sql.testing.contracts._fencing import BOUNDARIES, SKEWS, skew_text
from agboss_sql.testing.contracts._limits import limit_cases
from agboss_sql.testing.contracts._matrix import write_cases

CONTRACT = "fenced_effect"


def cases() -> list[Case]:
    """The fenced effect's cases; those only an atomic lease check passes are fencing."""
    named: list[tuple[str, CaseRun, bool]] = [
        (
            "the first write runs its work once and commits its business row",
            first_write_runs_once,
            False,
        ),
        (
            "a replay returns the stored result without running the work",
            replay_returns_stored_result,
            False,
        ),
        (
            "a business key from another execution replays naming its step",
            business_key_replays_with_replayed_from,
            False,
        ),
        (
            "another fingerprint under a business key is IdempotencyKeyConflictError",
            fingerprint_conflict,
            False,
        ),
        (
            "separate steps, names, executions and tenants are separate effects",
            separate_keys_separate_effects,
            False,
        ),
        (
            "invalid effect names are refused before anything is written",
            invalid_names_refused_first,
            False,
        ),
        (
            "invalid business keys are refused before anything is written",
            invalid_business_keys_refused_first,
            False,
        ),
        (
            "keys no later read could give back are refused before anything is written",
            unreplayable_keys_refused_first,
            False,
        ),
        (
            "work that raises leaves no result and no business row",
            raising_work_leaves_nothing,
            False,
        ),
        (
            "a result JSON cannot hold leaves no result and no business row",
            result_json_refuses_leaves_nothing,
            False,
        ),
        (
            "a transaction the work kept takes no write after the effect returned",
            kept_transaction_ends_with_the_effect,
            False,
        ),
        (
            "a key nothing is stored under reads None and claims nothing",
            read_of_nothing_stored,
            False,
        ),
        ("a stored result reads as its replay", read_answers_as_a_replay, False),
        (
            "a read with another fingerprint under a business key is IdempotencyKeyConflictError",
            read_fingerprint_conflict,
            False,
        ),
        (
            "a write whose work raised leaves nothing to read",
            read_nothing_after_raising_work,
            False,
        ),
        ("a refused write leaves nothing to read", read_nothing_after_refused_write, True),
        ("another tenant's equal keys read nothing", read_in_own_tenant_only, False),
        (
            "a zombie's read answers and writes nothing",
            zombie_read_answers_and_writes_nothing,
            False,
        ),
        ("a read waits for no write in flight", read_waits_for_no_write, False),
    ]
    for offset, label in BOUNDARIES:
        outcome = "is accepted" if offset < 0 else "is refused"
        named.append((f"a write {label} expiry {outcome}", _write_at(offset, label), True))
    named += [
        (
            "a zombie's write after a takeover is refused, its replay too",
            zombie_write_refused,
            True,
        ),
        ("a write on a released, yielded or finished lease is refused", ended_leases_refused, True),
        ("a write at a token never granted is refused", ungranted_tokens_refused, True),
        (
            "a key naming another holder is refused as superseded, whatever the lease became",
            holder_decided_before_lease_state,
            True,
        ),
        (
            "race: a zombie's write against its lease's hand-over and the new holder's write",
            zombie_write_races_hand_over,
            True,
        ),
        ("race: two instances writing one key", two_instances_one_key, False),
        ("race: two executions writing one business key", two_executions_one_business_key, False),
    ]
    for skew in SKEWS:
        named.append(
            (
                f"the store's time is the authority with the writer's clock {skew_text(skew)}",
                _store_time(skew),
                True,
            )
        )
    named.append(
        ("database time decides, whatever the writer's clock", database_time_decides, True)
    )
    return (
        [Case(CONTRACT, name, run, fencing=fencing) for name, run, fencing in named]
        + write_cases(CONTRACT)
        + limit_cases(CONTRACT)
    )


__all__ = ["CONTRACT", "cases"]
