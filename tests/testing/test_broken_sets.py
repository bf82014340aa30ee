"""The suite bites: each deliberately broken store set fails it, on the rule it breaks, while
the sound in-memory set passes every case."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from broken_stores import (
    AnyHolderLeases,
    AnyLeaseMsLeases,
    CallerClockLeases,
    CheckThenWriteLeases,
    LiveAtExpiryLeases,
    LossyLeaseLog,
    NoBackendEffects,
    OldEndRenewalLeases,
    OtherBackendCalls,
    ReadThenCloseCalls,
    ReclaimAnyLiveLeases,
    RowsOutsideTransactionEffects,
    StringKindLeaseLog,
)
from conformance_runner import failures, memory_set, run_class

from agboss_sql.memory import InMemoryExecutionLeaseRepository
from agboss_sql.testing.contracts import StoreFactory, generated_cases, store_conformance

RULE = re.compile(r"\[[a-z.-]+\]")
"""A rule (or a code) in brackets: every failure names one."""


def conformance(classes: dict[str, type[Any]] | None = None, **options: Any) -> type:
    chosen = memory_set(classes)
    return store_conformance(
        name="broken set",
        stores={**chosen.stores, **options.pop("stores", {})},
        business_rows=chosen.business_rows,
        interleavings=False,
        **options,
    )


def expect_fails(found: dict[str, str], rule: str, *cases: str) -> None:
    """Each named case failed, and on `rule`; every failure names a rule."""
    for name, message in found.items():
        assert RULE.search(message), f"{name} failed without naming a rule: {message}"
    for case in cases:
        assert case in found, f"{case} passed; failures: {sorted(found)}"
        assert f"[{rule}]" in found[case], f"{case} failed on another rule: {found[case]}"


async def test_the_sound_in_memory_set_passes_every_case() -> None:
    results = await run_class(conformance())
    assert len(results) > 80
    assert failures(results) == {}
    assert {ran.outcome for ran in results.values()} == {"passed"}


async def test_check_then_write_leases_give_two_live_holders() -> None:
    found = failures(
        await run_class(conformance({"execution_lease": CheckThenWriteLeases}), real_time=False)
    )
    expect_fails(
        found,
        "one-live-holder",
        "test_execution_lease__race_three_takes_of_a_new_lease_give_one_holder",
        "test_execution_lease__race_three_takeovers_of_an_expired_lease_give_one_holder",
    )
    expect_fails(
        found,
        "no-takeover-of-finished-work",
        "test_execution_lease__race_finish_against_a_take_past_the_lease",
    )
    # Every sequential case still passes: only the races reach the gap.
    assert set(found) == {
        "test_execution_lease__race_three_takes_of_a_new_lease_give_one_holder",
        "test_execution_lease__race_three_takeovers_of_an_expired_lease_give_one_holder",
        "test_execution_lease__race_finish_against_a_take_past_the_lease",
    }


async def test_a_lease_live_at_its_expiry_instant_fails_the_boundaries() -> None:
    found = failures(
        await run_class(conformance({"execution_lease": LiveAtExpiryLeases}), real_time=False)
    )
    expect_fails(
        found,
        "live-until-expiry",
        "test_execution_lease__acquire_exactly_at_expiry_takes_the_lease_over",
        "test_execution_lease__renew_exactly_at_expiry_is_refused",
    )
    for passing in (
        "test_execution_lease__acquire_1_ms_before_expiry_is_refused",
        "test_execution_lease__acquire_1_ms_after_expiry_takes_the_lease_over",
        "test_execution_lease__renew_1_ms_after_expiry_is_refused",
    ):
        assert passing not in found, found.get(passing)


async def test_leases_moved_by_whoever_presents_them_fail_the_holder_case() -> None:
    found = failures(
        await run_class(conformance({"execution_lease": AnyHolderLeases}), real_time=False)
    )
    expect_fails(
        found,
        "no-stale-write",
        "test_execution_lease__only_the_holder_moves_its_lease_and_a_lease_never_granted_moves_nothing",
    )


async def test_a_reclaim_of_a_lease_never_yielded_fails_the_reclaim_case() -> None:
    found = failures(
        await run_class(conformance({"execution_lease": ReclaimAnyLiveLeases}), real_time=False)
    )
    expect_fails(
        found,
        "no-stale-write",
        "test_execution_lease__reclaim_needs_a_lease_its_holder_yielded_and_still_holds",
    )


async def test_a_lease_ms_taken_as_given_fails_the_lease_ms_case() -> None:
    found = failures(
        await run_class(conformance({"execution_lease": AnyLeaseMsLeases}), real_time=False)
    )
    expect_fails(
        found,
        "lease-ms",
        "test_execution_lease__lease_ms_is_a_positive_whole_number_of_milliseconds",
    )


async def test_a_renewal_from_the_old_end_fails() -> None:
    found = failures(
        await run_class(conformance({"execution_lease": OldEndRenewalLeases}), real_time=False)
    )
    expect_fails(
        found,
        "renewal-from-now",
        "test_execution_lease__a_renewal_extends_from_now_not_from_the_old_expiry",
        "test_execution_lease__renew_1_ms_before_expiry_renews",
    )


async def test_leases_on_the_callers_clock_fail_the_store_time_cases() -> None:
    chosen = memory_set()

    def leases(seam: Any) -> CallerClockLeases:
        return CallerClockLeases(chosen.backend, seam.store_clock, seam.application, seam.clock)

    lease_factory = chosen.stores["execution_lease"]
    stores = {**chosen.stores, "execution_lease": StoreFactory(leases, reset=lease_factory.reset)}
    cls = store_conformance(
        name="caller clock",
        stores=stores,
        business_rows=chosen.business_rows,
        interleavings=False,
    )
    found = failures(await run_class(cls, only="the_store_s_time_is_the_authority"))
    store_time = [
        name
        for name in generated_cases(cls)
        if "store_s_time" in name and "execution_lease" in name
    ]
    assert len(store_time) == 6
    expect_fails(found, "store-time", *store_time)


async def test_business_rows_outside_the_transaction_fail_all_or_nothing() -> None:
    found = failures(
        await run_class(
            conformance({"fenced_effect": RowsOutsideTransactionEffects}), real_time=False
        )
    )
    expect_fails(
        found,
        "all-or-nothing",
        "test_fenced_effect__work_that_raises_leaves_no_result_and_no_business_row",
        "test_fenced_effect__a_result_json_cannot_hold_leaves_no_result_and_no_business_row",
    )


async def test_a_read_then_close_lease_state_of_fails_its_races() -> None:
    found = failures(
        await run_class(conformance({"outbound_call": ReadThenCloseCalls}), real_time=False)
    )
    expect_fails(
        found,
        "atomic-lease-state",
        "test_outbound_call__race_lease_state_of_against_a_take",
        "test_outbound_call__race_lease_state_of_against_a_finish",
    )
    # Asked one at a time, it answers right: only the races show the gap.
    for passing in (
        "test_outbound_call__lease_state_of_answers_each_state",
        "test_outbound_call__lease_state_of_exactly_at_expiry_closes_the_lease_as_superseded",
    ):
        assert passing not in found, found.get(passing)


@pytest.mark.parametrize("log", [LossyLeaseLog, StringKindLeaseLog])
async def test_a_lease_log_that_loses_a_field_fails(log: type[Any]) -> None:
    found = failures(await run_class(conformance({"execution_lease_event": log}), real_time=False))
    expect_fails(
        found,
        "lease-log-exact",
        "test_execution_lease_event__every_field_is_read_back_exactly",
        "test_execution_lease_event__events_are_listed_per_execution_and_tenant_in_save_order",
    )
    assert all(name.startswith("test_execution_lease_event__") for name in found)


async def test_a_fencing_store_of_no_backend_fails_the_store_set() -> None:
    found = failures(
        await run_class(conformance({"fenced_effect": NoBackendEffects}), real_time=False)
    )
    assert set(found) == {"test_store_set__fenced_effect_store_shares_the_lease_store_backend"}
    message = found["test_store_set__fenced_effect_store_shares_the_lease_store_backend"]
    assert "[store-backend]" in message and "NoBackendEffects" in message
    assert "declares no backend" in message


async def test_a_fencing_store_on_another_backend_fails_the_store_set() -> None:
    found = failures(
        await run_class(conformance({"outbound_call": OtherBackendCalls}), real_time=False)
    )
    assert set(found) == {"test_store_set__outbound_call_store_shares_the_lease_store_backend"}
    message = found["test_store_set__outbound_call_store_shares_the_lease_store_backend"]
    assert "[store-backend]" in message
    assert "'in-memory:billing'" in message and "'in-memory'" in message


async def test_a_lease_store_of_no_backend_fails_the_store_set() -> None:
    class NoBackendLeases(InMemoryExecutionLeaseRepository):
        backend: str | None = None

    found = failures(
        await run_class(conformance({"execution_lease": NoBackendLeases}), real_time=False)
    )
    assert set(found) == {
        "test_store_set__fenced_effect_store_shares_the_lease_store_backend",
        "test_store_set__outbound_call_store_shares_the_lease_store_backend",
    }
    assert all("[store-backend] the lease store NoBackendLeases" in m for m in found.values())


def test_a_broken_set_fails_under_pytest_naming_the_rule(tmp_path: Path) -> None:
    """Collected and run by pytest as a user runs it: the failure report names the rule."""
    here = Path(__file__).parent
    module = tmp_path / "test_user_set.py"
    module.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(here)!r})
            from broken_stores import CheckThenWriteLeases
            from conformance_runner import memory_set
            from agboss_sql.testing.contracts import store_conformance

            chosen = memory_set({{"execution_lease": CheckThenWriteLeases}})
            TestUserSet = store_conformance(
                name="user set",
                stores=chosen.stores,
                business_rows=chosen.business_rows,
                interleavings=False,
            )
            """
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(module),
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            "--rootdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "3 failed" in output, output
    assert (
        "TestUserSet::test_execution_lease__race_three_takes_of_a_new_lease_give_one_holder"
        in output
    )
    assert "[one-live-holder]" in output
