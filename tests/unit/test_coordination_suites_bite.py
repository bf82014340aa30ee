"""The coordination contract suites are well formed and bite.

The cases themselves run once per store set, in its conformance class
(tests/unit/test_conformance_memory.py for the in-memory stores,
tests/stores/test_conformance_sql.py for the SQL ones). Here each suite's shape is checked,
and each broken store below, on a fresh `InMemoryBackend` shared by two instances, fails
the case about the rule it breaks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
from collections.abc import Callable
from typing import Any

import pytest

from agboss_sql.contracts import (
    BudgetScope,
    ChildStatus,
    ClaimedChild,
    CostEntry,
    ExecutionRecord,
    ExecutionRecordStatus,
    ExecutionSnapshot,
    FinishResult,
    HistoryCursor,
    MeshRequestSaved,
    NotPausedError,
    PausedExecution,
    PauseStatus,
    WaitResult,
    WindowResult,
)
from agboss_sql.contracts.rules import MAX_DURATION_MS
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryChildExecutionQueueRepository,
    InMemoryCostLedgerRepository,
    InMemoryExecutionHistoryRepository,
    InMemoryExecutionRecordRepository,
    InMemoryExecutionTreeRepository,
    InMemoryMeshRequestRepository,
    InMemoryPausedExecutionRepository,
    InMemoryRateLimitRepository,
)
from agboss_sql.testing._case import CaseContext, StoreFactory
from agboss_sql.testing.contracts import (
    child_queue,
    cost_ledger,
    execution_history,
    execution_record,
    execution_tree,
    mesh_request,
    paused_execution,
    rate_limit,
)

SUITES = [
    child_queue,
    rate_limit,
    execution_record,
    execution_tree,
    mesh_request,
    paused_execution,
    cost_ledger,
    execution_history,
]

CASES = [case for suite in SUITES for case in suite.cases()]


def _factory(store: Callable[..., Any], backend: InMemoryBackend) -> StoreFactory:
    # Rate limits run on the store's time, the others on the application's clock (the
    # case's virtual clock).
    def build(seam: Any) -> Any:
        on_store_time = isinstance(store, type) and issubclass(store, InMemoryRateLimitRepository)
        return store(backend, seam.store_clock if on_store_time else seam.clock, seam.application)

    return StoreFactory(instance=build)


def test_every_suite_has_cases_of_its_own_contract_and_none_fenced() -> None:
    for suite in SUITES:
        found = suite.cases()
        assert found, f"{suite.__name__} has no cases"
        assert {case.contract for case in found} == {suite.CONTRACT}
        assert not any(case.fencing for case in found), f"{suite.__name__} marks a case fenced"
        names = [case.name for case in found]
        assert len(set(names)) == len(names), f"{suite.__name__} repeats a case name"


# The suites bite: each broken store below opens the gap (check, await, write) or breaks
# the rule one case is about, and that case fails naming the rule.


def _mark_running(row: Any, instance_id: str) -> ClaimedChild:
    row.status, row.claimed_by, row.attempt = ChildStatus.RUNNING, instance_id, row.attempt + 1
    return ClaimedChild(
        row.tenant_id,
        row.root_execution_id,
        row.parent_execution_id,
        row.child_execution_id,
        row.depth,
        row.payload,
        row.attempt,
        instance_id,
    )


class ClaimThenMark(InMemoryChildExecutionQueueRepository):
    """Picks the next child, awaits, then marks it running."""

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        queued = [r for r in self.memory.children.values() if r.status is ChildStatus.QUEUED]
        if not queued:
            return None
        row = min(queued, key=lambda r: (-r.depth, r.queued_at, r.sequence))
        await asyncio.sleep(0)
        return _mark_running(row, instance_id)


class NoneWhenItsPickIsTaken(InMemoryChildExecutionQueueRepository):
    """Picks the next child, awaits, and answers `None` when another claimer took it
    meanwhile (a locking re-check that gives up instead of taking the next child)."""

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        queued = [r for r in self.memory.children.values() if r.status is ChildStatus.QUEUED]
        if not queued:
            return None
        row = min(queued, key=lambda r: (-r.depth, r.queued_at, r.sequence))
        await asyncio.sleep(0)
        if row.status is not ChildStatus.QUEUED:
            return None
        return _mark_running(row, instance_id)


class OldestFirst(InMemoryChildExecutionQueueRepository):
    """Ignores the depth."""

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        queued = [r for r in self.memory.children.values() if r.status is ChildStatus.QUEUED]
        if not queued:
            return None
        return _mark_running(min(queued, key=lambda r: (r.queued_at, r.sequence)), instance_id)


async def _running(store: InMemoryChildExecutionQueueRepository, child_id: str) -> Any:
    running = await store.running(1_000_000)
    return next((c for c in running if c.child_execution_id == child_id), None)


class FinishThenCount(InMemoryChildExecutionQueueRepository):
    """Moves the child, awaits, then counts its unfinished siblings."""

    async def finish(
        self, child_execution_id: str, outcome: Any, *, attempt: int | None = None
    ) -> FinishResult:
        current = await _running(self, child_execution_id)
        moved = await super().finish(child_execution_id, outcome, attempt=attempt)
        if current is None:
            return moved
        await asyncio.sleep(0)
        siblings = await self.children(current.tenant_id, current.parent_execution_id)
        return FinishResult(
            moved.finished, sum(c.status is not ChildStatus.FINISHED for c in siblings)
        )


class FinishAnyAttempt(InMemoryChildExecutionQueueRepository):
    """Finishes whatever attempt is running."""

    async def finish(
        self, child_execution_id: str, outcome: Any, *, attempt: int | None = None
    ) -> FinishResult:
        return await super().finish(child_execution_id, outcome)


class RefusesARetriedFinish(InMemoryChildExecutionQueueRepository):
    """Answers a retry of a committed finish `finished=False`, like someone else's."""

    async def finish(
        self, child_execution_id: str, outcome: Any, *, attempt: int | None = None
    ) -> FinishResult:
        row = self.memory.children.get(child_execution_id)
        if row is not None and row.status is ChildStatus.FINISHED:
            return FinishResult(False, (await super().finish(child_execution_id, outcome))[1])
        return await super().finish(child_execution_id, outcome, attempt=attempt)


