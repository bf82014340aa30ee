"""What the read-only views (`agboss_sql.sql.inspect`) share: the runtime's names they
know, a lease row's state, JSON text read back, the database's clock."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from agboss_sql.sql.connection import SqlConnection

EFFECT_KINDS = {"wf.step": "step", "wf.effect": "effect", "wf.undo": "undo", "wf.call": "call"}
"""The fenced effect names the workflow runtime stores its calls under, and what a view
calls each; an effect of another name (a store used directly) is shown by its name."""

UNFINISHED = ("queued", "running", "waiting")
"""The child queue's states a child is in until it finishes."""

COMPENSATED_PREFIX = "@agboss/compensated/"
"""The tree keys marking each undo of a cancelled tree as done."""

MAX_DEPTH = 64
"""How many levels of children `tree_view` follows (a deeper tree is cut there, and says so)."""


def lease_state(
    *, expires_at: int, released: bool, yielded: bool, finished: bool, closed: str | None, now: int
) -> str:
    """What a lease row says of its holder at the database time `now`: `finished`,
    `closed`, `released`, `yielded`, `live` or `expired`."""
    if finished:
        return "finished"
    if closed:
        return "closed"
    if released:
        return "released"
    if yielded:
        return "yielded"
    return "live" if expires_at > now else "expired"


def from_json(text: Any) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def in_values(column: Any, values: Any) -> Any:
    """`column IN (...)` with one bind parameter per value (the raw drivers take no expanding
    parameter)."""
    return column.in_([sa.literal(value, column.type) for value in values])


async def database_now(connection: SqlConnection) -> int:
    """The database's clock, in epoch ms."""
    found = (await connection.execute(sa.select(connection.ops.now_ms()))).scalar()
    return int(found or 0)


__all__ = [
    "COMPENSATED_PREFIX",
    "EFFECT_KINDS",
    "MAX_DEPTH",
    "UNFINISHED",
    "database_now",
    "from_json",
    "in_values",
    "lease_state",
]
