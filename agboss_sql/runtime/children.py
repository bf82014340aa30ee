"""`ChildWorker`: runs queued children on any instance, each under its own lease."""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agboss_sql.contracts.clocks import Clock
from agboss_sql.contracts.errors import (
    ExecutionFencedError,
    ExecutionLeaseLostError,
    StoreUnavailableError,
)
from agboss_sql.contracts.stores import (
    ChildExecutionQueueRepository,
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    ExecutionTreeRepository,
    QueueWakeups,
)
from agboss_sql.contracts.types import ChildExecution, ClaimedChild, ExecutionLease, JsonValue
from agboss_sql.runtime._child_finishes import FinishBatcher
from agboss_sql.runtime._child_stop import (
    STUCK_GRACE_S,
    FinishReporting,
    OnStuck,
    cancel_and_wait,
    flush_bounded,
    release_bounded,
)
from agboss_sql.runtime._tasks import wait_cancelled
from agboss_sql.runtime.keeper import DEFAULT_LEASE_MS, LeaseKeeper, bind_keeper, unbind_keeper

logger = logging.getLogger("agboss_sql.runtime")

RunChild = Callable[[ClaimedChild, ExecutionLease], Awaitable[JsonValue]]
WakeParent = Callable[[str, str], Awaitable[None]]

_MESSAGE_LIMIT = 1_000
DEFAULT_WAKE_CLAIM_MS = 60_000
DEFAULT_STORE_RETRIES = 3

T = TypeVar("T")


class ChildYielded(Exception):
    """Raised by a child's run that waits for children of its own: its queue entry is
    `waiting` (`ChildExecutionQueueRepository.wait_for_children`) and its lease yielded.
    The `ChildWorker` finishes nothing; the finish of the last of its children makes it
    claimable again, and whoever claims it runs it on from its stored steps."""


def error_outcome(error: BaseException) -> JsonValue:
    """The outcome a child that raised finishes with: its error's type, code and message."""
    return {
        "error": {
            "type": type(error).__name__,
            "code": getattr(error, "code", None),
            "message": str(error)[:_MESSAGE_LIMIT],
        }
    }


def _instance_id_of(queue: ChildExecutionQueueRepository) -> str:
    application = getattr(queue, "application", None)
    instance_id = getattr(application, "instance_id", None)
    if not isinstance(instance_id, str):
        raise TypeError(
            f"{type(queue).__name__} has no application.instance_id: pass instance_id= "
            "(the instance that claims children)"
        )
    return instance_id


