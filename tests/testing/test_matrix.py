"""The fencing matrix: generated from one table, so every fencing store meets every lease
state with every write, every lease move meets every state, and the child queue's restart
and finish meet every child state; and it bites store sets that break one rule each."""

from __future__ import annotations

import dataclasses
from typing import Any

from conformance_runner import failures, memory_set, run_class

from agboss_sql.contracts.rules import checked_lease
from agboss_sql.contracts.types import (
    ExecutionLease,
    FencedEffectKey,
    FencedEffectResult,
    FinishResult,
    JsonValue,
)
from agboss_sql.memory import (
    InMemoryChildExecutionQueueRepository,
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryOutboundCallRepository,
)
from agboss_sql.memory._fencing import store_now
from agboss_sql.testing.contracts import StoreFactory, generated_cases, store_conformance
from agboss_sql.testing.contracts._matrix import (
    CHILD_STATES,
    LEASE_STATES,
    MOVE_ONLY_STATES,
    MOVES,
    WRITE_ONLY_STATES,
    WRITES,
)
from agboss_sql.testing.contracts._matrix_keyed import LOG_TABLE
from agboss_sql.testing.contracts._matrix_wakes import WAKE_TABLE


def _set(classes: dict[str, type[Any]] | None = None, queue: type[Any] | None = None) -> type:
    chosen = memory_set(classes)
    backend = chosen.backend

    async def reset() -> None:
        backend.reset()

    cls = queue or InMemoryChildExecutionQueueRepository
    stores = {
        **chosen.stores,
        "child_queue": StoreFactory(
            lambda seam: cls(backend, seam.clock, seam.application), reset=reset
        ),
    }
    return store_conformance(
        name="matrix set",
        stores=stores,
        business_rows=chosen.business_rows,
        interleavings=False,
    )


def _matrix_cases(cls: type, contract: str) -> list[str]:
    return [name for name in generated_cases(cls) if name.startswith(f"test_{contract}__matrix_")]


def test_every_write_meets_every_state_and_every_move_every_state() -> None:
    cls = _set()
    effect = _matrix_cases(cls, "fenced_effect")
    call = _matrix_cases(cls, "outbound_call")
    lease = _matrix_cases(cls, "execution_lease")
    queue = [n for n in _matrix_cases(cls, "child_queue") if "_at_an_attempt_of_a_child_" in n]
    writes = {w.contract: 0 for w in WRITES}
    for write in WRITES:
        writes[write.contract] += 1
    states = len(LEASE_STATES) + len(WRITE_ONLY_STATES)
    assert len(effect) == writes["fenced_effect"] * states
    assert len(call) == writes["outbound_call"] * states == 4 * 12
    assert len(lease) == len(MOVES) * (len(LEASE_STATES) + len(MOVE_ONLY_STATES)) == 70
    assert len(queue) == 2 * len(CHILD_STATES)
    states = {
        "live",
        "expired",
        "released",
        "yielded",
        "finished",
        "superseded by a takeover",
        "absent",
        "the same execution's lease in another tenant",
    }
    assert states <= {state.name for state in LEASE_STATES}


async def test_the_sound_set_passes_the_matrix() -> None:
    results = await run_class(_set(), only="__matrix_", real_time=False)
    # The coordination matrix's rows of the queue and the lease log, in this set too.
    wakes = len(WAKE_TABLE.ops) * len(WAKE_TABLE.states) + len(LOG_TABLE.ops) * len(
        LOG_TABLE.states
    )
    assert len(results) == 12 + 4 * 12 + 70 + 2 * len(CHILD_STATES) + wakes
    assert failures(results) == {}


# --- sets that break one rule each --------------------------------------------------------


class RenewIgnoresYield(InMemoryExecutionLeaseRepository):
    """A renewal that does not look at `yielded`."""

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        row = self.memory.leases.get((lease.tenant_id, lease.execution_id))
        if row is None or not row.yielded:
            return await super().renew(lease, lease_ms)
        row.yielded = False
        try:
            return await super().renew(lease, lease_ms)
        finally:
            row.yielded = True


class LetGoByHolderOnly(InMemoryExecutionLeaseRepository):
    """`release` and `finish` that match the holder instance, not the epoch."""

    def _current(self, lease: ExecutionLease) -> ExecutionLease:
        row = self.memory.leases.get((lease.tenant_id, lease.execution_id))
        if row is not None and row.holder_instance_id == self.instance_id:
            return ExecutionLease(
                lease.tenant_id, lease.execution_id, self.instance_id, row.lease_epoch, 0
            )
        return lease

    async def release(self, lease: ExecutionLease) -> bool:
        return await super().release(self._current(lease))

    async def finish(self, lease: ExecutionLease) -> bool:
        return await super().finish(self._current(lease))


