"""More cases of the mesh requests' suite: a completion completes its own request only.

Added where mutation testing of the stores (docs/mutation.md) found a change no case saw: a
completion that dropped the key's term (completing every pending request of the tenant)
passed every case, because no case completed one of two pending requests of one tenant.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agboss_sql.contracts.stores import MeshRequestRepository
from agboss_sql.testing._case import Case, CaseContext

CONTRACT = "mesh_request"
TENANT = "tenant-1"


def _mesh(ctx: CaseContext, instance: int = 0) -> MeshRequestRepository:
    store: MeshRequestRepository = ctx.store(CONTRACT, instance)
    return store


async def completes_its_own_request_only(ctx: CaseContext) -> None:
    """Of two pending requests of one tenant, completing one leaves the other pending (no
    response), and the other's own completion then stores its own response."""
    now = ctx.clock.now()
    for i, key in enumerate(["key-1", "key-2"]):
        await _mesh(ctx, i % 2).save_if_absent(key, TENANT, f"fp-{i}", now)
    first = await _mesh(ctx, 0).complete(TENANT, "key-1", {"answer": 1})
    if not first:
        raise AssertionError("[complete-once] the first completion of key-1 answered False")
    other = await _mesh(ctx, 1).get(TENANT, "key-2")
    if other is None or other.completed or other.response is not None:
        raise AssertionError(f"[complete-once] completing key-1 changed key-2: {other}")
    second = await _mesh(ctx, 1).complete(TENANT, "key-2", {"answer": 2})
    got = [await _mesh(ctx, 0).get(TENANT, key) for key in ("key-1", "key-2")]
    answers = [(r.completed, r.response) if r else None for r in got]
    if not second or answers != [(True, {"answer": 1}), (True, {"answer": 2})]:
        raise AssertionError(
            f"[complete-once] key-2's completion answered {second}; the requests read {answers}"
        )


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("completes its own request only", completes_its_own_request_only),
]


def more_cases() -> list[Case]:
    """The cases of this module, in the suite's order."""
    return [Case(CONTRACT, name, run) for name, run in CASES]


__all__ = ["more_cases"]