class ChildWorker:
    """Claims queued children and runs each under the child's own lease.

    `run_once`: claim the next child, take its lease `(tenant_id, child_execution_id)`,
    run `run_child(child, lease)` with the lease renewed in the background (the run finds
    its keeper with `current_keeper()`), then finish the child at its attempt and finish
    its lease. The one finisher the queue answers `remaining == 0` (and `finished`) owes the
    parent its wake: it claims the wake in the queue (compare-and-set: one claimer wins),
    calls `wake_parent(tenant_id, parent_execution_id)` and records the wake done.

    - The finishes of runs that end together go to the queue as one batch
      (`finish_many`: one transaction), a lone finish at once by itself (`FinishBatcher`).
    - The finish and the wake's store calls are idempotent (per attempt, per claimer), so
      after an error that leaves their outcome unknown (`StoreUnavailableError`, e.g.
      `CommitOutcomeUnknownError`) they are sent again, up to `store_retries` times. A
      finish that still fails stops the lease's renewal and raises.
    - `wake_once` (run with the rescue by `start()`) is the wake sweep: it wakes the parents
      whose last child finished but whose wake is not done, because the finisher died, lost
      the store, or its `wake_parent` raised. The claim runs out after `wake_claim_ms` on
      the application clock, and only then can another claimer take it: `wake_parent` is
      called once per wake unless a claimer's `wake_parent` outlives its claim, or the
      claimer dies after `wake_parent` returned and before the wake was recorded (then the
      sweep wakes the parent again once the claim ran out: a wake is never lost).

    - A run that raised `ChildYielded` (it waits for children of its own, its lease
      yielded) finishes nothing: the finish of its last child makes it claimable again.
    - A lease lost during the run cancels the run and finishes nothing: the next holder
      owns the child. So does a run that raised `ExecutionLeaseLostError` or
      `ExecutionFencedError`.
    - A run that raised anything else, or was cancelled through the tree's cancel request,
      finishes the child with `error_outcome(error)`: the parent decides what a failed
      child means.
    - A child whose lease is held elsewhere is left running for `rescue_once`.

    `rescue_once` (the child part of the recovery sweep): for each running child whose
    lease is over, take it at the next epoch, `restart` the child at the attempt read (one
    rescuer wins), and run it again from its checkpoint. A superseded worker's late finish
    changes nothing: the queue compares the attempt.
    """

    def __init__(
        self,
        queue: ChildExecutionQueueRepository,
        leases: ExecutionLeaseRepository,
        events: ExecutionLeaseEventRepository | None,
        clock: Clock,
        *,
        run_child: RunChild,
        wake_parent: WakeParent,
        lease_ms: int = DEFAULT_LEASE_MS,
        tree: ExecutionTreeRepository | None = None,
        instance_id: str | None = None,
        trust_margin_ms: int | None = None,
        wake_claim_ms: int = DEFAULT_WAKE_CLAIM_MS,
        store_retries: int = DEFAULT_STORE_RETRIES,
        accepts: Callable[[ChildExecution], bool] | None = None,
    ) -> None:
        if isinstance(wake_claim_ms, bool) or not isinstance(wake_claim_ms, int):
            raise ValueError(f"wake_claim_ms must be a positive int, got {wake_claim_ms!r}")
        if wake_claim_ms <= 0:
            raise ValueError(f"wake_claim_ms must be a positive int, got {wake_claim_ms!r}")
        if isinstance(store_retries, bool) or not isinstance(store_retries, int):
            raise ValueError(f"store_retries must be an int >= 0, got {store_retries!r}")
        if store_retries < 0:
            raise ValueError(f"store_retries must be an int >= 0, got {store_retries!r}")
        self.queue = queue
        self.leases = leases
        self.events = events
        self.clock = clock
        self.run_child = run_child
        self.wake_parent = wake_parent
        self.lease_ms = lease_ms
        self.tree = tree
        self.instance_id = instance_id if instance_id is not None else _instance_id_of(queue)
        self.trust_margin_ms = trust_margin_ms
        self.wake_claim_ms = wake_claim_ms
        self.store_retries = store_retries
        self.accepts = accepts
        self._task: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._queued: asyncio.Event | None = None
        self._runs: set[asyncio.Task[None]] = set()
        self._keepers: set[LeaseKeeper] = set()
        self._made: weakref.WeakSet[LeaseKeeper] = weakref.WeakSet()
        self._finishes = FinishBatcher(queue, store_retries)
        self._keeper()  # the lease settings are checked now, not at the first child

    def _keeper(self, root_execution_id: str | None = None) -> LeaseKeeper:
        keeper = self._new_keeper(root_execution_id)
        self._made.add(keeper)
        return keeper

    def _new_keeper(self, root_execution_id: str | None = None) -> LeaseKeeper:
        if self.trust_margin_ms is None:
            return LeaseKeeper(
                self.leases,
                self.events,
                self.clock,
                lease_ms=self.lease_ms,
                tree=self.tree,
                root_execution_id=root_execution_id,
            )
        return LeaseKeeper(
            self.leases,
            self.events,
            self.clock,
            lease_ms=self.lease_ms,
            tree=self.tree,
            root_execution_id=root_execution_id,
            trust_margin_ms=self.trust_margin_ms,
        )

    async def run_once(self) -> bool:
        """Claim one queued child and run it (see the class). False when none was queued."""
        claimed = await self.queue.claim(self.instance_id)
        if claimed is None:
            return False
        keeper = self._keeper(claimed.root_execution_id)
        lease = await self._take(keeper, claimed.tenant_id, claimed.child_execution_id)
        if lease is None:
            logger.warning(
                "child %s is claimed but its lease is held elsewhere; leaving it to the rescue",
                claimed.child_execution_id,
            )
            return True
        await self._run(claimed, keeper, lease)
        return True

    async def start_once(self) -> tuple[ClaimedChild | None, asyncio.Task[None] | None]:
        """Claim one queued child, take its lease and start its run as a task of this
        worker (see the class) without waiting for it: `(claimed child, task)`. `(None,
        None)` when none was queued; `(child, None)` when the claimed child's lease is held
        elsewhere (it is left to the rescue). `stop()` cancels the runs still going."""
        claimed = await self.queue.claim(self.instance_id)
        if claimed is None:
            return None, None
        keeper = self._keeper(claimed.root_execution_id)
        lease = await self._take(keeper, claimed.tenant_id, claimed.child_execution_id)
        if lease is None:
            logger.warning(
                "child %s is claimed but its lease is held elsewhere; leaving it to the rescue",
                claimed.child_execution_id,
            )
            return claimed, None
        return claimed, self._spawn_run(claimed, keeper, lease)

    async def start_many(self, n: int) -> list[tuple[ClaimedChild, asyncio.Task[None] | None]]:
        """As `start_once` for up to `n` children claimed in one step (`claim_many`): each
        claimed child's lease taken (together) and its run started as a task of this
        worker; `(child, None)` for a child whose lease is held elsewhere (left to the
        rescue). Empty when none was queued."""
        claimed = list(await self.queue.claim_many(self.instance_id, n))
        if not claimed:
            return []
        keepers = [self._keeper(child.root_execution_id) for child in claimed]
        leases = await asyncio.gather(
            *(
                self._take(keeper, child.tenant_id, child.child_execution_id)
                for keeper, child in zip(keepers, claimed, strict=True)
            )
        )
        started: list[tuple[ClaimedChild, asyncio.Task[None] | None]] = []
        for child, keeper, lease in zip(claimed, keepers, leases, strict=True):
            if lease is None:
                logger.warning(
                    "child %s is claimed but its lease is held elsewhere; leaving it to the rescue",
                    child.child_execution_id,
                )
                started.append((child, None))
            else:
                started.append((child, self._spawn_run(child, keeper, lease)))
        return started

    def listen(
        self, on_queued: Callable[[], None] | None = None, *, bound_ms: int = 30_000
    ) -> None:
        """Listen for children queued anywhere, where the queue can tell (`wakeups()`):
        each hint wakes this worker's idle loop and calls `on_queued` (the engine's child
        pump). One wait at a time, each bounded by `bound_ms`; a listener that fails is
        tried again at its next wait (the loops poll meanwhile). `stop()` ends it. Nothing
        happens where the queue has no wake-ups, or when already listening."""
        if self._listener is not None and not self._listener.done():
            return
        wakeups = self.queue.wakeups()
        if wakeups is None:
            return
        self._queued = asyncio.Event()
        self._listener = asyncio.get_running_loop().create_task(
            self._listen(wakeups, on_queued, bound_ms)
        )

    async def _listen(
        self, wakeups: QueueWakeups, on_queued: Callable[[], None] | None, bound_ms: int
    ) -> None:
        try:
            while True:
                if await wakeups.wait(bound_ms):
                    if self._queued is not None:
                        self._queued.set()
                    if on_queued is not None:
                        on_queued()
        finally:
            await wakeups.close()

    @property
    def listening(self) -> bool:
        """Whether this worker listens for children queued (see `listen`)."""
        return self._listener is not None and not self._listener.done()

    async def _idle(self, ms: int) -> None:
        """Sleep `ms` on the application clock, or less when told children were queued."""
        queued = self._queued
        if queued is None:
            await self.clock.sleep(ms)
            return
        if queued.is_set():
            queued.clear()
            return
        loop = asyncio.get_running_loop()
        sleeper = loop.create_task(self.clock.sleep(ms))
        told = loop.create_task(queued.wait())
        try:
            await asyncio.wait({sleeper, told}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            told.cancel()
        queued.clear()

    async def _take(
        self, keeper: LeaseKeeper, tenant_id: str, child_execution_id: str
    ) -> ExecutionLease | None:
        """`keeper.take`, with the keeper known before the take: a `stop(release=True)`
        that cancels this call after the take still releases the lease."""
        self._keepers.add(keeper)
        try:
            lease = await keeper.take(tenant_id, child_execution_id)
        finally:
            if not keeper.held:
                self._keepers.discard(keeper)
        return lease

    def _spawn_run(
        self, child: ClaimedChild, keeper: LeaseKeeper, lease: ExecutionLease
    ) -> asyncio.Task[None]:
        async def run() -> None:
            try:
                await self._run(child, keeper, lease)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("child %s failed its run", child.child_execution_id, exc_info=True)

        task = asyncio.get_running_loop().create_task(run())
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        return task

    async def rescue_once(
        self, limit: int = 100, *, spawn: bool = False, max_runs: int | None = None
    ) -> int:
        """Take over running children whose lease is over, and run each again (one after
        the other, or, with `spawn`, each as a task of this worker, as `start_once`),
        looking at up to `limit` running children and rescuing at most `max_runs` of them.
        How many were run (or started)."""
        rescued = 0
        for child in await self.queue.running(limit):
            if max_runs is not None and rescued >= max_runs:
                break
            if self.accepts is not None and not self.accepts(child):
                continue  # left to an instance that can run it
            keeper = self._keeper(child.root_execution_id)
            lease = await self._take(keeper, child.tenant_id, child.child_execution_id)
            if lease is None:
                continue
            restarted = await self.queue.restart(child.child_execution_id, child.attempt)
            if restarted is None:
                # Finished or restarted by another rescuer since it was listed.
                await keeper.release()
                continue
            if spawn:
                self._spawn_run(restarted, keeper, lease)
            else:
                await self._run(restarted, keeper, lease)
            rescued += 1
        return rescued

    async def _run(self, child: ClaimedChild, keeper: LeaseKeeper, lease: ExecutionLease) -> None:
        try:
            await self._run_held(child, keeper, lease)
        except asyncio.CancelledError:
            raise  # the keeper stays known: `stop(release=True)` releases its lease
        except BaseException:
            self._keepers.discard(keeper)
            raise
        self._keepers.discard(keeper)

    async def _run_held(
        self, child: ClaimedChild, keeper: LeaseKeeper, lease: ExecutionLease
    ) -> None:
        async def call() -> JsonValue:
            return await self.run_child(child, lease)

        keeper.start()
        token = bind_keeper(keeper)
        try:
            run = asyncio.get_running_loop().create_task(call())
        finally:
            unbind_keeper(token)
        aborted = asyncio.get_running_loop().create_task(keeper.signal.wait())
        try:
            await asyncio.wait({run, aborted}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # This worker is being cancelled (its instance stops or dies): stop the run and
            # the renewals; the lease is left to run out for the rescue.
            run.cancel()
            aborted.cancel()
            await keeper.stop()
            raise
        aborted.cancel()
        if not run.done():
            # The signal was aborted (lease lost, or the tree cancelled): the run starts
            # nothing more.
            run.cancel()
            await wait_cancelled(run, quiet=True)
        if not run.cancelled() and isinstance(run.exception(), ChildYielded):
            await keeper.stop()  # waiting for its own children: nothing to finish
            return
        if keeper.lost:
            if not run.cancelled():
                run.exception()  # retrieved: the next holder owns the child
            return
        if not run.cancelled() and run.exception() is None:
            outcome = run.result()
        else:
            error: BaseException | None = (
                keeper.signal.reason if run.cancelled() else run.exception()
            )
            if error is None:
                error = asyncio.CancelledError("the child's run was cancelled")
            if isinstance(error, (ExecutionLeaseLostError, ExecutionFencedError)):
                logger.warning(
                    "child %s lost its lease while running: %s", child.child_execution_id, error
                )
                await keeper.stop()
                return
            outcome = error_outcome(error)
        child_id = child.child_execution_id
        try:
            # With the finishes of the runs that end meanwhile, in one batch; idempotent per
            # attempt: a retry after a lost reply answers what the first did.
            result = await self._finishes.finish(child_id, outcome, child.attempt)
        except BaseException:
            # Whether the child finished is unknown: stop renewing. A child still running is
            # rescued when its lease runs out; the parent of one that finished last is woken
            # by the wake sweep (`wake_once`).
            await keeper.stop()
            raise
        if not result.finished:
            # Superseded by a rescue: the new attempt finishes the child and holds its lease.
            await keeper.stop()
            return
        try:
            await keeper.finish()
        except Exception:
            logger.warning("could not finish the lease of child %s", child_id, exc_info=True)
            await keeper.stop()
        if result.remaining == 0:
            await self._wake(child.tenant_id, child.parent_execution_id, child_id)

    async def wake_once(self, limit: int = 100) -> int:
        """The wake sweep: wake the parent of each finished child whose finish saw none left
        and whose wake is not done (its worker died or lost the store between the finish and
        the wake, or its wake claim ran out). How many parents this call woke. A wake that
        fails is reported and left for a later sweep (its claim runs out); the others go on."""
        woken = 0
        for child in await self.queue.unwoken(limit):
            try:
                if await self._wake(
                    child.tenant_id, child.parent_execution_id, child.child_execution_id
                ):
                    woken += 1
            except Exception:
                logger.warning(
                    "could not wake parent %s (child %s); a later sweep tries again",
                    child.parent_execution_id,
                    child.child_execution_id,
                    exc_info=True,
                )
        return woken

    async def _wake(self, tenant_id: str, parent_execution_id: str, child_id: str) -> bool:
        """Wake the parent once: claim the wake in the store (compare-and-set; one claimer
        wins), call `wake_parent`, record the wake done. True when this call woke it."""
        claimer = f"{self.instance_id}/{uuid.uuid4().hex}"
        claimed = await self._retrying(
            f"the wake claim of child {child_id}",
            lambda: self.queue.claim_wake(child_id, claimer, self.wake_claim_ms),
        )
        if not claimed:
            return False  # woken, or being woken, by another worker or sweep
        await self.wake_parent(tenant_id, parent_execution_id)
        done = await self._retrying(
            f"the wake mark of child {child_id}",
            lambda: self.queue.mark_woken(child_id, claimer),
        )
        if not done:
            logger.warning(
                "the wake of parent %s (child %s) took longer than its %d ms claim: another "
                "claimer may wake it again",
                parent_execution_id,
                child_id,
                self.wake_claim_ms,
            )
        return True

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run an idempotent store call, and run it again (up to `store_retries` times) after
        an error that leaves its outcome unknown or says nothing was applied."""
        left = self.store_retries
        while True:
            try:
                return await call()
            except StoreUnavailableError as error:
                if left <= 0:
                    raise
                left -= 1
                logger.warning("%s failed (%s); trying again, %d retries left", what, error, left)

    def start(self, *, poll_ms: int = 1_000, rescue_every_ms: int = 30_000) -> None:
        """Run children until `stop()`: claim and run one after another and rescue every
        `rescue_every_ms`. When none is queued it waits on the application clock, first
        `poll_ms / 16`, doubling at each empty pass up to `poll_ms` (adaptive polling: a
        busy queue is polled often, an idle one seldom), and less when its listener (see
        `listen`, started here) is told of children queued."""
        self.listen()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._loop(poll_ms, rescue_every_ms)
            )

    async def stop(
        self,
        *,
        release: bool = False,
        timeout_s: float | None = None,
        on_stuck: OnStuck | None = None,
    ) -> int:
        """Stop the loop and the runs `start_once` started; a child being run is cancelled
        and its lease left to run out for the rescue, or, with `release`, released so
        another instance takes it at once (the releases run together, each bounded to 2 s).
        A release the store refuses (the lease was taken over meanwhile) logs the lease
        `lost`. With `timeout_s`, the wait for the cancelled runs is bounded: a run still
        going past it (stuck in its own clean-up; `on_stuck` is told) is cancelled once
        more and left, and its lease released all the same. The number of leases
        released."""
        task, self._task = self._task, None
        listener, self._listener = self._listener, None
        tasks = [*(t for t in (task, listener) if t is not None), *self._runs]
        await cancel_and_wait(tasks, timeout_s, on_stuck=on_stuck)
        await self._finishes.close()
        released = 0
        if release:
            keepers = [keeper for keeper in self._keepers if keeper.held]
            self._keepers.clear()
            released = sum(await asyncio.gather(*(release_bounded(k) for k in keepers)))
        # The `lost` events keepers write in the background reach the log before the
        # caller closes the stores.
        await flush_bounded(list(self._made))
        return released

    async def _loop(self, poll_ms: int, rescue_every_ms: int) -> None:
        next_rescue = self.clock.monotonic()
        shortest = max(1, poll_ms // 16)
        nap = shortest
        while True:
            try:
                if self.clock.monotonic() >= next_rescue:
                    next_rescue = self.clock.monotonic() + rescue_every_ms
                    await self.rescue_once()
                    await self.wake_once()
                if await self.run_once():
                    nap = shortest
                    continue
            except Exception:
                logger.warning("the child worker failed a pass", exc_info=True)
            await self._idle(nap)
            nap = min(poll_ms, nap * 2)


__all__ = [
    "STUCK_GRACE_S",
    "DEFAULT_STORE_RETRIES",
    "DEFAULT_WAKE_CLAIM_MS",
    "ChildWorker",
    "ChildYielded",
    "FinishReporting",
    "OnStuck",
    "RunChild",
    "WakeParent",
    "cancel_and_wait",
    "error_outcome",
    "flush_bounded",
    "release_bounded",
]
