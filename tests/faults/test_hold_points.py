"""Hold points in one process (no database): a call waits at its armed point until
released, a hold is bounded, and the controller reports errors and hung calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionContext,
    StepRef,
    StoreClock,
    VirtualClock,
    fenced_effect_key_of,
)
from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.lab.faults import StoreHoldPoint, with_hold_points
from agboss_sql.lab.faults.holds import HoldController, install
from agboss_sql.memory import InMemoryBackend
from agboss_sql.memory.fenced import InMemoryFencedEffectRepository
from agboss_sql.memory.leases import InMemoryExecutionLeaseRepository
from agboss_sql.memory.records import InMemoryExecutionTreeRepository


class Recorder:
    """The controller's events, with a way to wait for one (bounded)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait(self, kind: str, hold: str | None = None) -> dict[str, Any]:
        async with asyncio.timeout(5):  # bounded: a hold is reported at once
            while True:
                for event in self.events:
                    if event["kind"] == kind and hold in (None, event.get("hold")):
                        return event
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    found = Recorder()
    yield found
    install(None)


def _controller(recorder: Recorder, **options: Any) -> HoldController:
    control = HoldController(recorder.emit, **options)
    install(control)
    return control


async def test_a_call_waits_at_its_point_until_released(recorder: Recorder) -> None:
    control = _controller(recorder)
    tree = with_hold_points(InMemoryExecutionTreeRepository)(
        InMemoryBackend(), VirtualClock(), ApplicationContext("i-1")
    )
    control.arm("h", StoreHoldPoint("execution_tree.save_if_absent", "before").name, "root-1")
    call = asyncio.create_task(tree.save_if_absent("t", "root-1", "k", 1))
    held = await recorder.wait("held")
    assert held["call"].startswith("t root-1 k")
    assert await tree.get("t", "root-1", "k") is None  # held before it wrote anything
    # Another call, not matching the hold, goes through.
    assert await tree.save_if_absent("t", "root-2", "k", 1) is True
    control.release("h")
    assert await call is True
    assert await tree.get("t", "root-1", "k") == 1


async def test_the_work_points_of_a_fenced_effect(recorder: Recorder) -> None:
    control = _controller(recorder)
    backend, clock = InMemoryBackend(), VirtualClock(1_000)
    app = ApplicationContext("i-1")
    leases = InMemoryExecutionLeaseRepository(backend, StoreClock(clock), app)
    effects = with_hold_points(InMemoryFencedEffectRepository)(backend, StoreClock(clock), app)
    lease = await leases.acquire("t", "root", 30_000)
    assert lease is not None
    key = fenced_effect_key_of(
        ExecutionContext("t", "root", "root", lease, StepRef("root", "s1", "s1")), "charge"
    )
    ran: list[str] = []

    async def work(tx: Any) -> str:
        ran.append("work")
        return "done"

    control.arm("w", "fenced_effect.save_result_if_absent:work")
    control.arm("a", "fenced_effect.save_result_if_absent:after-work")
    call = asyncio.create_task(effects.save_result_if_absent(key, work))
    await recorder.wait("held", "w")
    assert ran == []  # held between the fence and the work
    control.release("w")
    await recorder.wait("held", "a")
    assert ran == ["work"]  # held after the work, before the result is stored
    control.release("a")
    assert (await call).value == "done"


async def test_a_hold_nobody_releases_ends_at_its_bound(recorder: Recorder) -> None:
    control = _controller(recorder, hold_timeout_s=0.05)
    tree = with_hold_points(InMemoryExecutionTreeRepository)(
        InMemoryBackend(), VirtualClock(), ApplicationContext("i-1")
    )
    control.arm("h", "execution_tree.get:before")
    assert await tree.get("t", "root", "k") is None
    assert [e["kind"] for e in recorder.events] == ["held", "hold-timeout"]


async def test_errors_are_reported_typed_or_not(recorder: Recorder) -> None:
    _controller(recorder)
    backend, clock = InMemoryBackend(), VirtualClock(1_000)
    app = ApplicationContext("i-1")
    effects = with_hold_points(InMemoryFencedEffectRepository)(backend, StoreClock(clock), app)
    leases = InMemoryExecutionLeaseRepository(backend, StoreClock(clock), app)
    lease = await leases.acquire("t", "root", 30_000)
    assert lease is not None
    await leases.release(lease)
    key = fenced_effect_key_of(
        ExecutionContext("t", "root", "root", lease, StepRef("root", "s1", "s1")), "charge"
    )

    async def work(tx: Any) -> str:
        return "never"

    with pytest.raises(ExecutionFencedError):
        await effects.save_result_if_absent(key, work)
    error = await recorder.wait("op-error")
    assert error["op"] == "fenced_effect.save_result_if_absent"
    assert error["typed"] is True and error["code"] == "execution.fenced"


async def test_a_quiesced_controller_holds_new_calls(recorder: Recorder) -> None:
    control = _controller(recorder)
    tree = with_hold_points(InMemoryExecutionTreeRepository)(
        InMemoryBackend(), VirtualClock(), ApplicationContext("i-1")
    )
    await control.quiesce("q", 5)
    assert [e["kind"] for e in recorder.events] == ["quiet"]
    call = asyncio.create_task(tree.save_if_absent("t", "root", "k", 1))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not call.done()
    control.release("q")
    assert await call is True


def test_a_point_is_named_and_checked() -> None:
    point = StoreHoldPoint("fenced_effect.save_result_if_absent", "after")
    assert point.name == "fenced_effect.save_result_if_absent:after"
    assert StoreHoldPoint.parse(point.name) == point
    with pytest.raises(ValueError):
        StoreHoldPoint("fenced_effect.save_result_if_absent", "during")
    with pytest.raises(ValueError):
        StoreHoldPoint("save_result_if_absent")