class RecountsARetriedFinish(InMemoryChildExecutionQueueRepository):
    """Answers a retry of a committed finish with the siblings counted now."""

    async def finish(
        self, child_execution_id: str, outcome: Any, *, attempt: int | None = None
    ) -> FinishResult:
        row = self.memory.children.get(child_execution_id)
        if row is not None and row.status is ChildStatus.FINISHED and row.attempt == attempt:
            return FinishResult(True, (await super().finish(child_execution_id, outcome))[1])
        return await super().finish(child_execution_id, outcome, attempt=attempt)


class ClaimWakeWithoutCompare(InMemoryChildExecutionQueueRepository):
    """Gives an owed wake to whoever asks."""

    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        row = self.memory.children.get(child_execution_id)
        if row is None or row.finish_remaining != 0 or row.parent_woken_at is not None:
            return False
        row.wake_claimed_by, row.wake_claimed_until = claimer, self.clock.now() + claim_ms
        return True


class MarkWokenByAnyone(InMemoryChildExecutionQueueRepository):
    """Marks the wake done for any claimer."""

    async def mark_woken(self, child_execution_id: str, claimer: str) -> bool:
        row = self.memory.children.get(child_execution_id)
        if row is None or row.finish_remaining != 0 or row.wake_claimed_by is None:
            return False
        row.parent_woken_at = self.clock.now()
        return True


class WakeClaimNeverRunsOut(InMemoryChildExecutionQueueRepository):
    """Claims a wake for good."""

    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        return await super().claim_wake(child_execution_id, claimer, MAX_DURATION_MS)


class ReadThenClaimWake(InMemoryChildExecutionQueueRepository):
    """Reads whether the wake is free, awaits, then claims it."""

    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        row = self.memory.children.get(child_execution_id)
        free = row is not None and row.finish_remaining == 0 and row.wake_claimed_by is None
        await asyncio.sleep(0)
        if not free or row is None:
            return row is not None and row.wake_claimed_by == claimer
        row.wake_claimed_by, row.wake_claimed_until = claimer, self.clock.now() + claim_ms
        return True


class CountThenWait(InMemoryChildExecutionQueueRepository):
    """Counts the child's unfinished children, awaits, then moves it to waiting: the last
    finish in between finds it running and wakes nothing."""

    async def wait_for_children(self, child_execution_id: str, *, attempt: int) -> Any:
        row = self.memory.children.get(child_execution_id)
        if row is None or row.status is not ChildStatus.RUNNING or row.attempt != attempt:
            return await super().wait_for_children(child_execution_id, attempt=attempt)
        remaining = self._unfinished_children(row.tenant_id, child_execution_id)
        await asyncio.sleep(0)
        if remaining == 0:
            return WaitResult(False, 0)
        row.status = ChildStatus.WAITING
        return WaitResult(True, remaining)


