"""Contract suite of `RateLimitRepository` (docs/contracts.md): limits across instances.

On the store's time (the case's `VirtualClock`, or the database's own in the database-time
case): slots are counted and taken under one lock and never exceed the maximum, an expired
slot does not count and cannot be renewed; a fixed window never exceeds its limit and a
refused amount is not added; a pause never shortens and reads `None` once over. An
instance's own clock decides nothing: one an hour ahead neither evicts a live slot nor
starts a window of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.stores import RateLimitRepository
from agboss_sql.contracts.types import WindowResult
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import on_database_time
from agboss_sql.testing.contracts._rate_limit_more import more_cases

CONTRACT = "rate_limit"
TTL = 10_000
WINDOW = 60_000


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _limits(ctx: CaseContext, instance: int = 0) -> RateLimitRepository:
    store: RateLimitRepository = ctx.store(CONTRACT, instance)
    return store


async def takes_slots_up_to_the_maximum(ctx: CaseContext) -> None:
    """Slots go to distinct holders up to `max_slots`, per key; the next holder is refused."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    _expect(await a.acquire_slot("model", "h-1", 2, TTL), "slots-within-max", "h-1 refused")
    _expect(await b.acquire_slot("model", "h-2", 2, TTL), "slots-within-max", "h-2 refused")
    third = await a.acquire_slot("model", "h-3", 2, TTL)
    _expect(not third, "slots-within-max", "a third slot of max 2 was granted")
    other = await b.acquire_slot("other-model", "h-3", 2, TTL)
    _expect(other, "slots-within-max", "another key's slots were counted against this one")


async def never_exceeds_max_slots_under_concurrent_acquires(ctx: CaseContext) -> None:
    """Twenty holders acquire at once through both instances, round after round: exactly
    `max_slots` win each round (releasing them between rounds)."""
    for round_ in range(4):
        max_slots = 3 + round_
        holders = [f"r{round_}-h-{i}" for i in range(20)]
        taken = await asyncio.gather(
            *(
                _limits(ctx, i % 2).acquire_slot("model", h, max_slots, TTL)
                for i, h in enumerate(holders)
            )
        )
        winners = [h for h, ok in zip(holders, taken, strict=True) if ok]
        _expect(
            len(winners) == max_slots,
            "slots-within-max",
            f"round {round_ + 1}: {len(winners)} of 20 concurrent acquires won {max_slots} slots",
        )
        late = await _limits(ctx, 0).acquire_slot("model", f"r{round_}-late", max_slots, TTL)
        _expect(not late, "slots-within-max", f"round {round_ + 1}: a slot past the maximum")
        await asyncio.gather(
            *(_limits(ctx, i % 2).release_slot("model", h) for i, h in enumerate(winners))
        )


async def counts_a_holders_live_slot_once(ctx: CaseContext) -> None:
    """A holder acquiring again refreshes its own slot instead of taking a second one."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    _expect(await a.acquire_slot("model", "h-1", 2, TTL), "slot-refresh", "first take refused")
    _expect(await b.acquire_slot("model", "h-1", 2, TTL), "slot-refresh", "the refresh refused")
    _expect(
        await a.acquire_slot("model", "h-2", 2, TTL),
        "slot-refresh",
        "h-1 taking twice used two of the two slots",
    )
    await ctx.clock.advance(TTL - 1)
    _expect(await b.acquire_slot("model", "h-1", 2, TTL), "slot-refresh", "live refresh refused")
    await ctx.clock.advance(TTL - 1)
    # h-2 has expired; h-1 was refreshed at TTL - 1 and is still live.
    _expect(await a.acquire_slot("model", "h-3", 2, TTL), "expired-slot", "h-2's slot counted")
    _expect(
        not await b.acquire_slot("model", "h-4", 2, TTL),
        "slot-refresh",
        "the refreshed slot of h-1 did not count",
    )


async def does_not_count_an_expired_slot(ctx: CaseContext) -> None:
    """A slot is live while `expires_at > now`: 1 ms before its end it still counts; at its
    end, and after, it does not."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    _expect(await a.acquire_slot("model", "h-1", 1, TTL), "slots-within-max", "h-1 refused")
    await ctx.clock.advance(TTL - 1)
    _expect(
        not await b.acquire_slot("model", "h-2", 1, TTL),
        "slots-within-max",
        "h-1's slot did not count 1 ms before it ends",
    )
    await ctx.clock.advance(1)
    _expect(
        await b.acquire_slot("model", "h-2", 1, TTL),
        "expired-slot",
        "h-1's slot still counted at its end (expires_at <= now is expired)",
    )
    await ctx.clock.advance(TTL + 1)
    _expect(
        await a.acquire_slot("model", "h-3", 1, TTL),
        "expired-slot",
        "h-2's slot still counted after its end",
    )


