"""Revision 0011_wide_identities widens the identities of fenced effects and outbound calls
(`MEDIUMTEXT` on MySQL/MariaDB) so an idempotency key of `MAX_IDEMPOTENCY_KEY_LENGTH`
characters is kept on every database: effects and calls stored before it replay after it,
a key at the limit is stored after it, and a downgrade refuses, before any step, to narrow
a column holding an identity it would lose."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionContext,
    FencedEffectKey,
    StepRef,
    StoreClock,
    VirtualClock,
    fenced_effect_key_of,
)
from agboss_sql.contracts.limits import MAX_IDEMPOTENCY_KEY_LENGTH
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository

pytestmark = pytest.mark.database

BEFORE = "0010_child_parents"
AFTER = "0011_wide_identities"
LONG = "\x01" * MAX_IDEMPOTENCY_KEY_LENGTH
"""An idempotency key at its limit whose every character takes six in the JSON identity."""

T = TypeVar("T")
LEASE_MS = 60_000
_calls = itertools.count()


def _on(url: str, body: Callable[[SqlConnection, Any], Awaitable[T]]) -> T:
    """`body(connection, (leases, effects, outbound))` on a connection of its own, each
    one a lease later than the one before (its lease of `tree-1` taken over, not held)."""

    async def run() -> T:
        connection = SqlConnection(url)
        clock = StoreClock(VirtualClock(1_000 + 2 * LEASE_MS * next(_calls)))
        app = ApplicationContext("instance-1")
        stores = (
            SqlExecutionLeaseRepository(connection, clock, app),
            SqlFencedEffectRepository(connection, clock, app),
            SqlOutboundCallRepository(connection, clock, app),
        )
        try:
            return await body(connection, stores)
        finally:
            await connection.close()

    return asyncio.run(run())


async def _key(stores: Any, idempotency_key: str) -> FencedEffectKey:
    lease = await stores[0].acquire("tenant-1", "tree-1", LEASE_MS)
    assert lease is not None
    ctx = ExecutionContext(
        "tenant-1", "tree-1", "tree-1", lease, StepRef("tree-1", idempotency_key, "step")
    )
    return fenced_effect_key_of(ctx, "charge")


async def _store(stores: Any, idempotency_key: str) -> None:
    key = await _key(stores, idempotency_key)

    async def work(_tx: Any) -> str:
        return idempotency_key

    assert (await stores[1].save_result_if_absent(key, work)).value == idempotency_key
    assert (await stores[2].save_if_absent(key, {"intent": idempotency_key}, 1_000)).created


async def _stored(stores: Any, idempotency_key: str) -> tuple[Any, Any]:
    key = await _key(stores, idempotency_key)
    effect = await stores[1].get_result(key)
    call = await stores[2].get(key)
    return (
        None if effect is None else effect.value,
        None if call is None else call.intent,
    )


def test_effects_stored_before_replay_after_and_a_key_at_the_limit_is_kept(
    empty_url: str,
) -> None:
    migrate.upgrade(empty_url, BEFORE)
    _on(empty_url, lambda _c, stores: _store(stores, "short"))

    migrate.upgrade(empty_url, AFTER)
    assert migrate.current(empty_url) == AFTER

    assert _on(empty_url, lambda _c, s: _stored(s, "short")) == ("short", {"intent": "short"})
    _on(empty_url, lambda _c, stores: _store(stores, LONG))
    assert _on(empty_url, lambda _c, s: _stored(s, LONG)) == (LONG, {"intent": LONG})


def test_the_downgrade_refuses_to_narrow_a_column_holding_a_long_identity(
    empty_url: str,
) -> None:
    migrate.upgrade(empty_url, AFTER)
    _on(empty_url, lambda _c, stores: _store(stores, "short"))
    _on(empty_url, lambda _c, stores: _store(stores, LONG))
    try:
        migrate.downgrade(empty_url, BEFORE)
    except RuntimeError as refused:  # where the columns narrow (MySQL's TEXT)
        assert "over 65535 bytes" in str(refused)
        assert migrate.current(empty_url) == AFTER  # refused before any step
        assert _on(empty_url, lambda _c, s: _stored(s, LONG)) == (LONG, {"intent": LONG})
    else:  # where a text column has no such bound: nothing to lose
        assert migrate.current(empty_url) == BEFORE
        assert _on(empty_url, lambda _c, s: _stored(s, LONG)) == (LONG, {"intent": LONG})
        migrate.upgrade(empty_url, AFTER)

    async def forget_long(connection: SqlConnection, _stores: Any) -> None:
        for table in ("agboss_fenced_effect_results", "agboss_outbound_calls"):
            await connection.execute(f"DELETE FROM {table} WHERE step_idempotency_key <> 'short'")

    _on(empty_url, forget_long)
    migrate.downgrade(empty_url, BEFORE)
    assert migrate.current(empty_url) == BEFORE
    assert _on(empty_url, lambda _c, s: _stored(s, "short")) == ("short", {"intent": "short"})