class FinishLeavesWaitingParent(InMemoryChildExecutionQueueRepository):
    """The last finish does not make a waiting parent claimable again."""

    def _wake_waiting(self, tenant_id: str, parent_execution_id: str) -> None:
        return None


class ClaimsWaitingChildren(InMemoryChildExecutionQueueRepository):
    """Claims a waiting child as if it were queued."""

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        for row in self.memory.children.values():
            if row.status is ChildStatus.WAITING:
                row.status = ChildStatus.QUEUED
        return await super().claim(instance_id)


class RescuesWaitingChildren(InMemoryChildExecutionQueueRepository):
    """Lists a waiting child with the running ones (the rescue would take it)."""

    async def running(self, limit: int) -> Any:
        waiting = [r for r in self.memory.children.values() if r.status is ChildStatus.WAITING]
        for row in waiting:
            row.status = ChildStatus.RUNNING
        try:
            return await super().running(limit)
        finally:
            for row in waiting:
                row.status = ChildStatus.WAITING


class RestartWithoutCompare(InMemoryChildExecutionQueueRepository):
    """Restarts whatever attempt is running."""

    async def restart(self, child_execution_id: str, attempt: int) -> ClaimedChild | None:
        current = await _running(self, child_execution_id)
        if current is None:
            return None
        return await super().restart(child_execution_id, current.attempt)


UNLIMITED = 10**12


class CountThenTakeSlot(InMemoryRateLimitRepository):
    """Counts (a take given back), awaits, then takes whatever the count."""

    async def acquire_slot(self, key: str, holder: str, max_slots: int, ttl_ms: int) -> bool:
        if not await super().acquire_slot(key, holder, max_slots, ttl_ms):
            return False
        await super().release_slot(key, holder)
        await asyncio.sleep(0)
        return await super().acquire_slot(key, holder, UNLIMITED, ttl_ms)


class SlotLiveThroughItsEnd(InMemoryRateLimitRepository):
    """A slot counts 1 ms past its end."""

    async def acquire_slot(self, key: str, holder: str, max_slots: int, ttl_ms: int) -> bool:
        return await super().acquire_slot(key, holder, max_slots, ttl_ms + 1)


class AddsRefusedAmounts(InMemoryRateLimitRepository):
    """Refuses, but adds the amount anyway."""

    async def add_to_window(
        self, key: str, window_ms: int, amount: int, limit: int
    ) -> WindowResult:
        got = await super().add_to_window(key, window_ms, amount, limit)
        if got.allowed:
            return got
        added = await super().add_to_window(key, window_ms, amount, UNLIMITED)
        return WindowResult(False, added.used, added.resets_at)


class ReadThenAddWindow(InMemoryRateLimitRepository):
    """Reads the window, awaits, then adds what fitted the reading."""

    async def add_to_window(
        self, key: str, window_ms: int, amount: int, limit: int
    ) -> WindowResult:
        read = await super().add_to_window(key, window_ms, UNLIMITED, limit)
        await asyncio.sleep(0)
        if read.used + amount > limit:
            return read
        return await super().add_to_window(key, window_ms, amount, UNLIMITED)


class ShortensPauses(InMemoryRateLimitRepository):
    """The last pause wins."""

    async def pause_until(self, key: str, until: int) -> None:
        self.memory.rate_pauses[key] = until


class CheckThenComplete(InMemoryExecutionRecordRepository):
    """Reads the status, awaits, then completes and says it did."""

    async def complete(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        final: ExecutionRecordStatus,
        outcome: Any,
    ) -> bool:
        record = await self.get(tenant_id, execution_id)
        if record is None or record.status != expected:
            return False
        await asyncio.sleep(0)
        await super().complete(tenant_id, execution_id, expected, final, outcome)
        return True


class CompleteForgetsRetries(InMemoryExecutionRecordRepository):
    """Answers a retried complete False, like a lost race."""

    async def complete(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        final: ExecutionRecordStatus,
        outcome: Any,
    ) -> bool:
        return self._move(tenant_id, execution_id, expected, final, outcome, with_outcome=True)


