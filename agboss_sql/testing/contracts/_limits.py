"""Bad input gets one typed answer on every backend, and nothing is written.

The limits are decided once in `contracts.rules` (`MAX_INT64`, `MAX_INT32`,
`MAX_DURATION_MS`, `MAX_PAYLOAD_BYTES`, `payload_text`); each case here gives a store a value
just past one of them and proves the typed error (`InvalidNumberError`,
`InvalidPayloadError`) and that the store's state is what it was. The suites of the lease,
the child queue, the cost ledger, the fenced effect and the mesh requests take
`limit_cases(contract)`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from agboss_sql.contracts.errors import InvalidNumberError, InvalidPayloadError
from agboss_sql.contracts.rules import MAX_DURATION_MS, MAX_INT32, MAX_INT64, MAX_PAYLOAD_BYTES
from agboss_sql.contracts.types import BudgetScope, CostEntry, CostTotal, QueuedChild
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._fencing import (
    FENCED_EFFECT,
    LEASE,
    LEASE_MS,
    World,
    expect,
    fail,
    key_of,
)

CaseRun = Callable[[CaseContext], Awaitable[None]]
RULE = "bad-input"


async def _refused(what: str, error: type[Exception], call: Callable[[], Awaitable[Any]]) -> None:
    try:
        got = await call()
    except error:
        return
    except Exception as exc:
        fail(
            RULE,
            f"{what} raised {type(exc).__name__}: {exc}, where the contract raises "
            f"{error.__name__} on every backend",
        )
    fail(RULE, f"{what} answered {got!r}, where the contract raises {error.__name__}")


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _cycle() -> Any:
    value: list[Any] = []
    value.append(value)
    return value


BAD_PAYLOADS: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("NaN", lambda: {"x": math.nan}),
    ("infinity", lambda: [math.inf]),
    ("an object JSON has no form for", lambda: {"x": object()}),
    ("a set", lambda: {1, 2}),
    ("a cycle", _cycle),
    ("nesting deeper than the encoder goes", lambda: _nested(100_000)),
    ("a lone surrogate", lambda: {"text": "a\ud800b"}),
    ("a text one byte over the limit", lambda: "x" * (MAX_PAYLOAD_BYTES - 1)),
)
"""Payloads no backend stores, each built fresh (`"x" * (limit - 1)` is the limit + 1 bytes
of JSON with its quotes)."""


# --- the lease --------------------------------------------------------------------------------


async def lease_durations_past_the_limit(ctx: CaseContext) -> None:
    """A lease of `MAX_DURATION_MS + 1` ms (and of 2^63 - 1 ms) is `InvalidNumberError` for
    acquire, renew and reclaim, and moves nothing: the tree stays free, then held as it
    was."""
    w = World(ctx)
    tree = w.name()
    leases = w.leases(0)
    for too_long in (MAX_DURATION_MS + 1, MAX_INT64):
        await _refused(
            f"acquire for {too_long} ms",
            InvalidNumberError,
            partial(leases.acquire, "tenant-1", tree, too_long),
        )
    lease = await w.take(tree, 0)
    expect(lease.lease_epoch == 1, RULE, f"a refused acquire wrote: epoch {lease.lease_epoch}")
    await _refused(
        "renew for 2^63 - 1 ms", InvalidNumberError, lambda: leases.renew(lease, MAX_INT64)
    )
    expect(await leases.yield_lease(lease), RULE, "the holder's yield was refused")
    await _refused(
        "reclaim for 2^63 - 1 ms", InvalidNumberError, lambda: leases.reclaim(lease, MAX_INT64)
    )
    back = await leases.reclaim(lease, LEASE_MS)
    expect(
        back is not None and back.lease_epoch == 2,
        RULE,
        f"after the refused reclaim the holder's reclaim answered {back}",
    )


# --- the child queue --------------------------------------------------------------------------


async def queue_numbers_past_their_columns(ctx: CaseContext) -> None:
    """A depth of 2^31 is `InvalidNumberError` and queues nothing; a restart, finish or
    wait at attempt 2^31 is `InvalidNumberError` and moves nothing."""
    queue: Any = ctx.store("child_queue", 0)
    w = World(ctx)
    parent = w.name("parent")
    big = QueuedChild("tenant-1", "root", parent, w.name("child"), MAX_INT32 + 1, None)
    await _refused("enqueue at depth 2^31", InvalidNumberError, lambda: queue.enqueue(big))
    listed = await queue.children("tenant-1", parent)
    expect(listed == [], RULE, f"a refused enqueue queued {listed}")
    child = w.name("child")
    await queue.enqueue(QueuedChild("tenant-1", "root", parent, child, 1, None))
    claimed = await queue.claim("instance-1")
    expect(claimed is not None, RULE, "the queued child was not claimed")
    for what, call in (
        ("restart at attempt 2^31", lambda: queue.restart(child, MAX_INT32 + 1)),
        ("finish at attempt 2^31", lambda: queue.finish(child, None, attempt=MAX_INT32 + 1)),
        (
            "wait at attempt 2^31",
            lambda: queue.wait_for_children(child, attempt=MAX_INT32 + 1),
        ),
    ):
        await _refused(what, InvalidNumberError, call)
    [row] = await queue.children("tenant-1", parent)
    expect(
        row.status == "running" and row.attempt == 1,
        RULE,
        f"after the refused moves the child is {row.status} at {row.attempt}",
    )


async def queue_payloads_no_backend_stores(ctx: CaseContext) -> None:
    """A child's payload no backend stores is `InvalidPayloadError`, and queues nothing."""
    queue: Any = ctx.store("child_queue", 0)
    w = World(ctx)
    parent = w.name("parent")
    for label, payload in BAD_PAYLOADS:
        child = QueuedChild("tenant-1", "root", parent, w.name("child"), 1, payload())
        await _refused(f"enqueue with {label}", InvalidPayloadError, partial(queue.enqueue, child))
    listed = await queue.children("tenant-1", parent)
    expect(listed == [], RULE, f"refused enqueues queued {listed}")


