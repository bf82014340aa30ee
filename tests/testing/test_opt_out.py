"""A store that opts out of the lease check (`LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION`):
its fencing cases fail unless the opt-out is accepted, then are skipped with the note, a
passing "gives NO double-charge protection" case appears, and every other case still runs
and can fail."""

from __future__ import annotations

from typing import Any

from broken_stores import (
    AtomicAgainEffects,
    OptedOutByParentEffects,
    OptedOutEffects,
    UnlockedEffects,
)
from conformance_runner import failures, memory_set, run_class

from agboss_sql.testing.contracts import (
    OPTED_OUT_NOTE,
    fenced_effect_contract,
    generated_cases,
    outbound_call_contract,
    store_conformance,
)

NO_PROTECTION = "test_store_set__gives_no_double_charge_protection"


def conformance(classes: dict[str, type[Any]] | None = None, **options: Any) -> type:
    chosen = memory_set(classes)
    return store_conformance(
        name="opt-out",
        stores=chosen.stores,
        business_rows=chosen.business_rows,
        interleavings=False,
        **options,
    )


def fencing_cases(cls: type, contract: str) -> set[str]:
    return {
        name
        for name, info in generated_cases(cls).items()
        if info.contract == contract and info.fencing
    }


async def test_without_the_flag_every_fencing_case_of_the_store_fails() -> None:
    cls = conformance({"fenced_effect": OptedOutEffects})
    results = await run_class(cls)
    found = failures(results)
    fencing = fencing_cases(cls, "fenced_effect")
    assert len(fencing) >= 10
    assert set(found) == fencing | {
        "test_store_set__fenced_effect_store_shares_the_lease_store_backend"
    }
    for message in found.values():
        assert "[store-conformance.opted-out-store] OptedOutEffects (fenced_effect)" in message
    # Its other cases, and every case of the other stores, ran and passed.
    assert results["test_fenced_effect__race_two_instances_writing_one_key"].outcome == "passed"
    assert NO_PROTECTION not in results


async def test_with_the_flag_fencing_cases_are_skipped_with_the_note() -> None:
    cls = conformance(
        {"fenced_effect": OptedOutEffects}, accept_without_double_charge_protection=True
    )
    results = await run_class(cls)
    assert failures(results) == {}
    skipped = {name: ran.message for name, ran in results.items() if ran.outcome == "skipped"}
    fencing = fencing_cases(cls, "fenced_effect")
    assert set(skipped) == fencing | {
        "test_store_set__fenced_effect_store_shares_the_lease_store_backend"
    }
    assert all(message.startswith(OPTED_OUT_NOTE) for message in skipped.values())
    assert results[NO_PROTECTION].outcome == "passed"
    # The outbound call store does not opt out: its fencing cases all ran.
    for name in fencing_cases(cls, "outbound_call"):
        assert results[name].outcome == "passed"


async def test_an_honest_opt_out_still_fails_the_races_on_one_key() -> None:
    cls = conformance(
        {"fenced_effect": UnlockedEffects}, accept_without_double_charge_protection=True
    )
    found = failures(await run_class(cls))
    assert set(found) == {
        "test_fenced_effect__race_two_instances_writing_one_key",
        "test_fenced_effect__race_two_executions_writing_one_business_key",
    }
    assert all("[one-effect-per-key]" in message for message in found.values())


async def test_the_flag_without_an_opted_out_store_fails() -> None:
    results = await run_class(
        conformance(accept_without_double_charge_protection=True), real_time=False
    )
    assert set(failures(results)) == {NO_PROTECTION}
    assert "[store-conformance.opt-out-not-declared]" in failures(results)[NO_PROTECTION]


async def test_an_opt_out_through_the_parent_class_counts() -> None:
    cls = conformance({"fenced_effect": OptedOutByParentEffects})
    found = failures(await run_class(cls))
    assert fencing_cases(cls, "fenced_effect") <= set(found)


async def test_a_subclass_restating_atomic_runs_every_fencing_case() -> None:
    results = await run_class(conformance({"fenced_effect": AtomicAgainEffects}), real_time=False)
    assert failures(results) == {}
    assert all(ran.outcome == "passed" for ran in results.values())


async def test_one_contract_alone_shows_the_missing_protection() -> None:
    chosen = memory_set({"fenced_effect": OptedOutEffects})
    cls = fenced_effect_contract(
        chosen.stores["fenced_effect"],
        execution_lease=chosen.stores["execution_lease"],
        business_rows=chosen.business_rows,
        name="effects alone",
        accept_without_double_charge_protection=True,
    )
    assert cls.__name__ == "TestEffectsAlone"
    results = await run_class(cls)
    assert results[NO_PROTECTION].outcome == "passed"
    assert failures(results) == {}
    assert {name.split("__")[0] for name in results} == {"test_fenced_effect", "test_store_set"}

    sound = memory_set()
    cls = outbound_call_contract(
        sound.stores["outbound_call"],
        execution_lease=sound.stores["execution_lease"],
        name="calls alone",
        accept_without_double_charge_protection=True,
    )
    found = failures(await run_class(cls))
    assert set(found) == {NO_PROTECTION}
    assert "[store-conformance.opt-out-not-declared]" in found[NO_PROTECTION]