class CompleteTrueOnceFinal(InMemoryExecutionRecordRepository):
    """Answers True for any complete of a run in the final status asked, whatever outcome."""

    async def complete(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        final: ExecutionRecordStatus,
        outcome: Any,
    ) -> bool:
        if await super().complete(tenant_id, execution_id, expected, final, outcome):
            return True
        record = await self.get(tenant_id, execution_id)
        return record is not None and record.status == final


class RecordsOfAnyTenant(InMemoryExecutionRecordRepository):
    """Finds a record by its execution id alone."""

    async def get(self, tenant_id: str, execution_id: str) -> ExecutionRecord | None:
        for status in ExecutionRecordStatus:
            for record in await self.find_by_status(status, 1_000_000):
                if record.execution_id == execution_id:
                    return record
        return None


class CheckThenSaveKey(InMemoryExecutionTreeRepository):
    """Reads the key, awaits, then writes it and says it did."""

    async def save_if_absent(
        self, tenant_id: str, root_execution_id: str, key: str, value: Any
    ) -> bool:
        if await self.get(tenant_id, root_execution_id, key) is not None:
            return False
        await asyncio.sleep(0)
        await super().save_if_absent(tenant_id, root_execution_id, key, value)
        return True


class LikeWithoutEscape(InMemoryExecutionTreeRepository):
    """Lists with `LIKE prefix%` without escaping `%` and `_`."""

    async def list(
        self, tenant_id: str, root_execution_id: str, prefix: str = ""
    ) -> dict[str, Any]:
        pattern = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in prefix)
        everything = await super().list(tenant_id, root_execution_id)
        return {k: v for k, v in everything.items() if re.match(pattern, k, re.S)}


class CheckThenInsertRequest(InMemoryMeshRequestRepository):
    """Reads the key, awaits, then inserts and says it created the request."""

    async def save_if_absent(
        self, idempotency_key: str, tenant_id: str, fingerprint: str, received_at: int
    ) -> MeshRequestSaved:
        found = await self.get(tenant_id, idempotency_key)
        if found is not None:
            return await super().save_if_absent(
                idempotency_key, tenant_id, fingerprint, received_at
            )
        await asyncio.sleep(0)
        saved = await super().save_if_absent(idempotency_key, tenant_id, fingerprint, received_at)
        return MeshRequestSaved(saved.request, True)


class IgnoresFingerprints(InMemoryMeshRequestRepository):
    """Answers the stored request whatever the fingerprint."""

    async def save_if_absent(
        self, idempotency_key: str, tenant_id: str, fingerprint: str, received_at: int
    ) -> MeshRequestSaved:
        found = await self.get(tenant_id, idempotency_key)
        if found is not None:
            return MeshRequestSaved(found, False)
        return await super().save_if_absent(idempotency_key, tenant_id, fingerprint, received_at)


class CheckThenResolve(InMemoryPausedExecutionRepository):
    """Reads the status, awaits, then resolves and answers as if it did."""

    async def resolve(self, tenant_id: str, pause_id: str, decision: Any) -> PausedExecution:
        pause = await self.get(tenant_id, pause_id)
        if pause is None or pause.status is not PauseStatus.PENDING:
            raise NotPausedError()
        await asyncio.sleep(0)
        try:
            return await super().resolve(tenant_id, pause_id, decision)
        except NotPausedError:
            return dataclasses.replace(pause, status=PauseStatus.RESOLVED, decision=decision)


class TakeForgetsTaker(InMemoryPausedExecutionRepository):
    """Takes without recording who took it: a retry answers False."""

    async def take(self, tenant_id: str, pause_id: str, *, taker: str | None = None) -> bool:
        return await super().take(tenant_id, pause_id)


class TakeByAnyTaker(InMemoryPausedExecutionRepository):
    """Answers True to any taker of a taken pause."""

    async def take(self, tenant_id: str, pause_id: str, *, taker: str | None = None) -> bool:
        if await super().take(tenant_id, pause_id, taker=taker):
            return True
        pause = await self.get(tenant_id, pause_id)
        return taker is not None and pause is not None and pause.status is PauseStatus.TAKEN


class PurgeByCreation(InMemoryPausedExecutionRepository):
    """Measures a pause's age from its creation, not its last move."""

    async def purge(self, older_than: int) -> int:
        old = [
            key
            for key, row in self.memory.pauses.items()
            if row.pause.status in (PauseStatus.TAKEN, PauseStatus.CANCELLED)
            and row.pause.created_at < older_than
        ]
        for key in old:
            del self.memory.pauses[key]
        return len(old)