async def renews_only_a_live_slot(ctx: CaseContext) -> None:
    """`renew_slot` extends the holder's unexpired slot; a holder with no slot, or an
    expired or released one, gets False and no slot."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    _expect(not await a.renew_slot("model", "h-1", TTL), "renew-live-only", "renewed no slot")
    _expect(
        await a.acquire_slot("model", "h-1", 1, TTL), "slots-within-max", "the take was refused"
    )
    await ctx.clock.advance(TTL - 1)
    _expect(await b.renew_slot("model", "h-1", TTL), "renew-live-only", "a live slot's renewal")
    await ctx.clock.advance(TTL - 1)
    _expect(
        not await b.acquire_slot("model", "h-2", 1, TTL),
        "renew-live-only",
        "the renewal did not extend the slot",
    )
    await ctx.clock.advance(1)
    _expect(
        not await a.renew_slot("model", "h-1", TTL),
        "renew-live-only",
        "an expired slot (at its end) was renewed",
    )
    _expect(
        await b.acquire_slot("model", "h-2", 1, TTL),
        "expired-slot",
        "a refused renewal left the expired slot counting",
    )
    await b.release_slot("model", "h-2")
    _expect(
        not await a.renew_slot("model", "h-2", TTL), "renew-live-only", "a released slot renewed"
    )
    _expect(
        await a.acquire_slot("model", "h-3", 1, TTL),
        "renew-live-only",
        "a refused renewal of a released slot took a slot",
    )


async def gives_a_released_slot_back(ctx: CaseContext) -> None:
    """`release_slot` frees the holder's slot at once; releasing twice, or a slot never
    held, is harmless and frees nothing else."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    _expect(await a.acquire_slot("model", "h-1", 1, TTL), "slots-within-max", "h-1 refused")
    await b.release_slot("model", "h-1")
    await b.release_slot("model", "h-1")
    await a.release_slot("never-used", "h-1")
    _expect(await b.acquire_slot("model", "h-2", 1, TTL), "release-slot", "slot not given back")
    await a.release_slot("model", "h-9")
    _expect(
        not await a.acquire_slot("model", "h-3", 1, TTL),
        "release-slot",
        "releasing a slot never held freed h-2's",
    )


