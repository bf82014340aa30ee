"""`LeaseKeeper`: renewal cadence, the trust window from the send time, self-fencing,
cancel requests, and the lease log (docs/contracts.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from runtime_support import (
    LEASE_MS,
    START,
    TENANT,
    FailingRenewLeases,
    HangingRenewLeases,
    Instance,
    RecordingLeases,
    SlowRenewLeases,
    World,
    settle,
)

from agboss_sql.contracts import (
    CANCEL_REQUEST_KEY,
    ExecutionCancelledError,
    ExecutionLease,
    ExecutionLeaseLostError,
    LeaseEventKind,
    LeaseHolder,
    StoreTimeoutError,
    VirtualClock,
)
from agboss_sql.memory import InMemoryExecutionLeaseRepository
from agboss_sql.runtime import LeaseKeeper


def keeper_of(world: World, instance: Instance, **kw: Any) -> LeaseKeeper:
    return LeaseKeeper(instance.leases, instance.events, world.clock, **kw)


async def advance(world: World, ms: int, step: int = 500) -> None:
    """Move the applications' clock in steps, letting woken tasks finish their store calls."""
    await settle()  # tasks just started begin their sleeps now, not after the first step
    while ms > 0:
        await world.clock.advance(min(step, ms))
        await settle()
        ms -= step


async def kinds(world: World, execution_id: str = "tree-1") -> list[tuple[str, str, int]]:
    events = await world.instance("reader").events.list(TENANT, execution_id)
    return [(e.kind.value, e.instance_id, e.lease_epoch) for e in events]


async def test_take_trusts_the_lease_until_remaining_minus_one_second_and_logs_acquired(
    world: World,
) -> None:
    a = world.instance("a")
    keeper = keeper_of(world, a)
    lease = await keeper.take(TENANT, "tree-1")
    assert lease is not None and lease.lease_epoch == 1 and lease.holder_instance_id == "a"
    assert keeper.held and keeper.trusted()
    assert keeper.trusted_until == START + LEASE_MS - 1_000
    assert await kinds(world) == [("acquired", "a", 1)]


async def test_a_refused_take_is_none_and_logs_nothing(world: World) -> None:
    a, b = world.instance("a"), world.instance("b")
    assert await keeper_of(world, a).take(TENANT, "tree-1") is not None
    keeper = keeper_of(world, b)
    assert await keeper.take(TENANT, "tree-1") is None
    assert not keeper.held and not keeper.trusted()
    assert await kinds(world) == [("acquired", "a", 1)]


async def test_a_keeper_takes_one_lease_only(world: World) -> None:
    keeper = keeper_of(world, world.instance("a"))
    await keeper.take(TENANT, "tree-1")
    with pytest.raises(RuntimeError, match="one lease"):
        await keeper.take(TENANT, "tree-2")


async def test_background_renewal_runs_every_third_of_the_lease(world: World) -> None:
    a = world.instance("a")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    keeper.start()
    await settle()
    await advance(world, 35_000)
    assert a.leases.renewals == [START + 10_000, START + 20_000, START + 30_000]
    assert keeper.trusted() and not keeper.signal.aborted
    # Each renewal moved the trust window: sent at +30 s, 30 s answered, minus 1 s.
    assert keeper.trusted_until == START + 30_000 + LEASE_MS - 1_000
    await keeper.stop()


async def test_the_cadence_follows_the_lease_length(world: World) -> None:
    a = world.instance("a")
    keeper = keeper_of(world, a, lease_ms=9_000)
    await keeper.take(TENANT, "tree-1")
    keeper.start()
    await advance(world, 10_000)
    assert a.leases.renewals == [START + 3_000, START + 6_000, START + 9_000]
    await keeper.stop()


async def test_stop_stops_renewing_without_releasing(world: World) -> None:
    a, b = world.instance("a"), world.instance("b")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    keeper.start()
    await advance(world, 10_000)
    await keeper.stop()
    await advance(world, 20_000)
    assert a.leases.renewals == [START + 10_000]
    assert keeper.held  # it does not know: a frozen instance
    assert await b.leases.acquire(TENANT, "tree-1", LEASE_MS) is None  # live until +40 s
    await advance(world, 10_000)
    taken = await b.leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert taken is not None and taken.taken_over_from == LeaseHolder("a", 1)


