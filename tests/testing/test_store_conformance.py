"""`store_conformance` itself: the set is checked before any case runs, the generated class's
shape, resets and closes, the per-contract functions, and the explorer's hook."""

from __future__ import annotations

from typing import Any

import pytest
from conformance_runner import failures, memory_set, run_class

from agboss_sql.memory import InMemoryBackend, InMemoryExecutionLeaseRepository
from agboss_sql.testing import explorer
from agboss_sql.testing._errors import CODES
from agboss_sql.testing.contracts import (
    StoreConformanceError,
    StoreFactory,
    StoreSet,
    _registry,
    execution_lease_contract,
    execution_lease_event_contract,
    generated_cases,
    store_conformance,
)
from agboss_sql.testing.contracts._registry import suite_cases


def leases_only() -> dict[str, Any]:
    return {"execution_lease": memory_set().stores["execution_lease"]}


def error_of(**options: Any) -> StoreConformanceError:
    options.setdefault("name", "bad set")
    options.setdefault("interleavings", False)
    with pytest.raises(StoreConformanceError) as caught:
        store_conformance(**options)
    return caught.value


# --- the set is checked first -------------------------------------------------------------


def test_an_empty_set_is_refused() -> None:
    error = error_of(stores={})
    assert error.codes == ("store-conformance.empty",)
    assert str(error).startswith("[store-conformance.empty]")


@pytest.mark.parametrize(
    ("key", "guess"),
    [
        ("rate_limits", "rate_limit"),
        ("rateLimit", "rate_limit"),
        ("executionLease", "execution_lease"),
        ("leases", None),
    ],
)
def test_an_unknown_store_key_is_refused_with_the_closest(key: str, guess: str | None) -> None:
    chosen = memory_set()
    error = error_of(
        stores={**chosen.stores, key: lambda seam: None}, business_rows=chosen.business_rows
    )
    assert error.codes == ("store-conformance.unknown-store",)
    assert repr(key) in str(error)
    if guess is not None:
        assert f"did you mean {guess!r}?" in str(error)
    else:
        assert "did you mean" not in str(error)


def test_a_lease_store_needs_the_other_fencing_contracts() -> None:
    error = error_of(stores=leases_only())
    assert error.codes == ("store-conformance.missing-fencing-contract",) * 3
    text = str(error)
    for key, proves in (
        ("fenced_effect", "one effect per key"),
        ("outbound_call", "one send per key"),
        ("execution_lease_event", "tell a zombie from a takeover"),
    ):
        assert f"no {key!r} store" in text and proves in text
    assert "without=" in text


def test_fencing_contracts_left_out_deliberately() -> None:
    cls = store_conformance(
        name="coordination",
        stores=leases_only(),
        without=["fenced_effect", "outbound_call", "execution_lease_event"],
        interleavings=False,
    )
    assert {info.contract for info in generated_cases(cls).values()} == {"execution_lease"}


def test_a_fencing_store_needs_a_lease_store() -> None:
    chosen = memory_set()
    error = error_of(stores={"outbound_call": chosen.stores["outbound_call"]})
    assert error.codes == ("store-conformance.lease-store-required",)
    assert "'outbound_call'" in str(error)


def test_a_contract_both_given_and_left_out_is_refused() -> None:
    chosen = memory_set()
    error = error_of(
        stores=chosen.stores, business_rows=chosen.business_rows, without=["outbound_call"]
    )
    assert error.codes == ("store-conformance.without-implemented",)


@pytest.mark.parametrize("left_out", ["execution_lease", "rate_limit", "fenced_effects"])
def test_only_fencing_contracts_may_be_left_out(left_out: str) -> None:
    error = error_of(
        stores=leases_only(),
        without=["fenced_effect", "outbound_call", "execution_lease_event", left_out],
    )
    assert error.codes == ("store-conformance.invalid-without",)
    if left_out == "fenced_effects":
        assert "did you mean 'fenced_effect'?" in str(error)


def test_a_fenced_effect_store_needs_business_rows() -> None:
    chosen = memory_set()
    error = error_of(stores=chosen.stores)
    assert error.codes == ("store-conformance.business-rows-required",)


def test_every_problem_is_reported_at_once() -> None:
    chosen = memory_set()
    error = error_of(
        stores={"fenced_effect": chosen.stores["fenced_effect"], "rate_limits": lambda seam: None},
        without=["rate_limit"],
        interleavings={"depht": 5},
        loop_scope="forever",
    )
    assert set(error.codes) == {
        "store-conformance.unknown-store",
        "store-conformance.invalid-without",
        "store-conformance.lease-store-required",
        "store-conformance.business-rows-required",
        "store-conformance.invalid-option",
    }
    assert all(f"[{code}]" in str(error) for code in error.codes)
    assert error.code == error.codes[0]
    assert set(error.codes) <= set(CODES)


def test_a_factory_that_is_no_callable_is_refused() -> None:
    error = error_of(
        stores={"execution_lease": object()},
        without=["fenced_effect", "outbound_call", "execution_lease_event"],
    )
    assert error.codes == ("store-conformance.invalid-factory",)


# --- the generated class ------------------------------------------------------------------