async def never_exceeds_a_windows_limit(ctx: CaseContext) -> None:
    """A window adds an amount only while `used + amount <= limit`; a refused amount is not
    added, and every answer in one window names the same `resets_at`."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    steps = [(3, True, 3), (5, True, 8), (3, False, 8), (2, True, 10), (1, False, 10)]
    resets: set[int] = set()
    for i, (amount, allowed, used) in enumerate(steps):
        got = await (a if i % 2 == 0 else b).add_to_window("calls", WINDOW, amount, 10)
        resets.add(got.resets_at)
        _expect(
            (got.allowed, got.used) == (allowed, used),
            "refused-not-added" if not (allowed or got.allowed) else "window-within-limit",
            f"adding {amount} (limit 10) gave allowed={got.allowed}, used={got.used}; "
            f"expected allowed={allowed}, used={used}",
        )
    _expect(len(resets) == 1, "window-reset", f"one window named resets_at {sorted(resets)}")
    too_big = await a.add_to_window("tokens", WINDOW, 11, 10)
    _expect(
        (too_big.allowed, too_big.used) == (False, 0),
        "refused-not-added",
        f"an amount over the limit in a fresh window gave {too_big}",
    )
    other = await b.add_to_window("other", WINDOW, 10, 10)
    _expect(other.allowed and other.used == 10, "window-within-limit", f"other key: {other}")


async def never_exceeds_a_windows_limit_under_concurrent_adds(ctx: CaseContext) -> None:
    """Twenty adds at once through both instances, in two windows: the allowed amounts sum
    to the `used` the store keeps, which never passes the limit."""
    for round_ in range(2):
        amounts = [1 + (i % 3) for i in range(20)]
        results = await asyncio.gather(
            *(
                _limits(ctx, i % 2).add_to_window("calls", WINDOW, n, 17)
                for i, n in enumerate(amounts)
            )
        )
        allowed = sum(n for n, r in zip(amounts, results, strict=True) if r.allowed)
        # An amount that never fits reads the window without adding to it.
        final = await _limits(ctx, 0).add_to_window("calls", WINDOW, 100, 17)
        _expect(
            final.used == allowed,
            "window-within-limit",
            f"window {round_ + 1}: the allowed adds sum to {allowed} but the window holds "
            f"{final.used} (a refused amount was added, or an allowed one lost)",
        )
        _expect(
            allowed <= 17 and max(r.used for r in results) <= 17,
            "window-within-limit",
            f"window {round_ + 1}: {allowed} allowed against a limit of 17",
        )
        _expect(
            allowed >= 17 - 2,
            "window-within-limit",
            f"window {round_ + 1}: only {allowed} of 40 allowed against a limit of 17 "
            "(a refusal below the limit)",
        )
        await ctx.clock.advance(final.resets_at - ctx.clock.now())


async def resets_a_window_at_its_boundary(ctx: CaseContext) -> None:
    """`resets_at` lies within one window ahead; 1 ms before it the window is still full,
    at it a new window starts empty."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    first = await a.add_to_window("calls", WINDOW, 4, 4)
    now = ctx.clock.now()
    _expect(
        first.allowed and now < first.resets_at <= now + WINDOW,
        "window-reset",
        f"at {now} a {WINDOW} ms window resets at {first.resets_at}",
    )
    await ctx.clock.advance(first.resets_at - now - 1)
    full = await b.add_to_window("calls", WINDOW, 1, 4)
    _expect(
        (full.allowed, full.used, full.resets_at) == (False, 4, first.resets_at),
        "window-within-limit",
        f"1 ms before the window's end adding 1 gave {full}",
    )
    await ctx.clock.advance(1)
    fresh = await b.add_to_window("calls", WINDOW, 3, 4)
    _expect(
        (fresh.allowed, fresh.used) == (True, 3),
        "window-reset",
        f"at the window's end adding 3 gave {fresh}: the window did not reset",
    )
    _expect(
        fresh.resets_at == first.resets_at + WINDOW,
        "window-reset",
        f"the next window resets at {fresh.resets_at}, expected {first.resets_at + WINDOW}",
    )


async def never_shortens_a_pause(ctx: CaseContext) -> None:
    """`pause_until` keeps the later end; `paused_until` reads it on both instances until
    it is over (1 ms before: paused; at its end: `None`)."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    start = ctx.clock.now()
    none = await a.paused_until("provider")
    _expect(none is None, "pause-over", f"a key never paused reads {none}")
    await a.pause_until("provider", start + 5_000)
    await b.pause_until("provider", start + 1_000)
    got = await b.paused_until("provider")
    _expect(got == start + 5_000, "pause-never-shortens", f"paused until {got}, want +5000")
    await b.pause_until("provider", start + 8_000)
    got = await a.paused_until("provider")
    _expect(got == start + 8_000, "pause-never-shortens", f"the longer pause reads {got}")
    await ctx.clock.advance(8_000 - 1)
    got = await b.paused_until("provider")
    _expect(got == start + 8_000, "pause-over", f"1 ms before its end the pause reads {got}")
    await ctx.clock.advance(1)
    got = await a.paused_until("provider")
    _expect(got is None, "pause-over", f"at its end the pause still reads {got}")
    await b.pause_until("provider", start + 20_000)
    got = await a.paused_until("provider")
    _expect(got == start + 20_000, "pause-never-shortens", f"a new pause reads {got}")
    other = await a.paused_until("other-provider")
    _expect(other is None, "pause-over", f"another key reads paused until {other}")


async def keeps_the_longest_of_concurrent_pauses(ctx: CaseContext) -> None:
    """Ten pauses of one key at once, in shuffled order, through both instances: the
    longest one stands."""
    start = ctx.clock.now()
    ends = [start + 1_000 * ((i * 7) % 10 + 1) for i in range(10)]
    await asyncio.gather(
        *(_limits(ctx, i % 2).pause_until("provider", e) for i, e in enumerate(ends))
    )
    got = await _limits(ctx, 1).paused_until("provider")
    _expect(
        got == max(ends),
        "pause-never-shortens",
        f"after concurrent pauses the key reads {got}, expected the longest {max(ends)}",
    )


async def keeps_a_keys_slots_window_and_pause_apart(ctx: CaseContext) -> None:
    """One key used for slots, a window and a pause: each keeps its own count."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    start = ctx.clock.now()
    await a.pause_until("provider", start + 3_000)
    window = await b.add_to_window("provider", WINDOW, 2, 5)
    _expect(window == WindowResult(True, 2, window.resets_at), "keys-independent", f"{window}")
    _expect(await a.acquire_slot("provider", "h-1", 1, TTL), "keys-independent", "slot refused")
    _expect(
        not await b.acquire_slot("provider", "h-2", 1, TTL),
        "slots-within-max",
        "a pause or a window freed a slot",
    )
    window = await a.add_to_window("provider", WINDOW, 3, 5)
    _expect(
        (window.allowed, window.used) == (True, 5),
        "keys-independent",
        f"after slots and a pause the window gave {window}",
    )
    got = await b.paused_until("provider")
    _expect(got == start + 3_000, "keys-independent", f"the pause reads {got}")
    await b.release_slot("provider", "h-1")
    got = await a.paused_until("provider")
    _expect(got == start + 3_000, "keys-independent", f"release changed the pause: {got}")
    full = await b.add_to_window("provider", WINDOW, 1, 5)
    _expect(not full.allowed and full.used == 5, "keys-independent", f"window: {full}")