async def test_a_renewal_refused_after_a_takeover_aborts_with_lease_lost(world: World) -> None:
    # The store's time runs on its own clock: it jumps past the lease (the database saw
    # the holder silent for longer than the lease) while the holder's clock barely moves.
    world.store_time = VirtualClock(START)
    a, b = world.instance("a"), world.instance("b")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    keeper.start()
    await world.store_time.advance(31_000)
    b_keeper = keeper_of(world, b)
    taken = await b_keeper.take(TENANT, "tree-1")
    assert taken is not None and taken.taken_over_from == LeaseHolder("a", 1)
    assert not keeper.signal.aborted

    await advance(world, 10_000)

    assert a.leases.renewals == [START + 10_000]
    assert keeper.signal.aborted and keeper.lost and not keeper.trusted()
    reason = keeper.signal.reason
    assert isinstance(reason, ExecutionLeaseLostError)
    assert reason.code == "execution.lease-lost"
    with pytest.raises(ExecutionLeaseLostError):
        keeper.signal.raise_if_aborted()
    with pytest.raises(ExecutionLeaseLostError):
        keeper.guard()
    events = await a.events.list(TENANT, "tree-1")
    assert [(e.kind, e.instance_id, e.lease_epoch) for e in events] == [
        (LeaseEventKind.ACQUIRED, "a", 1),
        (LeaseEventKind.TAKEN_OVER, "b", 2),
        (LeaseEventKind.LOST, "a", 1),
    ]
    assert events[1].taken_over_from == LeaseHolder("a", 1)
    assert events[2].reason is not None and "refused" in events[2].reason
    # It renews no more, in the background or when asked.
    assert await keeper.confirm_now() is False
    await advance(world, 30_000)
    assert a.leases.renewals == [START + 10_000]
    await b_keeper.stop()


async def test_a_renewal_that_hangs_self_fences_when_trust_measured_from_the_send_ends(
    world: World,
) -> None:
    a = world.instance("a", HangingRenewLeases, acquire_delay_ms=500)
    b = world.instance("b")
    keeper = keeper_of(world, a)
    take = asyncio.get_running_loop().create_task(keeper.take(TENANT, "tree-1"))
    await settle()
    await world.clock.advance(500)  # the take is answered 500 ms after it was sent
    await settle()
    lease = take.result()
    assert lease is not None and lease.remaining_ms == LEASE_MS  # the store decided at +500
    # Trusted from the send (START), not from the answer (START + 500).
    assert keeper.trusted_until == START + LEASE_MS - 1_000
    keeper.start()
    await advance(world, 28_499 - 500, step=499)  # now START + 28_499
    assert world.clock.monotonic() == START + 28_499
    assert a.leases.renewals == [START + 10_500]  # sent, never answered
    assert keeper.trusted() and not keeper.signal.aborted

    await world.clock.advance(500)  # START + 28_999
    await settle()
    assert keeper.trusted() and not keeper.signal.aborted
    await world.clock.advance(1)  # START + 29_000: the trust window is over
    await settle()

    assert keeper.signal.aborted and not keeper.trusted()
    assert isinstance(keeper.signal.reason, ExecutionLeaseLostError)
    assert a.leases.cancelled_renewals == 1  # the hung renewal was abandoned
    events = await a.events.list(TENANT, "tree-1")
    assert [e.kind for e in events] == [LeaseEventKind.ACQUIRED, LeaseEventKind.LOST]
    assert events[-1].at == START + 29_000
    assert events[-1].reason is not None and "trust window" in events[-1].reason
    # The holder stopped trusting 1.5 s before the store lets anyone else in.
    assert await b.leases.acquire(TENANT, "tree-1", LEASE_MS) is None
    await advance(world, 1_500)
    assert await b.leases.acquire(TENANT, "tree-1", LEASE_MS) is not None
    assert a.leases.renewals == [START + 10_500]