class CountsEveryRecord(InMemoryCostLedgerRepository):
    """Records a replayed entry again."""

    async def record(self, entry: CostEntry) -> bool:
        unique = f"{entry.entry_id}#{next(_replays)}"
        return await super().record(dataclasses.replace(entry, entry_id=unique))


_replays = itertools.count()


class SumThenReserve(InMemoryCostLedgerRepository):
    """Sums the total, awaits, then reserves what fitted the sum."""

    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        spent = (await self.total(scope, key, tenant_id=tenant_id)).cost_micros
        if spent + amount_micros > limit_micros:
            return False
        await asyncio.sleep(0)
        return await super().try_reserve(scope, key, amount_micros, UNLIMITED, tenant_id=tenant_id)


class ReservationsOnly(InMemoryCostLedgerRepository):
    """Holds the limit against its reservations, not the recorded spend."""

    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        reserved: dict[tuple[str, str | None, str], int] = vars(self.memory).setdefault(
            "reserved_only", {}
        )
        slot = (scope, tenant_id, key)
        if reserved.get(slot, 0) + amount_micros > limit_micros:
            return False
        reserved[slot] = reserved.get(slot, 0) + amount_micros
        return await super().try_reserve(scope, key, amount_micros, UNLIMITED, tenant_id=tenant_id)


class CursorByTimeOnly(InMemoryExecutionHistoryRepository):
    """Continues a page after the cursor's finished_at alone."""

    async def list(
        self,
        tenant_id: str,
        *,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        after: HistoryCursor | None = None,
    ) -> list[ExecutionSnapshot]:
        found = list(await super().list(tenant_id, since=since, until=until, limit=1_000_000))
        if after is not None:
            found = [s for s in found if s.finished_at < after.finished_at]
        return found[:limit]


class UntilInclusive(InMemoryExecutionHistoryRepository):
    """Lists runs finished at `until` too."""

    async def list(
        self,
        tenant_id: str,
        *,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        after: HistoryCursor | None = None,
    ) -> list[ExecutionSnapshot]:
        wider = None if until is None else until + 1
        found = await super().list(tenant_id, since=since, until=wider, limit=limit, after=after)
        return list(found)


WAIT_CASE = "waits for its children unclaimed and unrescued until the last one finishes"