class EffectsIgnoreYield(InMemoryFencedEffectRepository):
    """A fence that lets a write through on a yielded lease."""

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Any
    ) -> FencedEffectResult[Any]:
        row = self.memory.leases.get((key.tenant_id, key.lease_execution_id))
        if row is None or not row.yielded:
            return await super().save_result_if_absent(key, work)
        row.yielded = False
        try:
            return await super().save_result_if_absent(key, work)
        finally:
            row.yielded = True


class FailsUnfenced(InMemoryOutboundCallRepository):
    """`mark_failed` whose fence lets an expired lease through."""

    async def mark_failed(self, key: FencedEffectKey, attempt: Any, error: JsonValue) -> bool:
        row = self.memory.leases.get((key.tenant_id, key.lease_execution_id))
        now = store_now(self.store_clock)
        if row is None or row.expires_at > now:
            return await super().mark_failed(key, attempt, error)
        old = row.expires_at
        row.expires_at = now + 1
        try:
            return await super().mark_failed(key, attempt, error)
        finally:
            row.expires_at = old


class QueueFinishWithoutCompare(InMemoryChildExecutionQueueRepository):
    """A finish that never compares the attempt."""

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> FinishResult:
        return await super().finish(child_execution_id, outcome)


class QueueRestartWithoutCompare(InMemoryChildExecutionQueueRepository):
    """A restart that takes whatever attempt the child is at."""

    async def restart(self, child_execution_id: str, attempt: int) -> Any:
        row = self.memory.children.get(child_execution_id)
        current = row.attempt if row is not None else attempt
        return await super().restart(child_execution_id, current)


def _expect(found: dict[str, str], rule: str, *cases: str) -> None:
    for case in cases:
        assert case in found, f"{case} passed; failures: {sorted(found)}"
        assert f"[{rule}]" in found[case], found[case]


async def test_a_renewal_that_ignores_a_yield_fails_its_row() -> None:
    found = failures(
        await run_class(_set({"execution_lease": RenewIgnoresYield}), only="__matrix_")
    )
    assert set(found) == {
        "test_execution_lease__matrix_renew_with_a_context_whose_lease_is_yielded"
    }, sorted(found)
    _expect(found, "no-stale-write", *found)


async def test_a_release_or_finish_by_holder_only_fails_the_older_epoch_rows() -> None:
    found = failures(
        await run_class(_set({"execution_lease": LetGoByHolderOnly}), only="__matrix_")
    )
    _expect(
        found,
        "no-stale-write",
        "test_execution_lease__matrix_release_with_a_context_whose_lease_is_an_older_epoch_of_the_same_holder",
        "test_execution_lease__matrix_finish_with_a_context_whose_lease_is_an_older_epoch_of_the_same_holder",
        "test_execution_lease__matrix_release_with_a_context_whose_lease_is_a_token_never_granted",
    )


async def test_a_fenced_effect_that_ignores_a_yield_fails_its_row() -> None:
    found = failures(await run_class(_set({"fenced_effect": EffectsIgnoreYield}), only="__matrix_"))
    assert set(found) == {
        "test_fenced_effect__matrix_save_result_if_absent_with_a_context_whose_lease_is_yielded"
    }, sorted(found)


async def test_an_unfenced_mark_failed_fails_its_row() -> None:
    found = failures(await run_class(_set({"outbound_call": FailsUnfenced}), only="__matrix_"))
    assert set(found) == {
        "test_outbound_call__matrix_mark_failed_with_a_context_whose_lease_is_expired"
    }, sorted(found)


class EffectsTrustTheEpoch(InMemoryFencedEffectRepository):
    """A fence that checks the epoch alone: whoever the key names, the write goes through
    under the lease's current holder."""

    async def save_result_if_absent(
        self, key: FencedEffectKey, work: Any
    ) -> FencedEffectResult[Any]:
        row = self.memory.leases.get((key.tenant_id, key.lease_execution_id))
        if row is not None and key.holder_instance_id is not None:
            key = dataclasses.replace(key, holder_instance_id=row.holder_instance_id)
        return await super().save_result_if_absent(key, work)


