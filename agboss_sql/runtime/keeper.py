"""`LeaseKeeper`: holds one execution lease, renews it, and fences itself when it cannot.

The trust rule (docs/limits.md): a take or renewal that answers `remaining` ms lets the
holder trust its lease for `remaining - 1000` ms from the moment it **sent** the
request, on its monotonic clock. Nothing is trusted past that instant unless a
later renewal, sent before it, was answered before it. The store decides expiry
by its own time; the holder only ever under-estimates how long it has.

One exception, its own fenced effect (`effect()`): while the effect's transaction holds
the lease row (its fence passed), nobody can take the lease, and the holder's renewal
waits behind that lock. The keeper then trusts to the end of the answered `remaining`
(the margin not subtracted), and until then accepts a renewal answered after the
effect's commit; past it the lease is lost, as always.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from agboss_sql.contracts.clocks import Clock
from agboss_sql.contracts.errors import (
    ExecutionCancelledError,
    ExecutionLeaseLostError,
    StoreUnavailableError,
)
from agboss_sql.contracts.stores import (
    CANCEL_REQUEST_KEY,
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    ExecutionTreeRepository,
)
from agboss_sql.contracts.types import ExecutionLease, LeaseEventKind
from agboss_sql.runtime._log import log_lease_event, log_take, notify_lease_move
from agboss_sql.runtime._tasks import wait_cancelled
from agboss_sql.runtime.signal import AbortSignal
from agboss_sql.sql._backoff import backoff_s

logger = logging.getLogger("agboss_sql.runtime")

DEFAULT_LEASE_MS = 30_000
TRUST_MARGIN_MS = 1_000
"""How much shorter than the answered `remaining` the holder trusts its lease (docs/limits.md)."""


class _State(enum.Enum):
    IDLE = "idle"
    HELD = "held"
    LOST = "lost"
    RELEASED = "released"
    YIELDED = "yielded"
    FINISHED = "finished"


_current: contextvars.ContextVar[LeaseKeeper | None] = contextvars.ContextVar(
    "agboss_current_lease_keeper", default=None
)


def current_keeper() -> LeaseKeeper | None:
    """The keeper of the execution this task runs for (set by `ChildWorker` around a
    child's run), or `None`."""
    return _current.get()


class LeaseKeeper:
    """Holds one lease of `(tenant_id, execution_id)` for one run.

    - `take` acquires it (or `adopt` holds one acquired elsewhere) and writes the
      `acquired` / `taken-over` event after the move.
    - `start` renews it every `lease_ms / 3` on the application clock, sooner when the
      trust window would end first; a watchdog aborts the moment the window ends with no
      renewal confirmed (a renewal that hangs self-fences).
    - `confirm_now` renews it at once: call it before every checkpoint write.
    - A renewal that fails with a transient store error (`StoreUnavailableError`, a
      `StoreTimeoutError` included: nothing was applied, or a renewal applied twice
      only extends the lease again) is sent again, with `_backoff`'s pauses on `clock`,
      for as long as the trust window lasts.
    - A renewal answered `None`, one that raises any other error, or no renewal confirmed
      inside the trust window loses the lease: `signal` is aborted with
      `ExecutionLeaseLostError` (`execution.lease-lost`), a `lost` event is written, and
      nothing is renewed again.
    - Every renewal (background or `confirm_now`) also looks for `CANCEL_REQUEST_KEY` on
      the root's tree when a tree store is given; a request aborts `signal` with
      `ExecutionCancelledError`. The lease stays held and renewed after a cancellation so
      the holder can unwind and record the outcome.
    - `release`, `yield_`, `reclaim` and `finish` move the lease and log the move; a move
      the store refuses means the lease is no longer this run's: it counts as lost.
    """

    def __init__(
        self,
        leases: ExecutionLeaseRepository,
        events: ExecutionLeaseEventRepository | None,
        clock: Clock,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        tree: ExecutionTreeRepository | None = None,
        root_execution_id: str | None = None,
        trust_margin_ms: int = TRUST_MARGIN_MS,
        log_renewals: bool = False,
    ) -> None:
        if isinstance(trust_margin_ms, bool) or not isinstance(trust_margin_ms, int):
            raise ValueError(f"trust_margin_ms must be an int, got {trust_margin_ms!r}")
        if trust_margin_ms < 0:
            raise ValueError(f"trust_margin_ms must be >= 0, got {trust_margin_ms}")
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms <= 0:
            raise ValueError(f"lease_ms must be a positive number of ms, got {lease_ms!r}")
        if lease_ms <= trust_margin_ms:
            raise ValueError(
                f"a lease of {lease_ms} ms is never trusted with a {trust_margin_ms} ms margin: "
                "use a longer lease or a smaller trust_margin_ms"
            )
        self.leases = leases
        self.events = events
        self.clock = clock
        self.lease_ms = lease_ms
        self.tree = tree
        self.root_execution_id = root_execution_id
        self.trust_margin_ms = trust_margin_ms
        self.log_renewals = log_renewals
        self.signal = AbortSignal()
        self._lease: ExecutionLease | None = None
        self._state = _State.IDLE
        self._trusted_until: int | None = None
        self._started = False
        self._renewer: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._effects_holding = 0
        self._held_past_trust = False
        self._renewals_in_flight = 0
        self._moving = False

    # -- what the holder knows ---------------------------------------------------------

    @property
    def lease(self) -> ExecutionLease | None:
        """The lease this keeper holds (or last held), with its epoch."""
        return self._lease

    @property
    def interval_ms(self) -> int:
        """The background renewal cadence: a third of the lease."""
        return max(1, self.lease_ms // 3)

    @property
    def held(self) -> bool:
        """True while this keeper holds the lease (taken, not lost, released, yielded or
        finished). Says nothing about trust: see `trusted()`."""
        return self._state is _State.HELD

    @property
    def lost(self) -> bool:
        """True once the lease was lost (refused, failed or unconfirmed renewal, or a move
        the store refused)."""
        return self._state is _State.LOST

    @property
    def trusted_until(self) -> int | None:
        """The monotonic instant the trust window ends, or `None` before any answer."""
        return self._trusted_until

    def trusted(self) -> bool:
        """True only while held and inside the trust window (`sent + remaining - margin`,
        on `clock.monotonic()`; `sent + remaining` while its own effect holds the lease
        row, or until the renewal that waited behind it answers: see `effect`)."""
        deadline = self._deadline()
        return (
            self._state is _State.HELD
            and deadline is not None
            and self.clock.monotonic() < deadline
        )

    def _deadline(self) -> int | None:
        """When the lease stops being trusted: the trust window's end, or, while this
        keeper's own effect holds the lease row (and until a renewal answers after it held
        it past the window), the answered `remaining`'s end: nobody else can take a lease
        whose row its holder's transaction has locked."""
        until = self._trusted_until
        if until is None:
            return None
        if self._effects_holding or self._held_past_trust:
            return until + self.trust_margin_ms
        return until

    def check_lease(self) -> None:
        """Raise `ExecutionLeaseLostError` unless the lease is held and trusted now. A trust
        window found over loses the lease at once, as the watchdog would."""
        if self._state is _State.HELD and not self.trusted():
            self._mark_lost("the lease was not confirmed before its trust window ended")
        if self._state is not _State.HELD:
            reason = self.signal.reason
            if self._state is _State.LOST and isinstance(reason, ExecutionLeaseLostError):
                raise reason
            raise ExecutionLeaseLostError(
                f"this keeper holds no lease of {self._describe()} ({self._state.value}): "
                "start no further call"
            )

    def guard(self) -> None:
        """Call before every model, tool or effect call: raise the signal's reason when
        aborted (cancelled or lost), and `ExecutionLeaseLostError` when the lease is not
        held and trusted."""
        self.signal.raise_if_aborted()
        self.check_lease()

    # -- taking --------------------------------------------------------------------------

    async def take(self, tenant_id: str, execution_id: str) -> ExecutionLease | None:
        """Acquire the lease (one store call); trust it from the moment the request was
        sent; log `acquired` or `taken-over` after the move. `None` when refused."""
        self._check_unused()
        sent = self.clock.monotonic()
        lease = await self.leases.acquire(tenant_id, execution_id, self.lease_ms)
        if lease is None:
            return None
        self._hold(lease, sent)
        await log_take(self.events, self.clock, lease)
        return lease

    async def adopt(self, lease: ExecutionLease) -> bool:
        """Hold a lease acquired elsewhere (by the recovery sweep) and confirm it at once:
        the trust window must be measured from a request this keeper sent. True when the
        confirmation held it."""
        self._check_unused()
        self._lease = lease
        self._state = _State.HELD
        self._trusted_until = None
        return await self.confirm_now()

    def _check_unused(self) -> None:
        if self._state is not _State.IDLE:
            raise RuntimeError(
                f"this keeper already held {self._describe()}: a keeper holds one lease "
                "for one run; make a new keeper"
            )

    def _hold(self, lease: ExecutionLease, sent: int) -> None:
        self._lease = lease
        self._state = _State.HELD
        self._trusted_until = sent + lease.remaining_ms - self.trust_margin_ms

    # -- its own effects -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def effect(self) -> AsyncIterator[Callable[[], None]]:
        """Around one fenced effect of this run: `async with keeper.effect() as held:` and
        call `held()` first thing in the effect's work (its fence has passed: the effect's
        transaction holds the lease row until it ends). While it does, a renewal waits
        behind that lock, and the keeper trusts the lease to the end of the last answered
        `remaining` instead of `remaining - margin`: an effect that ends before the
        lease's end as last confirmed keeps it (renewals come every third of the lease:
        call `confirm_now()` first for an effect longer than two thirds of it). When the
        effect ends after the trust window did, the keeper renews at once (the lock is
        gone) before the block exits; an effect that outlasts its lease loses it when the
        lease's time is up, though the effect itself commits (nobody could take the lease
        while its transaction held the row)."""
        holding = False

        def held() -> None:
            nonlocal holding
            if not holding:
                holding = True
                self._effects_holding += 1

        confirm = False
        try:
            yield held
        finally:
            if holding:
                self._effects_holding -= 1
                until = self._trusted_until
                if not self._effects_holding and self.held and until is not None:
                    # Held past the window: renew now. A renewal sent before the effect
                    # ended (it waited behind the row) may answer after the window: both
                    # are judged by the lease's end, not the window's.
                    confirm = self.clock.monotonic() >= until
                    if confirm or self._renewals_in_flight:
                        self._held_past_trust = True
        if confirm and self.held:
            await self.confirm_now()

    # -- renewing ------------------------------------------------------------------------

    def start(self) -> None:
        """Start background renewal (every `lease_ms / 3` on the application clock) and the
        trust-window watchdog. Idempotent; needs a held lease."""
        if self._state is not _State.HELD:
            raise RuntimeError(f"start needs a held lease; the keeper is {self._state.value}")
        self._started = True
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        """Stop renewing without releasing the lease (shutdown, or an instance frozen in a
        test); the lease runs out on the store's time unless someone releases it."""
        self._started = False
        tasks = self._cancel_tasks()
        for task in tasks:
            await wait_cancelled(task)

    async def confirm_now(self) -> bool:
        """Renew at once and say whether the lease is still held (call it before every
        checkpoint write). A renewal failing transiently is sent again while the trust
        window lasts, so the answer may take until the window ends. False once lost,
        released, yielded or finished (or being moved so): then it sends nothing."""
        if self._state is not _State.HELD or self._moving:
            return False
        return await self._renew()

    async def _renew_loop(self) -> None:
        while self._state is _State.HELD:
            wait = self.interval_ms
            if self._trusted_until is not None:
                # Renew early when the trust window would end before the next beat.
                left = self._trusted_until - self.clock.monotonic()
                wait = min(wait, max(0, left // 2))
            await self.clock.sleep(wait)
            if not self.held:
                return
            await self._renew()

    async def _watch(self) -> None:
        while self._state is _State.HELD:
            until = self._deadline()
            now = self.clock.monotonic()
            if until is None or now >= until:
                if self._effects_holding and until is not None:
                    # Its own effect still holds the row past the lease's answered end.
                    await self._lose(
                        "its own effect held the lease past the lease's end: the effect "
                        "commits, but the lease is over"
                    )
                    return
                await self._lose("the lease was not confirmed before its trust window ended")
                return
            if self._effects_holding and now >= (self._trusted_until or now):
                self._held_past_trust = True
            # Woken at least every trust margin: an effect may begin holding meanwhile.
            await self.clock.sleep(min(until - now, max(1, self.trust_margin_ms)))

    async def _renew(self) -> bool:
        lease = self._lease
        assert lease is not None
        cancel_check: asyncio.Task[bool] | None = None
        if self.tree is not None and not isinstance(self.signal.reason, ExecutionCancelledError):
            # Looked up beside the renewal, not after it: one round trip of latency.
            cancel_check = asyncio.get_running_loop().create_task(self._cancel_requested(lease))
        try:
            try:
                sent, remaining = await self._renew_within_trust(lease)
            except Exception as error:
                if self.held and self._lease is lease:
                    await self._lose(f"the renewal failed: {error!r}")
                return False
            if not self.held or self._lease is not lease:
                return False
            answered = self.clock.monotonic()
            if remaining is None:
                await self._lose(
                    "the renewal was refused: the lease is over or another holder has it"
                )
                return False
            deadline = self._deadline()
            if deadline is not None and answered >= deadline:
                await self._lose("the renewal was confirmed only after the trust window ended")
                return False
            until = sent + remaining - self.trust_margin_ms
            self._trusted_until = (
                until if self._trusted_until is None else max(self._trusted_until, until)
            )
            if answered < self._trusted_until:
                self._held_past_trust = False
            if self.log_renewals:
                await log_lease_event(self.events, self.clock, lease, LeaseEventKind.RENEWED)
            else:
                notify_lease_move(lease, LeaseEventKind.RENEWED)
            if cancel_check is not None:
                check, cancel_check = cancel_check, None
                if await check:
                    self.signal.abort(
                        ExecutionCancelledError(
                            f"execution {self._describe()} was cancelled: a cancel request "
                            "is on its tree"
                        )
                    )
            return True
        finally:
            if cancel_check is not None:
                cancel_check.cancel()

    async def _renew_within_trust(self, lease: ExecutionLease) -> tuple[int, int | None]:
        """`leases.renew`, sent again after each transient store error while the lease is
        held and its trust window lasts: the send time of the attempt answered and its
        answer. The last error is raised when the window would end (or the lease moved)
        before the next attempt. Ending the window is the watchdog's (or the caller's
        answer check's) to act on: this only decides when to stop asking."""
        attempt = 0
        while True:
            sent = self.clock.monotonic()
            self._renewals_in_flight += 1
            try:
                return sent, await self.leases.renew(lease, self.lease_ms)
            except StoreUnavailableError as error:
                attempt += 1
                pause_ms = max(1, round(backoff_s(attempt) * 1000))
                until = self._deadline()
                if (
                    not self.held
                    or self._lease is not lease
                    or until is None
                    or self.clock.monotonic() + pause_ms >= until
                ):
                    raise
                if attempt == 1:  # once per renewal: an outage would log every few ms
                    logger.warning(
                        "the renewal of %s failed (%r); sending it again while its trust "
                        "window lasts",
                        self._describe(),
                        error,
                    )
            finally:
                self._renewals_in_flight -= 1
            await self.clock.sleep(pause_ms)

    async def _cancel_requested(self, lease: ExecutionLease) -> bool:
        assert self.tree is not None
        root = self.root_execution_id or lease.execution_id
        try:
            return await self.tree.get(lease.tenant_id, root, CANCEL_REQUEST_KEY) is not None
        except Exception:
            # A failed look-up is tried again at the next renewal; it never costs the lease.
            logger.warning("could not read the cancel request of %s", root, exc_info=True)
            return False

    # -- losing --------------------------------------------------------------------------

    def _mark_lost(self, why: str) -> bool:
        """Lose the lease now (synchronously): abort the signal, stop renewing. True when
        this call lost it; the `lost` event is the caller's to write."""
        if self._state not in (_State.HELD, _State.YIELDED):
            return False
        self._state = _State.LOST
        self.signal.abort(
            ExecutionLeaseLostError(
                f"lost the lease of {self._describe()}: {why}; another instance may own this "
                "execution now, so start no further model, tool or effect call"
            )
        )
        self._cancel_tasks()
        lease = self._lease
        assert lease is not None
        self._spawn(
            log_lease_event(self.events, self.clock, lease, LeaseEventKind.LOST, reason=why)
        )
        return True

    async def _lose(self, why: str) -> None:
        if self._mark_lost(why):
            # The event was spawned; let it be written before the loser goes on. Waited
            # for, never gathered: the loser may be the watchdog, which `stop()` cancels,
            # and a cancelled gather would cancel the event's write with it.
            await self._wait_background()

    async def flush(self) -> None:
        """Wait for the lease log writes this keeper started in the background (the `lost`
        event of a loss found outside a renewal): call it before closing the stores."""
        await self._wait_background()

    async def _wait_background(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _cancel_tasks(self) -> list[asyncio.Task[None]]:
        current = asyncio.current_task()
        cancelled = []
        for task in (self._renewer, self._watchdog):
            if task is not None and task is not current and not task.done():
                task.cancel()
                cancelled.append(task)
        return cancelled

    # -- letting go ----------------------------------------------------------------------

    async def release(self) -> bool:
        """Stop renewing and release the lease; log `released`. False when it was not held
        (a refusal by the store loses it, with a `lost` event)."""
        refused = "the store refused the release: the lease was no longer held"
        return await self._move(self.leases.release, _State.RELEASED, refused)

    async def yield_(self) -> bool:
        """Stop renewing and yield the still-live lease so anyone may take it (a parent
        waiting on its children); log `yielded`. `reclaim` takes it back if nobody did."""
        refused = "the store refused the yield: the lease was over or not held"
        return await self._move(self.leases.yield_lease, _State.YIELDED, refused)

    async def reclaim(self) -> ExecutionLease | None:
        """Take a yielded lease back at the next epoch when nobody took it; log `reclaimed`
        and resume renewal if it was running. `None` (and the lease counts as lost) when
        someone else took it or it ran out."""
        if self._state is not _State.YIELDED:
            return None
        lease = self._lease
        assert lease is not None
        sent = self.clock.monotonic()
        reclaimed = await self.leases.reclaim(lease, self.lease_ms)
        if reclaimed is None:
            await self._lose("the yielded lease could not be reclaimed: someone else has it")
            return None
        self._hold(reclaimed, sent)
        await log_lease_event(self.events, self.clock, reclaimed, LeaseEventKind.RECLAIMED)
        if self._started:
            self.start()
        return reclaimed

    async def finish(self) -> bool:
        """Stop renewing and finish the lease (never granted again); log `finished`."""
        refused = "the store refused the finish: the lease was no longer held"
        return await self._move(self.leases.finish, _State.FINISHED, refused)

    async def _move(
        self, move: Callable[[ExecutionLease], Awaitable[bool]], state: _State, refused: str
    ) -> bool:
        """One move of the held lease, one at a time: a second move while one is under way
        sends nothing (False). The store's call, the new state and its event go to their
        end even when the caller is cancelled meanwhile: a move the store may have applied
        never leaves the lease looking held (a later release would be refused: a false
        `lost`). A refusal loses the lease."""
        if self._state is not _State.HELD or self._moving:
            return False
        self._moving = True
        lease = self._lease
        assert lease is not None

        async def run() -> bool:
            try:
                started = self._started
                await self.stop()
                self._started = started
                if not await move(lease):
                    self._mark_lost(refused)
                    return False
                self._state = state
            finally:
                self._moving = False
            await log_lease_event(self.events, self.clock, lease, LeaseEventKind(state.value))
            return True

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if not await asyncio.shield(task):
            await self._wait_background()  # the `lost` event
            return False
        return True

    def _describe(self) -> str:
        lease = self._lease
        if lease is None:
            return "no execution"
        return f"{lease.tenant_id}/{lease.execution_id} at epoch {lease.lease_epoch}"

    def __repr__(self) -> str:
        return f"LeaseKeeper({self._describe()}, {self._state.value})"


def bind_keeper(keeper: LeaseKeeper) -> contextvars.Token[LeaseKeeper | None]:
    """Make `keeper` the `current_keeper()` of this context (and of tasks created in it)."""
    return _current.set(keeper)


def unbind_keeper(token: contextvars.Token[LeaseKeeper | None]) -> None:
    """Undo `bind_keeper`."""
    _current.reset(token)


__all__ = [
    "DEFAULT_LEASE_MS",
    "TRUST_MARGIN_MS",
    "LeaseKeeper",
    "bind_keeper",
    "current_keeper",
    "unbind_keeper",
]