BROKEN = [
    (
        "child_queue",
        "never loses the wake of a wait raced by the last finish",
        CountThenWait,
        "wait-wake",
    ),
    ("child_queue", WAIT_CASE, FinishLeavesWaitingParent, "wait-wake"),
    ("child_queue", WAIT_CASE, ClaimsWaitingChildren, "wait-state"),
    ("child_queue", WAIT_CASE, RescuesWaitingChildren, "wait-state"),
    (
        "child_queue",
        "never gives one child to two concurrent claimers",
        ClaimThenMark,
        "claim-once",
    ),
    (
        "child_queue",
        "claims every queued child when claimers outnumber them",
        NoneWhenItsPickIsTaken,
        "claim-when-queued",
    ),
    ("child_queue", "claims deepest first, then oldest", OldestFirst, "claim-order"),
    (
        "child_queue",
        "wakes the parent exactly once among concurrent finishers",
        FinishThenCount,
        "one-wake",
    ),
    (
        "child_queue",
        "ignores a superseded attempt's late finish",
        FinishAnyAttempt,
        "superseded-finish",
    ),
    (
        "child_queue",
        "lets only the current attempt win a finish race",
        FinishAnyAttempt,
        "superseded-finish",
    ),
    (
        "child_queue",
        "restarts a running child by compare-and-set on its attempt",
        RestartWithoutCompare,
        "restart-cas",
    ),
    (
        "child_queue",
        "lets one of concurrent restarts of one attempt win",
        RestartWithoutCompare,
        "restart-cas",
    ),
    (
        "child_queue",
        "answers a retried finish of one attempt as the first",
        RefusesARetriedFinish,
        "finish-retry",
    ),
    (
        "child_queue",
        "answers a retried finish of one attempt as the first",
        RecountsARetriedFinish,
        "finish-retry",
    ),
    (
        "child_queue",
        "claims and marks the parent's wake once",
        ClaimWakeWithoutCompare,
        "wake-claim",
    ),
    ("child_queue", "claims and marks the parent's wake once", MarkWokenByAnyone, "wake-claim"),
    (
        "child_queue",
        "hands a run-out wake claim to another claimer",
        WakeClaimNeverRunsOut,
        "wake-claim-expiry",
    ),
    (
        "child_queue",
        "hands a run-out wake claim to another claimer",
        ClaimWakeWithoutCompare,
        "wake-claim-expiry",
    ),
    (
        "child_queue",
        "lets one of concurrent wake claimers win",
        ReadThenClaimWake,
        "wake-claim",
    ),
    (
        "rate_limit",
        "never exceeds max slots under 20 concurrent acquires",
        CountThenTakeSlot,
        "slots-within-max",
    ),
    ("rate_limit", "does not count an expired slot", SlotLiveThroughItsEnd, "expired-slot"),
    (
        "rate_limit",
        "never exceeds a window's limit and does not add a refused amount",
        AddsRefusedAmounts,
        "refused-not-added",
    ),
    (
        "rate_limit",
        "never exceeds a window's limit under concurrent adds",
        ReadThenAddWindow,
        "window-within-limit",
    ),
    (
        "rate_limit",
        "never shortens a pause, and reads None once it is over",
        ShortensPauses,
        "pause-never-shortens",
    ),
    (
        "rate_limit",
        "keeps the longest of concurrent pauses",
        ShortensPauses,
        "pause-never-shortens",
    ),
    (
        "execution_record",
        "lets one of two concurrent completes win",
        CheckThenComplete,
        "one-outcome",
    ),
    ("execution_record", "keeps tenants apart", RecordsOfAnyTenant, "tenant-isolation"),
    (
        "execution_record",
        "answers a retried complete as the first",
        CompleteForgetsRetries,
        "complete-retry",
    ),
    (
        "execution_record",
        "answers a retried complete as the first",
        CompleteTrueOnceFinal,
        "complete-retry",
    ),
    ("execution_tree", "writes a key once under concurrent writers", CheckThenSaveKey, "save-once"),
    (
        "execution_tree",
        "lists by a literal prefix: %, _ and backslash match only themselves",
        LikeWithoutEscape,
        "prefix-literal",
    ),
    (
        "mesh_request",
        "creates a request once under concurrent saves",
        CheckThenInsertRequest,
        "create-once",
    ),
    (
        "mesh_request",
        "refuses a key with another fingerprint",
        IgnoresFingerprints,
        "fingerprint-conflict",
    ),
    (
        "paused_execution",
        "resolves a pause once across concurrent answers on two instances",
        CheckThenResolve,
        "resolve-once",
    ),
    (
        "paused_execution",
        "answers a retried take by its taker as the first",
        TakeForgetsTaker,
        "take-retry",
    ),
    (
        "paused_execution",
        "answers a retried take by its taker as the first",
        TakeByAnyTaker,
        "take-retry",
    ),
    (
        "paused_execution",
        "purges only taken and cancelled pauses past retention",
        PurgeByCreation,
        "purge-retention",
    ),
    ("cost_ledger", "records an entry once", CountsEveryRecord, "record-once"),
    (
        "cost_ledger",
        "never reserves past the limit under 50 concurrent reservations",
        SumThenReserve,
        "reserve-within-limit",
    ),
    (
        "cost_ledger",
        "counts recorded spend against a reservation",
        ReservationsOnly,
        "reserve-counts-spend",
    ),
    (
        "execution_history",
        "lists newest first in keyset pages, without skip or repeat over equal finished_at",
        CursorByTimeOnly,
        "page-no-skip-no-repeat",
    ),
    (
        "execution_history",
        "lists runs finished from since and before until",
        UntilInclusive,
        "since-until",
    ),
]


@pytest.mark.parametrize(
    ("contract", "name", "broken", "rule"),
    BROKEN,
    ids=[f"{broken.__name__} breaks {rule}" for _, _, broken, rule in BROKEN],
)
async def test_a_broken_store_fails_the_case_on_the_rule_it_breaks(
    contract: str, name: str, broken: Callable[..., Any], rule: str
) -> None:
    [case] = [c for c in CASES if (c.contract, c.name) == (contract, name)]
    backend = InMemoryBackend()
    ctx = CaseContext({contract: _factory(broken, backend)})
    with pytest.raises(AssertionError, match=rf"^\[{re.escape(rule)}\] "):
        await case.run(ctx)
