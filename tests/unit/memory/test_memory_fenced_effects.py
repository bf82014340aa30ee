"""What the in-memory fenced effect shows beyond its contract cases: the refusal reasons,
the fence marks and stored rows of its backend, the transaction handed to the work, and
rollback on failure, cancellation and results JSON cannot hold.

The promises of `FencedEffectRepository` (docs/contracts.md) are the `fenced_effect` contract
cases, run once on the in-memory set (tests/unit/test_conformance_memory.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import pytest
from memory_cluster import LEASE_MS, TENANT, Cluster, context_of, key_of

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionFencedError,
    ExecutionLease,
    FencedEffectResult,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
    InvalidIdentifierError,
    StepRef,
    StoreClock,
    fenced_effect_key_of,
    fenced_key_identity_of,
)
from agboss_sql.memory import (
    InMemoryBackend,
    InMemoryExecutionLeaseRepository,
    InMemoryFencedEffectRepository,
    InMemoryTransaction,
)


class Charge:
    """A work that writes one business row and answers a receipt; counts its runs."""

    def __init__(self, receipt: Any = None, row: Any = "charged") -> None:
        self.runs = 0
        self.receipt = {"receipt": "r-1"} if receipt is None else receipt
        self.row = row

    async def __call__(self, tx: InMemoryTransaction) -> Any:
        self.runs += 1
        tx.insert(self.row)
        return self.receipt


async def _lease(cluster: Cluster, instance: int = 1, execution: str = "tree-1") -> ExecutionLease:
    lease = await cluster.leases(instance).acquire(TENANT, execution, LEASE_MS)
    assert lease is not None
    return lease


def _nothing_written(cluster: Cluster) -> bool:
    backend = cluster.backend
    return not backend.business_rows and not backend.fenced_results and not backend.fence_marks


async def test_a_second_call_of_the_same_step_replays_the_stored_result(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease)
    charge = Charge(receipt=("a", 1))
    first = await cluster.effects(1).save_result_if_absent(key, charge)
    # Both answers are the stored JSON form of the value.
    assert first == FencedEffectResult(["a", 1], False, None)
    again = await cluster.effects(1).save_result_if_absent(key, charge)
    assert again == FencedEffectResult(["a", 1], True, None)
    assert charge.runs == 1
    assert cluster.backend.business_rows == ["charged"]


async def test_the_next_holder_replays_the_step_the_previous_holder_wrote(
    cluster: Cluster,
) -> None:
    old = await _lease(cluster, 1)
    await cluster.effects(1).save_result_if_absent(key_of(old), Charge())
    await cluster.clock.advance(LEASE_MS)
    new = await _lease(cluster, 2)
    charge = Charge()
    result = await cluster.effects(2).save_result_if_absent(key_of(new), charge)
    assert result == FencedEffectResult({"receipt": "r-1"}, True, None)
    assert charge.runs == 0
    assert cluster.backend.fence_marks[key_of(new).scope_key] == 2


async def test_another_fingerprint_under_a_business_key_is_a_conflict_not_a_replay(
    cluster: Cluster,
) -> None:
    first = await _lease(cluster, 1, "tree-1")
    second = await _lease(cluster, 2, "tree-2")
    await cluster.effects(1).save_result_if_absent(
        key_of(first, business_key="order-7", fingerprint="f1"), Charge()
    )
    charge = Charge()
    key_2 = key_of(second, business_key="order-7", fingerprint="f2")
    with pytest.raises(IdempotencyKeyConflictError):
        await cluster.effects(2).save_result_if_absent(key_2, charge)
    assert charge.runs == 0
    # The refusal rolled back the second scope's mark too.
    assert key_2.scope_key not in cluster.backend.fence_marks
    assert cluster.backend.business_rows == ["charged"]


# the key's rules, before anything


@pytest.mark.parametrize("name", ["", "has space", "x" * 101, "naïve", "a/b"])
async def test_an_invalid_effect_name_is_refused_before_anything(
    cluster: Cluster, name: str
) -> None:
    # No lease at all: a fence check would refuse too, but the name's rule comes first.
    lease = ExecutionLease(TENANT, "tree-1", "instance-1", 1, LEASE_MS)
    key = dataclasses.replace(key_of(lease), name=name)
    charge = Charge()
    with pytest.raises(InvalidFencedEffectNameError, match=r"1-100 characters"):
        await cluster.effects(1).save_result_if_absent(key, charge)
    assert charge.runs == 0
    assert _nothing_written(cluster)


@pytest.mark.parametrize("business_key", ["", "   ", "a\nb", "a\x00b", "a\x7fb", "k" * 256])
async def test_an_invalid_business_key_is_refused_before_anything(
    cluster: Cluster, business_key: str
) -> None:
    lease = await _lease(cluster)
    key = dataclasses.replace(key_of(lease), business_key=business_key)
    charge = Charge()
    with pytest.raises(InvalidBusinessKeyError, match="business key"):
        await cluster.effects(1).save_result_if_absent(key, charge)
    assert charge.runs == 0
    assert _nothing_written(cluster)


async def test_a_business_key_of_255_characters_is_accepted(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease, business_key="k" * 255, fingerprint="f")
    assert (await cluster.effects(1).save_result_if_absent(key, Charge())).replayed is False


async def test_an_invalid_tenant_in_a_hand_built_key_is_refused(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = dataclasses.replace(key_of(lease), tenant_id="")
    with pytest.raises(InvalidIdentifierError):
        await cluster.effects(1).save_result_if_absent(key, Charge())
    assert _nothing_written(cluster)


# the lease check


async def _refusal(cluster: Cluster, instance: int, lease: ExecutionLease) -> str:
    charge = Charge()
    key = key_of(lease)
    with pytest.raises(ExecutionFencedError) as refused:
        await cluster.effects(instance).save_result_if_absent(key, charge)
    assert charge.runs == 0
    assert refused.value.scope_key == key.scope_key
    assert refused.value.token == key.token
    assert refused.value.code == "execution.fenced"
    return refused.value.reason


async def test_no_lease_is_refused(cluster: Cluster) -> None:
    ghost = ExecutionLease(TENANT, "tree-1", "instance-1", 1, LEASE_MS)
    assert await _refusal(cluster, 1, ghost) == "lease-absent"
    assert _nothing_written(cluster)


async def test_a_zombies_token_is_refused_after_a_takeover(cluster: Cluster) -> None:
    old = await _lease(cluster, 1)
    await cluster.clock.advance(LEASE_MS)
    new = await _lease(cluster, 2)
    assert await _refusal(cluster, 1, old) == "superseded"
    assert (await cluster.effects(2).save_result_if_absent(key_of(new), Charge())).replayed is False
    assert cluster.backend.business_rows == ["charged"]


async def test_a_token_never_granted_is_refused(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    ahead = dataclasses.replace(lease, lease_epoch=5)
    assert await _refusal(cluster, 1, ahead) == "token-not-granted"


@pytest.mark.parametrize(
    ("end", "reason"),
    [("release", "released"), ("yield_lease", "yielded"), ("finish", "finished")],
)
async def test_a_released_yielded_or_finished_lease_is_refused(
    cluster: Cluster, end: str, reason: str
) -> None:
    lease = await _lease(cluster)
    assert await getattr(cluster.leases(1), end)(lease)
    assert await _refusal(cluster, 1, lease) == reason
    assert _nothing_written(cluster)


@pytest.mark.parametrize(("offset", "written"), [(-1, True), (0, False), (1, False)])
async def test_a_fenced_write_at_the_expiry_boundary(
    cluster: Cluster, offset: int, written: bool
) -> None:
    lease = await _lease(cluster)
    await cluster.clock.advance(LEASE_MS + offset)
    if written:
        result = await cluster.effects(1).save_result_if_absent(key_of(lease), Charge())
        assert result.replayed is False
    else:
        # Expired, whether another instance took the lease or not.
        assert await _refusal(cluster, 1, lease) == "expired"
        assert _nothing_written(cluster)


async def test_a_lease_closed_by_lease_state_of_refuses_as_superseded(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    await cluster.clock.advance(LEASE_MS)
    await cluster.calls(2).lease_state_of(TENANT, "tree-1", 1)
    assert await _refusal(cluster, 1, lease) == "superseded"


async def test_a_mark_above_the_token_refuses(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease)
    cluster.backend.fence_marks[key.scope_key] = 2
    assert await _refusal(cluster, 1, lease) == "mark-above-token"
    assert cluster.backend.fence_marks[key.scope_key] == 2


async def test_the_mark_is_raised_to_the_token(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    await cluster.leases(1).release(lease)
    lease = await _lease(cluster, 2)
    key = key_of(lease, step_key="s")
    await cluster.effects(2).save_result_if_absent(key, Charge())
    assert cluster.backend.fence_marks[key.scope_key] == 2


# rollback


async def test_a_failing_work_leaves_no_rows_no_result_and_no_mark(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease)

    async def failing(tx: InMemoryTransaction) -> None:
        tx.insert("half-done")
        raise RuntimeError("payment API down")

    with pytest.raises(RuntimeError, match="payment API down"):
        await cluster.effects(1).save_result_if_absent(key, failing)
    assert _nothing_written(cluster)
    # Nothing was stored: the next call runs the work again.
    charge = Charge()
    assert (await cluster.effects(1).save_result_if_absent(key, charge)).replayed is False
    assert charge.runs == 1
    assert cluster.backend.business_rows == ["charged"]


async def test_a_failing_work_keeps_the_mark_where_it_was(cluster: Cluster) -> None:
    first = await _lease(cluster)
    await cluster.effects(1).save_result_if_absent(key_of(first), Charge())
    await cluster.leases(1).release(first)
    second = await _lease(cluster, 2)

    async def failing(tx: InMemoryTransaction) -> None:
        raise ValueError("no")

    with pytest.raises(ValueError):
        await cluster.effects(2).save_result_if_absent(key_of(second, step_key="s2"), failing)
    assert cluster.backend.fence_marks[key_of(second).scope_key] == 1


@pytest.mark.parametrize("value", [{1, 2}, object(), math.nan, {"at": math.inf}])
async def test_a_result_json_cannot_store_rolls_everything_back(
    cluster: Cluster, value: Any
) -> None:
    lease = await _lease(cluster)
    with pytest.raises((TypeError, ValueError)):
        await cluster.effects(1).save_result_if_absent(key_of(lease), Charge(receipt=value))
    assert _nothing_written(cluster)


async def test_a_cancelled_work_rolls_everything_back(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    started = asyncio.Event()

    async def slow(tx: InMemoryTransaction) -> str:
        tx.insert("row")
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(cluster.effects(1).save_result_if_absent(key_of(lease), slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _nothing_written(cluster)
    # The lock was let go.
    assert await cluster.leases(1).renew(lease, LEASE_MS) == LEASE_MS


async def test_the_transaction_closes_with_the_effect(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    kept: list[InMemoryTransaction] = []

    async def work(tx: InMemoryTransaction) -> int:
        kept.append(tx)
        tx.insert({"n": 1})
        assert tx.rows == ({"n": 1},)
        assert tx.backend is cluster.backend
        return 1

    await cluster.effects(1).save_result_if_absent(key_of(lease), work)
    assert not kept[0].is_open
    with pytest.raises(RuntimeError, match="inside the work"):
        kept[0].insert("late")
    assert cluster.backend.business_rows == [{"n": 1}]


# atomicity


async def test_a_takeover_waits_for_the_effect_in_flight(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    in_work = asyncio.Event()
    go_on = asyncio.Event()

    async def slow(tx: InMemoryTransaction) -> str:
        in_work.set()
        await go_on.wait()
        tx.insert("zombie-row")
        return "done"

    effect = asyncio.create_task(cluster.effects(1).save_result_if_absent(key_of(lease), slow))
    await in_work.wait()
    await cluster.clock.advance(LEASE_MS)
    take = asyncio.create_task(cluster.leases(2).acquire(TENANT, "tree-1", LEASE_MS))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not take.done()  # the lease row is locked by the effect's transaction
    go_on.set()
    assert (await effect).value == "done"
    taken = await take
    assert taken is not None and taken.lease_epoch == 2
    # The new holder replays the committed effect instead of charging again.
    charge = Charge()
    assert (await cluster.effects(2).save_result_if_absent(key_of(taken), charge)).replayed
    assert charge.runs == 0
    assert cluster.backend.business_rows == ["zombie-row"]


async def test_a_work_that_calls_its_lease_store_fails_instead_of_hanging(
    cluster: Cluster,
) -> None:
    lease = await _lease(cluster)
    leases = cluster.leases(1)

    async def renewing(tx: InMemoryTransaction) -> None:
        await leases.renew(lease, LEASE_MS)

    with pytest.raises(RuntimeError, match="transaction the work was given"):
        await asyncio.wait_for(
            cluster.effects(1).save_result_if_absent(key_of(lease), renewing), timeout=2
        )
    assert _nothing_written(cluster)


async def test_the_work_may_use_stores_that_need_no_lease_lock(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    trees = cluster.trees(1)

    async def work(tx: InMemoryTransaction) -> bool:
        return await trees.save_if_absent(TENANT, "tree-1", "note", {"seen": True})

    assert (await cluster.effects(1).save_result_if_absent(key_of(lease), work)).value is True


async def test_a_replayed_value_cannot_be_changed_by_its_reader(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease)
    await cluster.effects(1).save_result_if_absent(key, Charge(receipt={"items": [1]}))
    replay = await cluster.effects(1).save_result_if_absent(key, Charge())
    replay.value["items"].append(2)
    again = await cluster.effects(1).save_result_if_absent(key, Charge())
    assert again.value == {"items": [1]}


async def test_database_time_fences_on_this_hosts_clock() -> None:
    backend = InMemoryBackend()
    app = ApplicationContext("instance-1")
    leases = InMemoryExecutionLeaseRepository(backend, StoreClock(), app)
    effects = InMemoryFencedEffectRepository(backend, StoreClock(), app)
    lease = await leases.acquire(TENANT, "tree-1", 60_000)
    assert lease is not None
    key = fenced_effect_key_of(context_of(lease), "charge")
    assert (await effects.save_result_if_absent(key, Charge())).replayed is False


async def test_the_stored_row_keeps_the_step_the_token_and_the_json(cluster: Cluster) -> None:
    lease = await _lease(cluster)
    key = key_of(lease)
    await cluster.effects(1).save_result_if_absent(key, Charge())
    row = cluster.backend.fenced_results[fenced_key_identity_of(key)]
    assert row.facts.step == StepRef("tree-1", "step-1", "charge-step")
    assert (row.token, row.value_json) == (1, '{"receipt":"r-1"}')