async def test_confirm_now_renews_and_says_whether_still_held(world: World) -> None:
    world.store_time = VirtualClock(START)
    a, b = world.instance("a"), world.instance("b")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    await world.clock.advance(5_000)
    await world.store_time.advance(5_000)
    assert await keeper.confirm_now() is True
    assert a.leases.renewals == [START + 5_000]
    assert keeper.trusted_until == START + 5_000 + LEASE_MS - 1_000

    await world.store_time.advance(LEASE_MS)  # the store's time passes the lease
    assert await b.leases.acquire(TENANT, "tree-1", LEASE_MS) is not None
    assert await keeper.confirm_now() is False
    assert isinstance(keeper.signal.reason, ExecutionLeaseLostError)
    assert await kinds(world) == [("acquired", "a", 1), ("lost", "a", 1)]


async def test_confirm_now_answered_after_the_trust_window_loses_the_lease(world: World) -> None:
    a = world.instance("a", SlowRenewLeases, delay_ms=2_000)
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")  # trusted until START + 29_000
    await world.clock.advance(28_000)
    confirm = asyncio.get_running_loop().create_task(keeper.confirm_now())
    await settle()
    await world.clock.advance(2_000)  # renewed at +28 s, answered only at +30 s
    await settle()
    assert a.leases.renewals == [START + 28_000]
    assert confirm.result() is False
    assert keeper.lost and isinstance(keeper.signal.reason, ExecutionLeaseLostError)
    assert [k for k, _, _ in await kinds(world)] == ["acquired", "lost"]


async def test_a_renewal_that_raises_a_non_transient_error_loses_the_lease(
    world: World,
) -> None:
    # A ConnectionError is no store error of ours: nothing says the call may be sent again.
    a = world.instance("a", FailingRenewLeases)
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    keeper.start()
    await advance(world, 10_000)
    assert keeper.lost and isinstance(keeper.signal.reason, ExecutionLeaseLostError)
    events = await a.events.list(TENANT, "tree-1")
    assert events[-1].kind is LeaseEventKind.LOST
    assert events[-1].reason is not None and "database unreachable" in events[-1].reason
    await advance(world, 20_000)
    assert a.leases.renewals == [START + 10_000]


async def test_guard_fences_when_the_trust_window_is_over_without_a_watchdog(
    world: World,
) -> None:
    a = world.instance("a")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    await world.clock.advance(28_999)
    keeper.guard()
    await world.clock.advance(1)
    with pytest.raises(ExecutionLeaseLostError):
        keeper.guard()
    assert keeper.lost
    await settle()
    assert [k for k, _, _ in await kinds(world)] == ["acquired", "lost"]


async def test_a_cancel_request_aborts_at_the_next_renewal(world: World) -> None:
    a, b = world.instance("a"), world.instance("b")
    keeper = LeaseKeeper(a.leases, a.events, world.clock, tree=a.tree)
    await keeper.take(TENANT, "tree-1")
    keeper.start()
    await advance(world, 1_000)
    assert await b.tree.save_if_absent(TENANT, "tree-1", CANCEL_REQUEST_KEY, {"by": "b"})
    await advance(world, 8_500)
    assert not keeper.signal.aborted  # seen only at a renewal
    await advance(world, 500)  # START + 10_000: the renewal
    reason = keeper.signal.reason
    assert isinstance(reason, ExecutionCancelledError) and reason.code == "execution.cancelled"
    with pytest.raises(ExecutionCancelledError):
        keeper.guard()
    # The lease stays held and renewed so the holder can unwind and record the outcome.
    assert keeper.held and keeper.trusted()
    await advance(world, 40_000)
    assert keeper.held and keeper.trusted()
    assert await b.leases.acquire(TENANT, "tree-1", LEASE_MS) is None
    await keeper.stop()


async def test_a_child_keeper_reads_the_cancel_request_of_its_root(world: World) -> None:
    a = world.instance("a")
    keeper = LeaseKeeper(a.leases, a.events, world.clock, tree=a.tree, root_execution_id="root")
    await keeper.take(TENANT, "child-1")
    assert await keeper.confirm_now() is True
    assert not keeper.signal.aborted
    await a.tree.save_if_absent(TENANT, "root", CANCEL_REQUEST_KEY, True)
    assert await keeper.confirm_now() is True  # still held ...
    assert isinstance(keeper.signal.reason, ExecutionCancelledError)  # ... but cancelled


