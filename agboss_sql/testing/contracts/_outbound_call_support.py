"""The outbound-call suite's intent, bad names and keys, and the checks its cases share."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.types import (
    FencedEffectKey,
    OutboundCall,
    OutboundCallSaved,
    OutboundCallStatus,
)
from agboss_sql.testing._case import CaseContext
from agboss_sql.testing.contracts._fencing import World, expect, fail

CaseRun = Callable[[CaseContext], Awaitable[None]]

INTENT = {"charge": {"amount": 1250, "currency": "EUR"}, "to": "acct-ü", "tags": [1, None]}
BAD_NAMES = ("", "has space", "x" * 101, "a/b")
BAD_BUSINESS_KEYS = ("", "   ", "tab\there", "k" * 256)


def _call_problem(got: object, want: OutboundCall, *, moved: bool) -> str | None:
    """The first field of `got` that differs from `want` (`updated_at` is not compared once
    the call has moved), or `None`."""
    if type(got) is not OutboundCall:
        return f"read back a {type(got).__name__}, not an OutboundCall"
    for field in dataclasses.fields(OutboundCall):
        if moved and field.name == "updated_at":
            continue
        g, v = getattr(got, field.name), getattr(want, field.name)
        if g != v:
            return f"{field.name} is {g!r:.200}, expected {v!r:.200}"
    status: object = got.status
    if not isinstance(status, OutboundCallStatus):
        return f"status is a {type(status).__name__}, not an OutboundCallStatus"
    return None


def _expect_call(
    got: object, want: OutboundCall, rule: str, what: str, *, moved: bool = False
) -> None:
    problem = _call_problem(got, want, moved=moved)
    if problem is not None:
        fail(rule, f"{what}: {problem}")


async def _record(
    w: World, key: FencedEffectKey, intent: Any = INTENT, *, instance: int = 0, skew_ms: int = 0
) -> OutboundCallSaved:
    return await w.calls(instance, skew_ms=skew_ms).save_if_absent(key, intent, w.now)


async def _expect_fenced(
    what: str, key: FencedEffectKey, call: Awaitable[Any], rule: str = "no-stale-write"
) -> None:
    try:
        got = await call
    except ExecutionFencedError as exc:
        expect(
            exc.scope_key == key.scope_key and exc.token == key.token,
            "no-stale-write",
            f"{what}: the refusal names {exc.scope_key!r} at {exc.token}",
        )
        return
    fail(rule, f"{what}: accepted ({got})")