JUMP_MS = 3_600_000
"""How far ahead the jumped instance's own clock is: an hour (and the window's size)."""


async def database_time_decides_slots_and_windows(ctx: CaseContext) -> None:
    """On the database's own time (`StoreClock()`), an instance whose own clock is an hour
    ahead neither takes the live slot of a one-slot key (nor evicts it: its holder renews
    it) nor adds to a full window of an hour: it would, if its own clock decided."""
    await on_database_time(ctx)
    on_time = _limits(ctx, 0)
    jumped: RateLimitRepository = ctx.store(CONTRACT, 1, skew_ms=JUMP_MS)
    _expect(await on_time.acquire_slot("jump", "h-1", 1, TTL), "store-time", "h-1 refused")
    _expect(
        not await jumped.acquire_slot("jump", "h-2", 1, TTL),
        "store-time",
        "an instance whose clock is an hour ahead took the live slot of a one-slot key",
    )
    _expect(
        await on_time.renew_slot("jump", "h-1", TTL),
        "store-time",
        "the live slot was gone after an instance an hour ahead asked for one",
    )
    first = await on_time.add_to_window("jump", JUMP_MS, 1, 1)
    _expect(first.allowed, "store-time", f"the first unit of an empty window: {first}")
    second = await jumped.add_to_window("jump", JUMP_MS, 1, 1)
    _expect(
        not second.allowed and second.used == 1,
        "store-time",
        f"an instance an hour ahead added to a full window of an hour: {second}",
    )


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("takes slots up to the maximum", takes_slots_up_to_the_maximum),
    (
        "never exceeds max slots under 20 concurrent acquires",
        never_exceeds_max_slots_under_concurrent_acquires,
    ),
    ("counts a holder's live slot once", counts_a_holders_live_slot_once),
    ("does not count an expired slot", does_not_count_an_expired_slot),
    ("renews only a live slot", renews_only_a_live_slot),
    ("gives a released slot back", gives_a_released_slot_back),
    (
        "never exceeds a window's limit and does not add a refused amount",
        never_exceeds_a_windows_limit,
    ),
    (
        "never exceeds a window's limit under concurrent adds",
        never_exceeds_a_windows_limit_under_concurrent_adds,
    ),
    ("resets a window at its boundary", resets_a_window_at_its_boundary),
    ("never shortens a pause, and reads None once it is over", never_shortens_a_pause),
    ("keeps the longest of concurrent pauses", keeps_the_longest_of_concurrent_pauses),
    (
        "keeps a key's slots, window and pause apart",
        keeps_a_keys_slots_window_and_pause_apart,
    ),
    (
        "decides slots and windows by the database's time, whatever an instance's clock",
        database_time_decides_slots_and_windows,
    ),
]


def cases() -> list[Case]:
    """The rate limits' cases (none is a fencing case: rate limits are not fenced)."""
    return [Case(CONTRACT, name, run) for name, run in CASES] + more_cases()


__all__ = ["CONTRACT", "cases"]
