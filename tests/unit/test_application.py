"""Assembly: building providers, the layout checks, the lazy mismatch, readiness."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest

from agboss_sql.application import Application, HealthStatus
from agboss_sql.contracts import (
    ApplicationContext,
    AssemblyError,
    ExecutionLeaseRepository,
    ExecutionRecordRepository,
    FencedEffectKey,
    FencedEffectRepository,
    FencedEffectResult,
    FencedEffectStoreMismatchError,
    LeaseCheck,
    OutboundCallRepository,
    StepRef,
    StoreClock,
)
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryOutboundCallRepository,
)


class BillingEffects(FencedEffectRepository[Any]):
    """A fencing store on another database than the leases."""

    backend = "postgres:billing"

    def __init__(self, clock: StoreClock, application: ApplicationContext) -> None:
        self.clock = clock

    async def ping(self) -> None:
        return None

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Callable[[Any], Awaitable[Any]]
    ) -> FencedEffectResult[Any]:
        raise NotImplementedError

    async def get_result(self, key: FencedEffectKey) -> FencedEffectResult[Any] | None:
        raise NotImplementedError


class UndeclaredCalls(InMemoryOutboundCallRepository):
    backend = None


class OptedOutEffects(InMemoryFencedEffectRepository):
    lease_check: ClassVar[LeaseCheck] = LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION


class SecondLeases(InMemoryExecutionLeaseRepository):
    pass


async def test_defaults_are_in_memory_and_one_backend_per_application() -> None:
    app = Application("support")
    await app.start()
    leases = app.store(ExecutionLeaseRepository)
    assert isinstance(leases, InMemoryExecutionLeaseRepository)
    assert app.store(FencedEffectRepository).memory is leases.memory  # type: ignore[attr-defined]
    await app.close()


async def test_async_with_hands_over_a_started_application_and_stops_it_after() -> None:
    async with Application("support") as app:
        assert isinstance(app.store(ExecutionLeaseRepository), InMemoryExecutionLeaseRepository)
    with pytest.raises(RuntimeError, match="start"):
        app.store(ExecutionLeaseRepository)


async def test_async_with_raises_the_assembly_error_on_entry() -> None:
    entered = False
    with pytest.raises(AssemblyError, match=r"\[application.store-backend-mismatch\]"):
        async with Application("support", providers=[BillingEffects]):
            entered = True
    assert not entered


async def test_instance_ids_are_unique() -> None:
    ids = {Application("support").instance_id for _ in range(50)}
    assert len(ids) == 50


async def test_store_backend_mismatch_names_both_and_the_fix() -> None:
    app = Application("support", providers=[BillingEffects])
    with pytest.raises(AssemblyError) as caught:
        await app.start()
    text = str(caught.value)
    assert "[application.store-backend-mismatch]" in text
    assert "BillingEffects" in text and "'postgres:billing'" in text
    assert "InMemoryExecutionLeaseRepository" in text and "'in-memory'" in text
    assert 'a lease store declaring backend "postgres:billing"' in text


async def test_store_backend_undeclared() -> None:
    app = Application("support", providers=[UndeclaredCalls])
    with pytest.raises(AssemblyError, match=r"\[application.store-backend-undeclared\] Undeclared"):
        await app.start()


async def test_ambiguous_implementation_names_both_with_backends() -> None:
    app = Application("support", providers=[InMemoryExecutionLeaseRepository, SecondLeases])
    with pytest.raises(AssemblyError) as caught:
        await app.start()
    text = str(caught.value)
    assert "[di.ambiguous-implementation]" in text
    assert "InMemoryExecutionLeaseRepository (backend 'in-memory')" in text
    assert "SecondLeases (backend 'in-memory')" in text


async def test_every_violation_is_reported_at_once() -> None:
    app = Application(
        "support",
        providers=[InMemoryExecutionLeaseRepository, SecondLeases, BillingEffects, UndeclaredCalls],
    )
    with pytest.raises(AssemblyError) as caught:
        await app.start()
    text = str(caught.value)
    for code in (
        "[di.ambiguous-implementation]",
        "[application.store-backend-mismatch]",
        "[application.store-backend-undeclared]",
    ):
        assert code in text, code


async def test_opt_out_warns_at_every_start(caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(2):
        caplog.clear()
        app = Application("support", providers=[OptedOutEffects])
        with caplog.at_level(logging.WARNING, logger="agboss_sql.application"):
            await app.start()
        assert "[application.lease-check-not-atomic] OptedOutEffects" in caplog.text
        await app.close()


async def test_opt_out_is_an_error_under_strict_mode() -> None:
    app = Application("support", providers=[OptedOutEffects], strict=True)
    with pytest.raises(AssemblyError, match=r"\[application.lease-check-not-atomic\]"):
        await app.start()


async def test_sound_layout_assembles() -> None:
    backend = InMemoryBackend()
    app = Application(
        "support",
        providers=[InMemoryExecutionLeaseRepository, InMemoryFencedEffectRepository],
        values={InMemoryBackend: backend},
    )
    await app.start()
    assert app.store(FencedEffectRepository).memory is backend  # type: ignore[attr-defined]
    assert isinstance(app.store(OutboundCallRepository), InMemoryOutboundCallRepository)
    assert isinstance(app.store(ExecutionRecordRepository), ExecutionRecordRepository)


async def test_readiness_reports_every_store_up() -> None:
    app = Application("support")
    await app.start()
    report = await app.check_readiness()
    assert report.status is HealthStatus.UP
    assert len(report.components) == 12
    assert all(c.status is HealthStatus.UP for c in report.components)


class HangingLeases(InMemoryExecutionLeaseRepository):
    async def ping(self) -> None:
        await asyncio.sleep(3600)


async def test_readiness_does_not_hang_on_a_store_that_never_answers() -> None:
    app = Application("support", providers=[HangingLeases])
    await app.start()
    started = time.perf_counter()
    report = await app.check_readiness(timeout_s=0.3)
    assert time.perf_counter() - started < 1.0
    assert report.status is HealthStatus.DOWN
    down = [c for c in report.components if c.status is HealthStatus.DOWN]
    assert len(down) == 1 and "HangingLeases" in down[0].name
    assert down[0].error is not None and "no answer within 0.3 s" in down[0].error


async def test_unlisted_fencing_default_beside_sql_leases_fails_at_first_call(
    tmp_path: Any,
) -> None:
    from agboss_sql.application import DatabaseUrl
    from agboss_sql.contracts import ExecutionContext, ExecutionLease, fenced_effect_key_of
    from agboss_sql.sql.leases import SqlExecutionLeaseRepository

    url = f"sqlite:///{tmp_path / 'app.sqlite'}"
    app = Application(
        "support",
        providers=[SqlExecutionLeaseRepository],
        values={DatabaseUrl: DatabaseUrl(url)},
        require_schema=False,  # the file has no schema: only the assembly is shown
    )
    await app.start()  # assembles: an application that never fences need not list one
    effects = app.store(FencedEffectRepository)
    lease = ExecutionLease("t", "root", app.instance_id, 1, 1000)
    key = fenced_effect_key_of(
        ExecutionContext("t", "root", "root", lease, StepRef("root", "s1", "step")), "charge"
    )

    async def work(_tx: Any) -> int:
        return 1

    with pytest.raises(FencedEffectStoreMismatchError, match="SqlExecutionLeaseRepository"):
        await effects.save_result_if_absent(key, work)
    await app.close()


def test_sql_store_classes_is_a_deprecated_alias_of_sql_stores() -> None:
    from agboss_sql.sql import sql_store_classes, sql_stores

    with pytest.deprecated_call():
        assert sql_store_classes(checkpoint_saver=False) == sql_stores(checkpoint_saver=False)


async def test_start_builds_the_stores_off_the_event_loop() -> None:
    import threading

    built_on: list[threading.Thread] = []

    class RecordingLeases(InMemoryExecutionLeaseRepository):
        def __init__(
            self, backend: InMemoryBackend, clock: StoreClock, application: ApplicationContext
        ) -> None:
            built_on.append(threading.current_thread())
            super().__init__(backend, clock, application)

    app = Application("support", providers=[RecordingLeases])
    await app.start()

    assert len(built_on) == 1
    assert built_on[0] is not threading.current_thread()
    assert isinstance(app.store(ExecutionLeaseRepository), RecordingLeases)
    await app.close()
