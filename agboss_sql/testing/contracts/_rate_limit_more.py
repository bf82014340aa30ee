"""More cases of the rate limits' suite: a slot's own end decides it, and no other's.

Added where mutation testing of the stores (docs/mutation.md) found changes no case saw: a
holder whose own slot ended at this very millisecond counted as live (admitted past a full
key); and the clearing of a key's expired slots without its expiry term, which clears the
key's live slots too (shown by hand: mutmut's own mutant of that term sets it to `None`,
which SQLAlchemy sends as `AND NULL`, clearing nothing, an equivalent mutant).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agboss_sql.contracts.stores import RateLimitRepository
from agboss_sql.testing._case import Case, CaseContext

CONTRACT = "rate_limit"
TTL = 10_000


def _limits(ctx: CaseContext, instance: int = 0) -> RateLimitRepository:
    store: RateLimitRepository = ctx.store(CONTRACT, instance)
    return store


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


async def clears_expired_slots_only(ctx: CaseContext) -> None:
    """A take that finds an expired slot of the key leaves the key's live slots alone:
    they still count against the maximum and can still be renewed."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    _expect(await a.acquire_slot("model", "long", 2, 10 * TTL), "slots-within-max", "refused")
    _expect(await b.acquire_slot("model", "short", 2, TTL), "slots-within-max", "refused")
    await ctx.clock.advance(TTL)
    _expect(
        await b.acquire_slot("model", "new", 2, TTL),
        "expired-slot",
        "the short slot still counted at its end",
    )
    _expect(
        not await a.acquire_slot("model", "one-more", 2, TTL),
        "slots-within-max",
        "a third holder was admitted to a key of two live slots (the take that found the "
        "expired slot cleared a live one)",
    )
    _expect(
        await b.renew_slot("model", "long", TTL),
        "renew-live-slot",
        "the live slot could not be renewed after another take cleared the expired one",
    )


async def ends_a_holders_own_slot_at_its_end(ctx: CaseContext) -> None:
    """At the very millisecond its slot ends, a holder has no slot of its own: asking again
    with the key full of others' live slots is refused."""
    a, b = _limits(ctx, 0), _limits(ctx, 1)
    start = ctx.clock.now()
    _expect(await a.acquire_slot("model", "h-1", 2, TTL), "slots-within-max", "h-1 refused")
    await ctx.clock.advance(1)
    _expect(await b.acquire_slot("model", "h-2", 2, TTL), "slots-within-max", "h-2 refused")
    _expect(await b.acquire_slot("model", "h-3", 3, TTL), "slots-within-max", "h-3 refused")
    await ctx.clock.advance(start + TTL - ctx.clock.now())
    _expect(
        not await a.acquire_slot("model", "h-1", 2, TTL),
        "expired-slot",
        "h-1 was admitted at its slot's end to a key full of two others' live slots (its "
        "ended slot counted as its own)",
    )


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("a take clears the key's expired slots only", clears_expired_slots_only),
    ("a holder's own slot ends at its end", ends_a_holders_own_slot_at_its_end),
]


def more_cases() -> list[Case]:
    """The cases of this module, in the suite's order."""
    return [Case(CONTRACT, name, run) for name, run in CASES]


__all__ = ["more_cases"]
