"""Helpers of the suite's own tests: in-memory store sets (sound or deliberately broken) and a
runner for the test classes `store_conformance` generates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryExecutionLeaseEventRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryOutboundCallRepository,
)
from agboss_sql.testing.contracts import BusinessRows, StoreFactory, generated_cases

FENCING_SET: dict[str, type[Any]] = {
    "execution_lease": InMemoryExecutionLeaseRepository,
    "execution_lease_event": InMemoryExecutionLeaseEventRepository,
    "fenced_effect": InMemoryFencedEffectRepository,
    "outbound_call": InMemoryOutboundCallRepository,
}
"""The sound in-memory fencing set, by contract key."""


@dataclass
class MemorySet:
    """A store set on its own `InMemoryBackend`: the `stores=` and `business_rows=` to pass."""

    backend: InMemoryBackend
    stores: dict[str, Any]
    business_rows: BusinessRows


def memory_set(classes: dict[str, type[Any]] | None = None) -> MemorySet:
    """The in-memory fencing set on a fresh backend, with `classes` replacing stores."""
    backend = InMemoryBackend()
    chosen = {**FENCING_SET, **(classes or {})}

    async def reset() -> None:
        backend.reset()

    def factory(cls: type[Any]) -> StoreFactory:
        return StoreFactory(
            lambda seam: cls(backend, seam.store_clock, seam.application), reset=reset
        )

    async def insert(tx: Any, row: str) -> None:
        tx.insert(row)

    async def committed() -> list[str]:
        return [str(row) for row in backend.business_rows]

    return MemorySet(
        backend,
        {key: factory(cls) for key, cls in chosen.items()},
        BusinessRows(insert=insert, committed=committed),
    )


@dataclass(frozen=True)
class Ran:
    """How one generated case ended: passed, skipped or failed, with its message."""

    outcome: str
    message: str = ""


REAL_TIME = "database_time_decides"
"""The cases that wait on real time (the database-time cases)."""


async def run_class(
    cls: type, *, only: str | None = None, real_time: bool = True
) -> dict[str, Ran]:
    """Run every generated case of `cls` (whose method name contains `only`, when given;
    without the real-time cases unless `real_time`) in this event loop, as pytest would,
    and report how each ended."""
    results: dict[str, Ran] = {}
    instance = cls()
    for name in generated_cases(cls):
        if only is not None and only not in name:
            continue
        if not real_time and REAL_TIME in name:
            continue
        try:
            await getattr(instance, name)()
        except pytest.skip.Exception as exc:
            results[name] = Ran("skipped", str(exc.msg))
        except Exception as exc:
            results[name] = Ran("failed", f"{type(exc).__name__}: {exc}")
        else:
            results[name] = Ran("passed")
    return results


def failures(results: dict[str, Ran]) -> dict[str, str]:
    return {name: ran.message for name, ran in results.items() if ran.outcome == "failed"}