async def test_release_yield_reclaim_and_finish_are_logged_after_each_move(world: World) -> None:
    a, b = world.instance("a"), world.instance("b")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    keeper.start()
    assert await keeper.yield_() is True
    assert not keeper.held and not keeper.trusted()
    reclaimed = await keeper.reclaim()
    assert reclaimed is not None and reclaimed.lease_epoch == 2
    assert keeper.held and keeper.trusted()
    await advance(world, 10_000)
    assert a.leases.renewals == [START + 10_000]  # renewal resumed after the reclaim
    assert await keeper.finish() is True
    assert not keeper.held and not keeper.signal.aborted
    assert await b.leases.acquire(TENANT, "tree-1", LEASE_MS) is None  # finished: never again
    assert await kinds(world) == [
        ("acquired", "a", 1),
        ("yielded", "a", 1),
        ("reclaimed", "a", 2),
        ("finished", "a", 2),
    ]
    await advance(world, 30_000)
    assert a.leases.renewals == [START + 10_000]


async def test_release_lets_another_instance_acquire_without_a_takeover(world: World) -> None:
    a, b = world.instance("a"), world.instance("b")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    assert await keeper.release() is True
    assert await keeper.release() is False
    other = await keeper_of(world, b).take(TENANT, "tree-1")
    assert other is not None and other.taken_over_from is None
    assert await kinds(world) == [("acquired", "a", 1), ("released", "a", 1), ("acquired", "b", 2)]


async def test_a_yield_taken_by_another_instance_cannot_be_reclaimed(world: World) -> None:
    a, b = world.instance("a"), world.instance("b")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    await keeper.yield_()
    assert await keeper_of(world, b).take(TENANT, "tree-1") is not None
    assert await keeper.reclaim() is None
    assert keeper.lost and isinstance(keeper.signal.reason, ExecutionLeaseLostError)


async def test_adopt_confirms_a_lease_taken_elsewhere_and_trusts_from_its_own_send(
    world: World,
) -> None:
    a = world.instance("a")
    lease = await a.leases.acquire(TENANT, "tree-1", LEASE_MS)
    assert lease is not None
    await world.clock.advance(2_000)
    keeper = keeper_of(world, a)
    assert await keeper.adopt(lease) is True
    assert a.leases.renewals == [START + 2_000]
    assert keeper.trusted_until == START + 2_000 + LEASE_MS - 1_000


async def test_a_lease_shorter_than_the_trust_margin_is_refused() -> None:
    world = World()
    a = world.instance("a")
    with pytest.raises(ValueError, match="never trusted"):
        LeaseKeeper(a.leases, a.events, world.clock, lease_ms=1_000)
    LeaseKeeper(a.leases, a.events, world.clock, lease_ms=600, trust_margin_ms=100)


async def test_renewals_are_logged_only_when_asked(world: World) -> None:
    a = world.instance("a")
    quiet = keeper_of(world, a)
    await quiet.take(TENANT, "tree-1")
    loud = keeper_of(world, a, log_renewals=True)
    await loud.take(TENANT, "tree-2")
    assert await quiet.confirm_now() and await loud.confirm_now()
    assert await kinds(world, "tree-1") == [("acquired", "a", 1)]
    assert await kinds(world, "tree-2") == [("acquired", "a", 1), ("renewed", "a", 1)]


async def test_the_lost_event_is_written_even_when_stop_comes_while_it_is_being_written(
    world: World,
) -> None:
    # A holder frozen past its trust window: the watchdog loses the lease and waits for the
    # `lost` event's write; the run sees the loss and stops the keeper meanwhile. The stop
    # cancels the watchdog, never the event's write (an operator tells a zombie from a
    # takeover by that event).
    a = world.instance("a")
    written = asyncio.Event()
    gate = asyncio.Event()
    save = a.events.save

    async def slow_save(event: Any) -> None:
        if event.kind is LeaseEventKind.LOST:
            await gate.wait()
        await save(event)
        written.set()

    a.events.save = slow_save  # type: ignore[method-assign]
    keeper = keeper_of(world, a)
    assert await keeper.take(TENANT, "tree-1") is not None
    keeper.start()
    await world.clock.advance(LEASE_MS)  # frozen: no renewal answered, the window is over
    await settle()
    assert keeper.lost
    await keeper.stop()  # the run's hand-over, while the event's write waits
    gate.set()
    await asyncio.wait_for(written.wait(), 5)  # bounded: the write only awaits the gate
    assert [k for k, _, _ in await kinds(world)] == ["acquired", "lost"]