# --- the cost ledger --------------------------------------------------------------------------


async def cost_numbers_past_64_bits(ctx: CaseContext) -> None:
    """An amount or a time of 2^63 is `InvalidNumberError`, and records nothing."""
    ledger: Any = ctx.store("cost_ledger", 0)
    w = World(ctx)
    tenant = w.name("tenant")
    now = ctx.clock.now()
    for field in ("tokens_in", "tokens_out", "cost_micros", "at"):
        values = {"tokens_in": 1, "tokens_out": 1, "cost_micros": 1, "at": now}
        values[field] = MAX_INT64 + 1
        entry = CostEntry(w.name("entry"), tenant, "x-1", "app", **values)
        await _refused(f"a {field} of 2^63", InvalidNumberError, partial(ledger.record, entry))
    await _refused(
        "a reservation of 2^63",
        InvalidNumberError,
        lambda: ledger.try_reserve(BudgetScope.TENANT, tenant, MAX_INT64 + 1, MAX_INT64),
    )
    total = await ledger.total(BudgetScope.TENANT, tenant)
    expect(total == CostTotal(), RULE, f"refused entries counted: {total}")


# --- payloads ---------------------------------------------------------------------------------


async def effect_results_no_backend_stores(ctx: CaseContext) -> None:
    """A fenced effect's result no backend stores is `InvalidPayloadError`, leaving no
    result and no business row: a later write of the key runs its work."""
    w = World(ctx)
    lease = await w.take(w.name(), 0)
    effects = w.effects(0)
    for label, payload in BAD_PAYLOADS:
        key = key_of(lease, step_key=w.name("step"))
        work = w.work(f"bad-{label}", payload())
        await _refused(
            f"a result with {label}",
            InvalidPayloadError,
            partial(effects.save_result_if_absent, key, work),
        )
        again = await effects.save_result_if_absent(key, w.work(f"good-{label}", {"ok": True}))
        expect(
            not again.replayed and again.value == {"ok": True},
            RULE,
            f"after a refused result with {label}, the key answered {again}",
        )
    rows = await w.rows()
    expect(
        all(row.startswith("good-") for row in rows),
        RULE,
        f"refused results left business rows: {[r for r in rows if not r.startswith('good-')]}",
    )


async def mesh_responses_no_backend_stores(ctx: CaseContext) -> None:
    """A mesh response no backend stores is `InvalidPayloadError`, and completes nothing."""
    mesh: Any = ctx.store("mesh_request", 0)
    w = World(ctx)
    key = w.name("key")
    await mesh.save_if_absent(key, "tenant-1", "fp", ctx.clock.now())
    for label, payload in BAD_PAYLOADS:
        await _refused(
            f"a response with {label}",
            InvalidPayloadError,
            partial(mesh.complete, "tenant-1", key, payload()),
        )
    got = await mesh.get("tenant-1", key)
    expect(got is not None and not got.completed, RULE, f"refused responses completed {got}")


_CASES: dict[str, list[tuple[str, CaseRun]]] = {
    LEASE: [("bad input: lease durations past the limit", lease_durations_past_the_limit)],
    "child_queue": [
        ("bad input: depth and attempt past their columns", queue_numbers_past_their_columns),
        ("bad input: payloads no backend stores", queue_payloads_no_backend_stores),
    ],
    "cost_ledger": [("bad input: numbers past 64 bits", cost_numbers_past_64_bits)],
    FENCED_EFFECT: [("bad input: results no backend stores", effect_results_no_backend_stores)],
    "mesh_request": [("bad input: responses no backend stores", mesh_responses_no_backend_stores)],
}


def limit_cases(contract: str) -> list[Case]:
    """The bad-input cases of `contract` (none is a fencing case)."""
    return [Case(contract, name, run) for name, run in _CASES.get(contract, [])]


__all__ = ["BAD_PAYLOADS", "limit_cases"]
