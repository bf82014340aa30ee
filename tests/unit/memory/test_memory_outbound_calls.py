"""The in-memory outbound call store keeps every promise of `OutboundCallRepository` (3.4)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from memory_cluster import LEASE_MS, START, TENANT, Cluster, key_of

from agboss_sql.contracts import (
    AttemptRef,
    ExecutionFencedError,
    ExecutionLease,
    FencedEffectKey,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
    InvalidIdentifierError,
    LeaseHolder,
    LeaseState,
    OutboundCallStatus,
    attempt_owner_of,
    pending_outbound_call_of,
)

INTENT = {"amount": 100, "currency": "EUR"}


async def _lease(cluster: Cluster, instance: int = 1, execution: str = "tree-1") -> ExecutionLease:
    lease = await cluster.leases(instance).acquire(TENANT, execution, LEASE_MS)
    assert lease is not None
    return lease


async def _recorded(cluster: Cluster, instance: int = 1) -> tuple[FencedEffectKey, AttemptRef]:
    lease = await _lease(cluster, instance)
    key = key_of(lease, "pay", business_key="order-1", fingerprint="f")
    saved = await cluster.calls(instance).save_if_absent(key, INTENT, START)
    return key, saved.call.attempt_ref


async def test_get_of_an_unknown_key_is_none(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    assert await cluster.calls(1).get(key_of(lease, "pay")) is None


async def test_save_if_absent_records_the_pending_intent_once(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease, "pay")
    calls = cluster.calls(1)
    saved = await calls.save_if_absent(key, INTENT, START - 5)
    assert saved.created is True
    assert saved.call == pending_outbound_call_of(key, INTENT, START - 5)
    assert saved.call.status is OutboundCallStatus.PENDING
    assert (saved.call.attempt, saved.call.attempt_owner) == (0, attempt_owner_of(key))
    again = await calls.save_if_absent(key, {"other": True}, START)
    assert again.created is False
    assert again.call == saved.call
    assert await calls.get(key) == saved.call


async def test_the_stored_intent_is_a_copy(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease, "pay")
    intent = {"items": [1]}
    saved = await cluster.calls(1).save_if_absent(key, intent, START)
    intent["items"].append(2)
    saved.call.intent["items"].append(3)
    stored = await cluster.calls(1).get(key)
    assert stored is not None and stored.intent == {"items": [1]}


async def test_a_non_json_intent_is_refused(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    with pytest.raises(TypeError):
        await cluster.calls(1).save_if_absent(key_of(lease, "pay"), {"at": object()}, START)
    assert cluster.backend.outbound_calls == {}


async def test_a_business_key_is_one_call_for_every_execution_of_the_tenant(
    cluster: Cluster,
) -> None:
    first = await _lease(cluster, 1, "tree-1")
    second = await _lease(cluster, 2, "tree-2")
    key_1 = key_of(first, "pay", business_key="order-1", fingerprint="f")
    key_2 = key_of(second, "pay", business_key="order-1", fingerprint="f")
    created = await cluster.calls(1).save_if_absent(key_1, INTENT, START)
    found = await cluster.calls(2).save_if_absent(key_2, INTENT, START)
    assert found.created is False
    assert found.call == created.call
    assert await cluster.calls(2).get(key_2) == created.call


async def test_another_fingerprint_under_a_business_key_is_a_conflict(cluster: Cluster) -> None:
    first = await _lease(cluster, 1, "tree-1")
    second = await _lease(cluster, 2, "tree-2")
    await cluster.calls(1).save_if_absent(
        key_of(first, "pay", business_key="order-1", fingerprint="f1"), INTENT, START
    )
    with pytest.raises(IdempotencyKeyConflictError):
        await cluster.calls(2).save_if_absent(
            key_of(second, "pay", business_key="order-1", fingerprint="f2"), INTENT, START
        )


async def test_the_keys_rules_are_checked_first(cluster: Cluster) -> None:
    ghost = ExecutionLease(TENANT, "tree-1", "instance-1", 1, LEASE_MS)
    calls = cluster.calls(1)
    bad_name = dataclasses.replace(key_of(ghost, "pay"), name="no spaces")
    bad_business = dataclasses.replace(key_of(ghost, "pay"), business_key=" ")
    ref = AttemptRef(OutboundCallStatus.PENDING, 0, "x")
    for bad, error in (
        (bad_name, InvalidFencedEffectNameError),
        (bad_business, InvalidBusinessKeyError),
    ):
        with pytest.raises(error):
            await calls.get(bad)
        with pytest.raises(error):
            await calls.save_if_absent(bad, INTENT, START)
        with pytest.raises(error):
            await calls.mark_pending(bad, ref, "owner")
        with pytest.raises(error):
            await calls.mark_completed(bad, ref, {})
        with pytest.raises(error):
            await calls.mark_failed(bad, ref, {})
    assert cluster.backend.fence_marks == {}


# the lease and mark check on every fenced method


async def test_every_fenced_method_refuses_a_zombie(cluster: Cluster) -> None:
    key, ref = await _recorded(cluster, 1)
    await cluster.clock.advance(LEASE_MS)
    await _lease(cluster, 2)
    calls = cluster.calls(1)
    with pytest.raises(ExecutionFencedError, match="superseded"):
        await calls.save_if_absent(key_of(key_lease(key), "other"), INTENT, START)
    with pytest.raises(ExecutionFencedError):
        await calls.mark_pending(key, ref, attempt_owner_of(key))
    with pytest.raises(ExecutionFencedError):
        await calls.mark_completed(key, ref, {"ok": True})
    with pytest.raises(ExecutionFencedError):
        await calls.mark_failed(key, ref, {"error": "x"})
    stored = await calls.get(key)
    assert stored is not None and stored.attempt_ref == ref


def key_lease(key: FencedEffectKey) -> ExecutionLease:
    return ExecutionLease(key.tenant_id, key.lease_execution_id, "instance-1", key.token, 0)


@pytest.mark.parametrize(("offset", "allowed"), [(-1, True), (0, False), (1, False)])
async def test_a_fenced_call_at_the_expiry_boundary(
    cluster: Cluster, offset: int, allowed: bool
) -> None:
    lease = await _lease(cluster)
    await cluster.clock.advance(LEASE_MS + offset)
    key = key_of(lease, "pay")
    if allowed:
        assert (await cluster.calls(1).save_if_absent(key, INTENT, START)).created
    else:
        with pytest.raises(ExecutionFencedError, match="expired"):
            await cluster.calls(1).save_if_absent(key, INTENT, START)
        assert cluster.backend.outbound_calls == {}


async def test_the_fence_raises_the_scopes_mark(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease, "pay")
    await cluster.calls(1).save_if_absent(key, INTENT, START)
    assert cluster.backend.fence_marks == {key.scope_key: 1}
    cluster.backend.fence_marks[key.scope_key] = 3
    with pytest.raises(ExecutionFencedError, match="mark-above-token"):
        await cluster.calls(1).save_if_absent(key, INTENT, START)
    # A read is not fenced.
    assert await cluster.calls(1).get(key) is not None


# attempts: compare-and-set


async def test_mark_pending_claims_the_next_attempt_once(cluster: Cluster) -> None:
    key, ref = await _recorded(cluster)
    calls = cluster.calls(1)
    await cluster.clock.advance(7)
    assert await calls.mark_pending(key, ref, "owner-a") is True
    assert await calls.mark_pending(key, ref, "owner-b") is False
    stored = await calls.get(key)
    assert stored is not None
    assert stored.attempt_ref == AttemptRef(OutboundCallStatus.PENDING, 1, "owner-a")
    assert stored.updated_at == START + 7
    assert stored.recorded_at == START


async def test_two_concurrent_claims_of_one_attempt_give_one_winner(cluster: Cluster) -> None:
    key, ref = await _recorded(cluster)
    claims = await asyncio.gather(
        *(cluster.calls(1).mark_pending(key, ref, f"owner-{i}") for i in range(10))
    )
    assert claims.count(True) == 1
    stored = await cluster.calls(1).get(key)
    assert stored is not None and stored.attempt == 1


async def test_mark_pending_of_an_unknown_call_is_false(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease, "pay")
    ref = AttemptRef(OutboundCallStatus.PENDING, 0, attempt_owner_of(key))
    assert await cluster.calls(1).mark_pending(key, ref, "o") is False
    assert await cluster.calls(1).mark_completed(key, ref, {}) is False


async def test_mark_completed_ends_the_current_attempt_once(cluster: Cluster) -> None:
    key, ref = await _recorded(cluster)
    calls = cluster.calls(1)
    assert await calls.mark_pending(key, ref, "owner-a")
    current = AttemptRef(OutboundCallStatus.PENDING, 1, "owner-a")
    assert await calls.mark_completed(key, ref, {"id": "ch_1"}) is False  # the old attempt
    assert await calls.mark_completed(key, current, {"id": "ch_1"}) is True
    assert await calls.mark_completed(key, current, {"id": "ch_2"}) is False
    assert await calls.mark_failed(key, current, {"e": 1}) is False
    stored = await calls.get(key)
    assert stored is not None
    assert (stored.status, stored.response, stored.error) == (
        OutboundCallStatus.COMPLETED,
        {"id": "ch_1"},
        None,
    )


async def test_mark_failed_ends_the_current_attempt_and_a_new_attempt_follows(
    cluster: Cluster,
) -> None:
    key, ref = await _recorded(cluster)
    calls = cluster.calls(1)
    assert await calls.mark_pending(key, ref, "owner-a")
    current = AttemptRef(OutboundCallStatus.PENDING, 1, "owner-a")
    assert await calls.mark_failed(key, current, {"error": "timeout"}) is True
    stored = await calls.get(key)
    assert stored is not None
    assert stored.attempt_ref == AttemptRef(OutboundCallStatus.FAILED, 1, "owner-a")
    assert stored.error == {"error": "timeout"}
    assert await calls.mark_pending(key, stored.attempt_ref, "owner-b")
    retried = await calls.get(key)
    assert retried is not None
    assert retried.attempt_ref == AttemptRef(OutboundCallStatus.PENDING, 2, "owner-b")
    assert retried.error is None


async def test_an_attempt_with_another_owner_cannot_be_ended(cluster: Cluster) -> None:
    key, ref = await _recorded(cluster)
    calls = cluster.calls(1)
    assert await calls.mark_pending(key, ref, "owner-a")
    wrong_owner = AttemptRef(OutboundCallStatus.PENDING, 1, "owner-b")
    assert await calls.mark_completed(key, wrong_owner, {}) is False
    assert await calls.mark_failed(key, wrong_owner, {}) is False


async def test_an_ending_racing_a_newer_claim_both_orders(cluster: Cluster) -> None:
    for end_first in (True, False):
        cluster.backend.reset()
        key, ref = await _recorded(cluster)
        calls = cluster.calls(1)
        assert await calls.mark_pending(key, ref, "owner-a")
        first = AttemptRef(OutboundCallStatus.PENDING, 1, "owner-a")
        if end_first:
            assert await calls.mark_failed(key, first, {"e": 1})
            assert await calls.mark_pending(key, first, "owner-b") is False
        else:
            assert await calls.mark_pending(key, first, "owner-b")
            assert await calls.mark_failed(key, first, {"e": 1}) is False


async def test_the_next_holder_takes_over_an_intent_under_its_own_token(
    cluster: Cluster,
) -> None:
    key_1, _ = await _recorded(cluster, 1)
    await cluster.clock.advance(LEASE_MS)
    new = await _lease(cluster, 2)
    key_2 = key_of(new, "pay", business_key="order-1", fingerprint="f")
    calls = cluster.calls(2)
    found = await calls.save_if_absent(key_2, INTENT, START)
    assert found.created is False
    owner = found.call.attempt_owner
    assert owner == attempt_owner_of(key_1)
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    assert await calls.mark_pending(key_2, found.call.attempt_ref, attempt_owner_of(key_2))
    stored = await calls.get(key_2)
    assert stored is not None and stored.attempt_owner == attempt_owner_of(key_2)


# lease_state_of


async def test_lease_state_of_an_absent_lease(cluster: Cluster) -> None:
    assert await cluster.calls(1).lease_state_of(TENANT, "tree-1", 1) is LeaseState.ABSENT


async def test_lease_state_of_a_token_never_granted_is_absent(cluster: Cluster) -> None:
    await _lease(cluster)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 2) is LeaseState.ABSENT


async def test_lease_state_of_live_released_finished_and_superseded(cluster: Cluster) -> None:
    calls = cluster.calls(2)
    live = await _lease(cluster, 1, "tree-live")
    assert await calls.lease_state_of(TENANT, "tree-live", live.lease_epoch) is LeaseState.LIVE
    released = await _lease(cluster, 1, "tree-released")
    await cluster.leases(1).release(released)
    assert await calls.lease_state_of(TENANT, "tree-released", 1) is LeaseState.RELEASED
    finished = await _lease(cluster, 1, "tree-finished")
    await cluster.leases(1).finish(finished)
    assert await calls.lease_state_of(TENANT, "tree-finished", 1) is LeaseState.FINISHED
    await cluster.leases(1).release(live)
    await _lease(cluster, 3, "tree-live")
    assert await calls.lease_state_of(TENANT, "tree-live", 1) is LeaseState.SUPERSEDED
    assert await calls.lease_state_of(TENANT, "tree-live", 2) is LeaseState.LIVE


async def test_a_yielded_live_lease_is_live(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    await cluster.leases(1).yield_lease(lease)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1) is LeaseState.LIVE


@pytest.mark.parametrize(
    ("offset", "state"),
    [(-1, LeaseState.LIVE), (0, LeaseState.SUPERSEDED), (1, LeaseState.SUPERSEDED)],
)
async def test_lease_state_of_at_the_expiry_boundary(
    cluster: Cluster, offset: int, state: LeaseState
) -> None:
    await _lease(cluster)
    await cluster.clock.advance(LEASE_MS + offset)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1) is state


async def test_an_expired_lease_is_closed_in_the_same_step(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    await cluster.clock.advance(LEASE_MS)
    calls = cluster.calls(2)
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    row = cluster.backend.leases[(TENANT, "tree-1")]
    assert (row.released, row.closed_reason) == (True, "superseded")
    # The holder cannot revive it, and asking again gives the same answer.
    assert await cluster.leases(1).renew(lease, LEASE_MS) is None
    assert await cluster.leases(1).release(lease) is False
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    # The next take names the holder whose lease ran out.
    taken = await cluster.leases(1).acquire(TENANT, "tree-1", LEASE_MS)
    assert taken is not None and taken.taken_over_from == LeaseHolder("instance-1", 1)


async def test_lease_state_of_against_a_late_renewal_both_orders(cluster: Cluster) -> None:
    # The renewal lands first (still live): the lease is live.
    lease = await _lease(cluster, 1, "tree-a")
    await cluster.clock.advance(LEASE_MS - 1)
    assert await cluster.leases(1).renew(lease, LEASE_MS) == LEASE_MS
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-a", 1) is LeaseState.LIVE
    # lease_state_of lands first (expired): the renewal is refused.
    lease = await _lease(cluster, 1, "tree-b")
    await cluster.clock.advance(LEASE_MS)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-b", 1) is LeaseState.SUPERSEDED
    assert await cluster.leases(1).renew(lease, LEASE_MS) is None


async def test_lease_state_of_against_a_take_both_orders(cluster: Cluster) -> None:
    await _lease(cluster, 1, "tree-a")
    await cluster.clock.advance(LEASE_MS)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-a", 1) is LeaseState.SUPERSEDED
    assert await _lease(cluster, 3, "tree-a")

    await _lease(cluster, 1, "tree-b")
    await cluster.clock.advance(LEASE_MS)
    await _lease(cluster, 3, "tree-b")
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-b", 1) is LeaseState.SUPERSEDED
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-b", 2) is LeaseState.LIVE


async def test_lease_state_of_against_a_finish_both_orders(cluster: Cluster) -> None:
    lease = await _lease(cluster, 1, "tree-a")
    await cluster.leases(1).finish(lease)
    await cluster.clock.advance(LEASE_MS)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-a", 1) is LeaseState.FINISHED

    lease = await _lease(cluster, 1, "tree-b")
    await cluster.clock.advance(LEASE_MS)
    assert await cluster.calls(2).lease_state_of(TENANT, "tree-b", 1) is LeaseState.SUPERSEDED
    assert await cluster.leases(1).finish(lease) is False


async def test_lease_state_of_checks_its_arguments(cluster: Cluster) -> None:
    calls = cluster.calls(1)
    with pytest.raises(ValueError):
        await calls.lease_state_of(TENANT, "tree-1", "1")  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError, match="execution_id"):
        await calls.lease_state_of(TENANT, "", 1)