def test_the_class_shape() -> None:
    chosen = memory_set()
    cls = store_conformance(
        name="My Postgres-set 2",
        stores=chosen.stores,
        business_rows=chosen.business_rows,
        interleavings={"depth": 5, "walks": 100},
        loop_scope="module",
    )
    assert cls.__name__ == "TestMyPostgresSet2"
    assert cls.__module__ == __name__
    assert cls.interleavings == {"depth": 5, "walks": 100}
    assert isinstance(cls.store_set, StoreSet)
    cases = generated_cases(cls)
    contracts = {info.contract for info in cases.values()}
    assert contracts == {
        "execution_lease",
        "execution_lease_event",
        "fenced_effect",
        "outbound_call",
        "store_set",
    }
    for name in cases:
        assert name.startswith("test_") and "__" in name
        method = getattr(cls, name)
        marks = [m for m in method.pytestmark if m.name == "asyncio"]
        assert marks and marks[0].kwargs == {"loop_scope": "module"}
    assert "test_execution_lease__acquire_exactly_at_expiry_takes_the_lease_over" in cases
    assert (
        "test_fenced_effect__race_a_zombie_s_write_against_its_lease_s_hand_over_and_the_new_holder_s_write"
        in cases
    )
    assert cases["test_fenced_effect__a_write_exactly_at_expiry_is_refused"].fencing
    assert not cases["test_fenced_effect__race_two_instances_writing_one_key"].fencing
    assert len(set(cases)) == len(cases)


def test_interleavings_default_and_off() -> None:
    chosen = memory_set()
    on = store_conformance(name="a", stores=chosen.stores, business_rows=chosen.business_rows)
    off = store_conformance(
        name="b", stores=chosen.stores, business_rows=chosen.business_rows, interleavings=False
    )
    assert on.interleavings == {}
    assert off.interleavings is False


async def test_each_case_resets_first_and_closes_what_it_built() -> None:
    backend = InMemoryBackend()
    calls: list[str] = []

    async def reset() -> None:
        calls.append("reset")
        backend.reset()

    async def close(store: Any) -> None:
        calls.append(f"close {store.application.instance_id}")

    cls = execution_lease_contract(
        StoreFactory(
            lambda seam: InMemoryExecutionLeaseRepository(
                backend, seam.store_clock, seam.application
            ),
            close=close,
        ),
        name="leases alone",
        reset=reset,
    )
    assert {info.contract for info in generated_cases(cls).values()} == {"execution_lease"}
    results = await run_class(cls, only="acquire_grants_epoch_1")
    assert [ran.outcome for ran in results.values()] == ["passed"]
    assert calls == ["reset", "close instance-1"]
    calls.clear()
    results = await run_class(cls)
    assert failures(results) == {}
    assert calls.count("reset") == len(results)


async def test_a_stores_own_reset_replaces_the_sets() -> None:
    set_resets: list[int] = []
    own: list[int] = []
    chosen = memory_set()
    log = chosen.stores["execution_lease_event"]

    async def set_reset() -> None:
        set_resets.append(1)

    async def own_reset() -> None:
        own.append(1)
        chosen.backend.reset()

    cls = execution_lease_event_contract(
        StoreFactory(log.instance, reset=own_reset), name="log alone", reset=set_reset
    )
    results = await run_class(cls)
    cases = len(suite_cases("execution_lease_event"))
    assert failures(results) == {} and len(results) == cases
    assert len(own) == cases and set_resets == []


async def test_a_suite_that_cannot_load_is_a_failing_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        _registry.SUITES, "execution_lease_event", "agboss_sql.testing.contracts.no_such_suite"
    )
    chosen = memory_set()
    cls = store_conformance(
        name="missing suite",
        stores=chosen.stores,
        business_rows=chosen.business_rows,
        interleavings=False,
    )
    found = failures(await run_class(cls, only="execution_lease_event"))
    assert list(found) == ["test_execution_lease_event__suite"]
    assert "[store-conformance.suite-unavailable]" in found["test_execution_lease_event__suite"]


def test_the_explorer_registers_every_set_that_asks_for_interleavings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registered: list[tuple[type, dict[str, Any]]] = []
    monkeypatch.setattr(
        explorer, "register", lambda cls, **options: registered.append((cls, options))
    )
    chosen = memory_set()
    on = store_conformance(
        name="on",
        stores=chosen.stores,
        business_rows=chosen.business_rows,
        interleavings={"depth": 3},
    )
    store_conformance(
        name="off", stores=chosen.stores, business_rows=chosen.business_rows, interleavings=False
    )
    execution_lease_contract(chosen.stores["execution_lease"], name="alone")
    assert [(cls, options["interleavings"]) for cls, options in registered] == [(on, {"depth": 3})]
    options = registered[0][1]
    assert options["name"] == "on"
    assert options["factories"] is on.store_set.factories
    assert options["business_rows"] is chosen.business_rows
    assert options["accept_without_double_charge_protection"] is False


async def test_an_explorer_that_cannot_register_is_a_failing_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(cls: type, **options: Any) -> None:
        raise RuntimeError("cannot register these options")

    monkeypatch.setattr(explorer, "register", refuse)
    chosen = memory_set()
    cls = store_conformance(
        name="half explorer", stores=chosen.stores, business_rows=chosen.business_rows
    )
    found = failures(await run_class(cls, only="interleavings"))
    assert list(found) == ["test_interleavings__explorer"]
    assert "[store-conformance.suite-unavailable]" in found["test_interleavings__explorer"]
    assert "cannot register these options" in found["test_interleavings__explorer"]