class TimingOutRenewLeases(RecordingLeases):
    """Each renewal but the ones after the first `failures` waits `wait_ms` of application
    time and raises `StoreTimeoutError(lock)` (blocked behind a row lock), as a server's
    renewal does when its row stays locked for `lock_ms`."""

    def __init__(self, *args: object, failures: int, wait_ms: int) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.failures = failures
        self.wait_ms = wait_ms

    async def renew(self, lease: ExecutionLease, lease_ms: int) -> int | None:
        self.renewals.append(self.app_clock.monotonic())
        if len(self.renewals) > self.failures:
            return await InMemoryExecutionLeaseRepository.renew(self, lease, lease_ms)
        await self.app_clock.sleep(self.wait_ms)
        raise StoreTimeoutError("lock", self.wait_ms, "the lease row stayed locked")


async def test_a_renewal_that_times_out_is_sent_again_within_the_trust_window(
    world: World,
) -> None:
    # Three renewals time out after 5 s each (the first at +10 s); the fourth, sent at
    # about +25 s, inside the window that ends at +29 s, keeps the lease.
    a = world.instance("a", TimingOutRenewLeases, failures=3, wait_ms=5_000)
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    keeper.start()
    await advance(world, 28_000, step=50)
    assert keeper.held and keeper.trusted() and not keeper.signal.aborted
    assert len(a.leases.renewals) == 4
    assert a.leases.renewals[0] == START + 10_000
    fourth = a.leases.renewals[3]
    # Each retry follows the failure by a backoff pause (at most 1.5 x CAP_S = 300 ms).
    assert START + 25_000 < fourth <= START + 25_000 + 3 * 300
    assert keeper.trusted_until == fourth + LEASE_MS - 1_000
    assert [k for k, _, _ in await kinds(world)] == ["acquired"]
    await keeper.stop()


async def test_a_renewal_that_keeps_timing_out_loses_the_lease_when_the_trust_window_ends(
    world: World,
) -> None:
    a = world.instance("a", TimingOutRenewLeases, failures=1_000, wait_ms=5_000)
    b = world.instance("b")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")  # trusted until START + 29_000
    keeper.start()
    await advance(world, 28_900, step=50)
    assert keeper.held and not keeper.signal.aborted  # still retrying inside the window
    sent = len(a.leases.renewals)
    assert sent == 4  # +10, ~+15, ~+20, ~+25 s: each waits 5 s, then a short pause
    await advance(world, 200, step=50)  # past START + 29_000
    assert keeper.lost and isinstance(keeper.signal.reason, ExecutionLeaseLostError)
    events = await a.events.list(TENANT, "tree-1")
    assert [e.kind for e in events] == [LeaseEventKind.ACQUIRED, LeaseEventKind.LOST]
    assert events[-1].at <= START + 29_000
    # The holder stopped trusting before the store lets anyone else in (+30 s).
    assert await b.leases.acquire(TENANT, "tree-1", LEASE_MS) is None
    await advance(world, 30_000)
    assert len(a.leases.renewals) == sent  # nothing sent once lost


async def test_a_refused_renewal_is_not_sent_again(world: World) -> None:
    world.store_time = VirtualClock(START)
    a, b = world.instance("a"), world.instance("b")
    keeper = keeper_of(world, a)
    await keeper.take(TENANT, "tree-1")
    await world.store_time.advance(LEASE_MS)
    assert await b.leases.acquire(TENANT, "tree-1", LEASE_MS) is not None
    keeper.start()
    await advance(world, 12_000, step=50)
    assert keeper.lost
    assert a.leases.renewals == [START + 10_000]
