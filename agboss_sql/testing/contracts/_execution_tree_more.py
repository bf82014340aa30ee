"""More cases of the tree keys' suite: a prefix lists its own tree's keys, at every edge.

Added where mutation testing of the stores (docs/mutation.md) found changes no case saw: a
prefix list that dropped the tree's terms (another tree's keys listed) or its lower bound,
and an upper bound that skipped a prefix ending in U+10FFFE (listing a key beyond it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agboss_sql.contracts.stores import ExecutionTreeRepository
from agboss_sql.testing._case import Case, CaseContext

CONTRACT = "execution_tree"
TENANT = "tenant-1"
LAST = "\U0010ffff"
"""The last code point: a prefix of it alone has no upper bound."""


def _tree(ctx: CaseContext, instance: int = 0) -> ExecutionTreeRepository:
    store: ExecutionTreeRepository = ctx.store(CONTRACT, instance)
    return store


async def lists_a_prefix_of_its_own_tree_at_every_edge(ctx: CaseContext) -> None:
    """With another tree of the tenant holding keys of the same prefixes: `list(prefix)`
    answers this tree's keys that start with the prefix only, for a plain prefix, one of
    the last code point alone (no upper bound) and one ending in U+10FFFE (whose bound
    carries over to U+10FFFF), on either instance."""
    mine = {
        "k/1": 1,
        "k/2": 2,
        "a\U0010fffe-x": 3,
        "a" + LAST: 4,
        "b": 5,
        LAST + "-top": 6,
        LAST + LAST: 7,
    }
    theirs = {"k/9": 9, LAST + "-theirs": 10, "a\U0010fffe-theirs": 11}
    for i, (key, value) in enumerate(mine.items()):
        await _tree(ctx, i % 2).save_if_absent(TENANT, "root-1", key, value)
    for key, value in theirs.items():
        await _tree(ctx, 1).save_if_absent(TENANT, "root-2", key, value)
    expected = {
        "k/": {"k/1": 1, "k/2": 2},
        LAST: {LAST + "-top": 6, LAST + LAST: 7},
        "a\U0010fffe": {"a\U0010fffe-x": 3},
    }
    for prefix, want in expected.items():
        for instance in (0, 1):
            got = await _tree(ctx, instance).list(TENANT, "root-1", prefix)
            if got != want:
                raise AssertionError(
                    f"[tree-list-prefix] list(root-1, {prefix!r}) on instance {instance + 1} "
                    f"= {got}, expected {want}"
                )


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    (
        "lists a prefix of its own tree at every edge",
        lists_a_prefix_of_its_own_tree_at_every_edge,
    ),
]


def more_cases() -> list[Case]:
    """The cases of this module, in the suite's order."""
    return [Case(CONTRACT, name, run) for name, run in CASES]


__all__ = ["more_cases"]
