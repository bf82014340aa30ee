"""The fenced-effect suite's value, bad names and keys, and the writes and checks its
cases share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.types import FencedEffectKey, FencedEffectResult
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fencing import World, expect, fail

CaseRun = Callable[[CaseContext], Awaitable[None]]

VALUE = {"charge": "ch_1", "amount": 1250, "items": [1, "two", None, True], "note": "é"}

BAD_NAMES = ("", "has space", "x" * 101, "naïve", "a/b", "semi;colon")
BAD_BUSINESS_KEYS = ("", "   ", "line\nbreak", "nul\x00byte", "k" * 256)


async def _write(
    w: World,
    key: FencedEffectKey,
    label: str,
    value: Any = VALUE,
    *,
    instance: int = 0,
    skew_ms: int = 0,
) -> FencedEffectResult[Any]:
    return await w.effects(instance, skew_ms=skew_ms).save_result_if_absent(
        key, w.work(label, value)
    )


async def _expect_fenced(
    w: World,
    key: FencedEffectKey,
    what: str,
    *,
    instance: int = 0,
    skew_ms: int = 0,
    rule: str = "no-stale-write",
    reason: FenceRefusal | None = None,
) -> None:
    """The write at `key` is refused with `ExecutionFencedError` naming its scope and token
    (and `reason`, when given), without running its work or leaving a business row."""
    work = w.work(f"refused-{w.name('row')}", VALUE)
    before = await w.rows()
    try:
        got = await w.effects(instance, skew_ms=skew_ms).save_result_if_absent(key, work)
    except ExecutionFencedError as exc:
        expect(
            exc.scope_key == key.scope_key and exc.token == key.token,
            "no-stale-write",
            f"{what}: the refusal names scope {exc.scope_key!r} at {exc.token}, expected "
            f"{key.scope_key!r} at {key.token}",
        )
        expect(
            reason is None or exc.reason == reason,
            "no-stale-write",
            f"{what}: refused for {exc.reason!r}, where every store names {reason}",
        )
    else:
        fail(rule, f"{what}: the write was accepted ({got})")
    expect(work.calls == 0, rule, f"{what}: the refused write ran its work")
    after = await w.rows()
    expect(
        after == before,
        rule,
        f"{what}: the refused write left business rows {after[len(before) :]}",
    )


async def _expect_ran(w: World, result: FencedEffectResult[Any], value: Any, what: str) -> None:
    expect(
        result == FencedEffectResult(value, False, None),
        "one-effect-per-key",
        f"{what}: answered {result}, expected the work's value, not replayed",
    )
