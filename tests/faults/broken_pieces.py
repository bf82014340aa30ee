"""Deliberately broken pieces, each breaking one promise the fault audit checks. The pods
of the bite tests import them (the harness hands the test's import path to the pods)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from agboss_sql.contracts.types import FencedEffectKey, FencedEffectResult, FinishResult, JsonValue
from agboss_sql.lab.faults.fixture import PodIdentity, PodStores, build_sql_store_set
from agboss_sql.runtime import LeaseKeeper
from agboss_sql.sql import SqlChildExecutionQueueRepository, SqlFencedEffectRepository

T = TypeVar("T")


class NeverFencingKeeper(LeaseKeeper):
    """A keeper that never fences itself: a lost lease is never marked lost, so a frozen
    holder that wakes goes on as if it still held it."""

    def _mark_lost(self, why: str) -> bool:
        return False


class OutsideTransactionEffects(SqlFencedEffectRepository):
    """Runs the work in its own transaction, committed before the fenced one: the business
    row lands even when the fence then refuses, and again on every replay."""

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Callable[[AsyncConnection], Awaitable[T]]
    ) -> FencedEffectResult[T]:
        async with self.connection.transaction() as tx:
            value = await work(tx)

        async def done(tx: AsyncConnection) -> T:
            return value

        return await super().save_result_if_absent(key, done)


class NoAttemptCompareQueue(SqlChildExecutionQueueRepository):
    """Finishes a running child whatever attempt the finisher ran: a superseded worker's
    late finish counts."""

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> FinishResult:
        return await super().finish(child_execution_id, outcome)


def outside_transaction_set(url: str, pod: PodIdentity) -> PodStores:
    return build_sql_store_set(url, pod, {"fenced_effect": OutsideTransactionEffects})


def no_attempt_compare_set(url: str, pod: PodIdentity) -> PodStores:
    return build_sql_store_set(url, pod, {"child_queue": NoAttemptCompareQueue})


def hanging_pause_set(url: str, pod: PodIdentity) -> PodStores:
    """The project's stores, but reading a pause never answers (a call that hangs)."""
    import asyncio

    stores = build_sql_store_set(url, pod)
    pauses = stores.pauses
    original = type(pauses)

    class Hanging(original):  # type: ignore[misc, valid-type]
        async def get(self, tenant_id: str, pause_id: str) -> Any:
            await asyncio.Event().wait()

    pauses.__class__ = Hanging
    return stores