class CallsCheckAHolderOnlyWhenNamed(InMemoryOutboundCallRepository):
    """Outbound calls whose fence checks the holder only when the key names one (the fence
    before every key named its holder): a key built without one writes at any epoch."""

    def _named(self, key: FencedEffectKey) -> FencedEffectKey:
        row = self.memory.leases.get((key.tenant_id, key.lease_execution_id))
        if getattr(key, "holder_instance_id", None) is None and row is not None:
            return dataclasses.replace(key, holder_instance_id=row.holder_instance_id)
        return key

    async def save_if_absent(self, key: FencedEffectKey, intent: Any, recorded_at: int) -> Any:
        return await super().save_if_absent(self._named(key), intent, recorded_at)

    async def mark_pending(self, key: FencedEffectKey, expected: Any, owner: str) -> bool:
        return await super().mark_pending(self._named(key), expected, owner)

    async def mark_completed(self, key: FencedEffectKey, attempt: Any, response: Any) -> bool:
        return await super().mark_completed(self._named(key), attempt, response)

    async def mark_failed(self, key: FencedEffectKey, attempt: Any, error: JsonValue) -> bool:
        return await super().mark_failed(self._named(key), attempt, error)


class LeasesIgnoreTheNamedHolder(InMemoryExecutionLeaseRepository):
    """Lease moves that look at the store's instance and the epoch, not at the holder the
    lease names."""

    def _held(self, lease: ExecutionLease) -> Any:
        return super()._held(dataclasses.replace(lease, holder_instance_id=self.instance_id))


class LeasesIgnoreTheRowsHolder(InMemoryExecutionLeaseRepository):
    """Lease moves that check the lease names the store's instance, then find its row by
    tenant, execution and epoch alone: not by the holder the row names."""

    def _held(self, lease: ExecutionLease) -> Any:
        checked_lease(lease)
        row = self.memory.leases.get((lease.tenant_id, lease.execution_id))
        if (
            row is None
            or lease.holder_instance_id != self.instance_id
            or row.lease_epoch != lease.lease_epoch
        ):
            return None
        return row


async def test_a_fence_that_checks_the_epoch_alone_fails_the_holder_rows() -> None:
    found = failures(
        await run_class(_set({"fenced_effect": EffectsTrustTheEpoch}), only="__matrix_")
    )
    assert set(found) == {
        "test_fenced_effect__matrix_save_result_if_absent_with_a_context_whose_lease_is_the_holder_s_epoch_under_another_instance_s_name"
    }, sorted(found)
    _expect(found, "no-stale-write", *found)


async def test_a_fence_that_checks_a_holder_only_when_named_fails_the_no_holder_rows() -> None:
    found = failures(
        await run_class(_set({"outbound_call": CallsCheckAHolderOnlyWhenNamed}), only="__matrix_")
    )
    assert set(found) == {
        f"test_outbound_call__matrix_{write}_with_a_context_whose_lease_is_the_holder_s_epoch_in_a_key_that_names_no_holder"
        for write in ("save_if_absent", "mark_pending", "mark_completed", "mark_failed")
    }, sorted(found)
    _expect(found, "no-stale-write", *found)


async def test_moves_that_ignore_the_named_holder_fail_its_rows() -> None:
    found = failures(
        await run_class(_set({"execution_lease": LeasesIgnoreTheNamedHolder}), only="__matrix_")
    )
    assert set(found) == {
        f"test_execution_lease__matrix_{move}_with_a_context_whose_lease_is_{state}"
        for move in ("renew", "release", "yield", "finish")
        for state in (
            "the_holder_s_epoch_under_another_instance_s_name",
            "the_holder_s_epoch_in_a_context_that_names_no_instance",
        )
    }, sorted(found)
    _expect(found, "no-stale-write", *found)


async def test_moves_that_ignore_the_rows_holder_fail_the_claimed_epoch_rows() -> None:
    found = failures(
        await run_class(_set({"execution_lease": LeasesIgnoreTheRowsHolder}), only="__matrix_")
    )
    # Every move but the reclaim (the holder's lease is live, not yielded) is granted.
    assert set(found) == {
        f"test_execution_lease__matrix_{move}_with_a_context_whose_lease_is_the_holder_s_epoch_"
        "claimed_by_another_instance_in_its_own_name"
        for move in ("renew", "release", "yield", "finish")
    }, sorted(found)
    _expect(found, "no-stale-write", *found)


async def test_a_queue_finish_without_the_attempt_compare_fails_its_rows() -> None:
    found = failures(await run_class(_set(queue=QueueFinishWithoutCompare), only="__matrix_"))
    _expect(
        found,
        "finish-once",
        "test_child_queue__matrix_finish_at_an_attempt_of_a_child_running_at_a_later_attempt_restarted",
    )


async def test_a_queue_restart_without_the_attempt_compare_fails_its_rows() -> None:
    found = failures(await run_class(_set(queue=QueueRestartWithoutCompare), only="__matrix_"))
    _expect(
        found,
        "restart-cas",
        "test_child_queue__matrix_restart_at_an_attempt_of_a_child_running_at_a_later_attempt_restarted",
    )
