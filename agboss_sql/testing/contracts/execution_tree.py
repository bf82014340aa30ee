"""Contract suite of `ExecutionTreeRepository` (docs/contracts.md): request-scoped keys of a tree.

A key is written once (the first write wins, whichever instance), listed by a literal
prefix (`%`, `_` and `\\` are characters, not patterns) in key order, and deleted with
its tree. The reserved keys (cancel request, unwinding, compensated steps) are keys like
any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.stores import (
    CANCEL_REQUEST_KEY,
    COMPENSATED_PREFIX,
    UNWINDING_KEY,
    ExecutionTreeRepository,
)
from agboss_sql.contracts.types import JsonValue
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._execution_tree_more import more_cases

CONTRACT = "execution_tree"
TENANT = "tenant-1"
ROOT = "root-1"

TRICKY_KEYS = [
    "%",
    "%%",
    "_",
    "\\",
    "a",
    "a%",
    "a%b",
    "a%bc",
    "a_b",
    "a_bc",
    "aXb",
    "axb",
    "a\\",
    "a\\b",
    "a\\\\b",
    "a\\%b",
    "a\\_b",
    "ab",
    "abc",
    "A_b",
    "b",
    "[a]",
    "a*b",
    "a?b",
    "a'b",
    'a"b',
    "a.b",
    "ä_b",
]
"""Keys that a `LIKE` without an escape, a case-insensitive collation or a glob confuses."""


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _tree(ctx: CaseContext, instance: int = 0) -> ExecutionTreeRepository:
    store: ExecutionTreeRepository = ctx.store(CONTRACT, instance)
    return store


async def writes_a_key_once(ctx: CaseContext) -> None:
    """The first `save_if_absent` of a key wins; a later one, from either instance, returns
    False and leaves the value."""
    a, b = _tree(ctx, 0), _tree(ctx, 1)
    first = await a.save_if_absent(TENANT, ROOT, "request-scoped", {"user": "ü", "n": [1, 2]})
    _expect(first, "save-once", "the first write of a key returned False")
    second = await b.save_if_absent(TENANT, ROOT, "request-scoped", {"user": "other"})
    _expect(not second, "save-once", "a second write of one key returned True")
    for store in (a, b):
        got = await store.get(TENANT, ROOT, "request-scoped")
        _expect(
            got == {"user": "ü", "n": [1, 2]},
            "save-once",
            f"the key reads {got!r} after a refused second write",
        )
    unknown = await b.get(TENANT, ROOT, "never-written")
    _expect(unknown is None, "save-once", f"a key never written reads {unknown!r}")


async def writes_a_key_once_under_concurrent_writers(ctx: CaseContext) -> None:
    """Ten writers of one key at once through both instances, round after round: exactly
    one returns True, and its value is the one stored."""
    for round_ in range(5):
        key = f"key-{round_}"
        results = await asyncio.gather(
            *(_tree(ctx, i % 2).save_if_absent(TENANT, ROOT, key, {"writer": i}) for i in range(10))
        )
        winners = [i for i, won in enumerate(results) if won]
        _expect(
            len(winners) == 1,
            "save-once",
            f"round {round_ + 1}: {len(winners)} of 10 concurrent writes of {key} returned True",
        )
        got = await _tree(ctx, 1).get(TENANT, ROOT, key)
        _expect(
            got == {"writer": winners[0]},
            "save-once",
            f"round {round_ + 1}: writer {winners[0]} won but the key reads {got!r}",
        )


async def keeps_values_as_json(ctx: CaseContext) -> None:
    """Values of every JSON kind come back as written."""
    values: dict[str, JsonValue] = {
        "text": 'grüße ✓ "quoted" \\ back',
        "int": 2**53,
        "float": 2.5,
        "true": True,
        "false": False,
        "list": [1, "two", None, {"three": 3}],
        "dict": {"nested": {"deep": [[], {}]}},
        "empty-text": "",
        "zero": 0,
    }
    for i, (key, value) in enumerate(values.items()):
        saved = await _tree(ctx, i % 2).save_if_absent(TENANT, ROOT, key, value)
        _expect(saved, "save-once", f"writing {key} returned False")
    for key, value in values.items():
        got = await _tree(ctx, 1).get(TENANT, ROOT, key)
        _expect(got == value and type(got) is type(value), "json-value", f"{key}: {got!r}")
    listed = await _tree(ctx, 0).list(TENANT, ROOT)
    _expect(listed == values, "json-value", f"list() gave {listed!r}")


async def lists_by_a_literal_prefix(ctx: CaseContext) -> None:
    """`list(prefix)` returns exactly the keys that start with the prefix's characters:
    `%`, `_` and `\\` match only themselves, case and accents count."""
    for i, key in enumerate(TRICKY_KEYS):
        await _tree(ctx, i % 2).save_if_absent(TENANT, ROOT, key, i)
    prefixes = sorted({key[:n] for key in TRICKY_KEYS for n in range(1, len(key) + 1)})
    prefixes += ["a%b%", "a_b_", "zzz", "%a", "_b", "\\\\", "A", "Ä"]
    for prefix in prefixes:
        want = {
            key: TRICKY_KEYS.index(key) for key in sorted(TRICKY_KEYS) if key.startswith(prefix)
        }
        got = await _tree(ctx, len(prefix) % 2).list(TENANT, ROOT, prefix)
        _expect(
            got == want,
            "prefix-literal",
            f"list(prefix={prefix!r}) gave keys {sorted(got)}, expected {sorted(want)}",
        )
    everything = await _tree(ctx, 0).list(TENANT, ROOT)
    _expect(len(everything) == len(TRICKY_KEYS), "prefix-literal", f"list() gave {len(everything)}")


async def lists_keys_in_key_order(ctx: CaseContext) -> None:
    """The listing is in key order: by the keys' characters, whatever order they were
    written in."""
    written = list(reversed(TRICKY_KEYS))
    written = written[1::2] + written[::2]
    for i, key in enumerate(written):
        await _tree(ctx, i % 2).save_if_absent(TENANT, ROOT, key, None if i % 5 == 0 else i)
    got = list(await _tree(ctx, 1).list(TENANT, ROOT))
    _expect(
        got == sorted(TRICKY_KEYS),
        "key-order",
        f"list() ordered the keys {got}, expected {sorted(TRICKY_KEYS)}",
    )
    prefixed = list(await _tree(ctx, 0).list(TENANT, ROOT, "a"))
    _expect(
        prefixed == sorted(k for k in TRICKY_KEYS if k.startswith("a")),
        "key-order",
        f"list('a') ordered the keys {prefixed}",
    )


async def keeps_the_reserved_keys(ctx: CaseContext) -> None:
    """The cancel request is written once across instances; unwinding and the compensated
    steps list by `COMPENSATED_PREFIX` without catching look-alike keys."""
    a, b = _tree(ctx, 0), _tree(ctx, 1)
    cancels = await asyncio.gather(
        a.save_if_absent(TENANT, ROOT, CANCEL_REQUEST_KEY, {"by": ctx.instance_id(0)}),
        b.save_if_absent(TENANT, ROOT, CANCEL_REQUEST_KEY, {"by": ctx.instance_id(1)}),
    )
    _expect(sorted(cancels) == [False, True], "save-once", f"two cancel requests: {cancels}")
    winner = ctx.instance_id(0) if cancels[0] else ctx.instance_id(1)
    got = await b.get(TENANT, ROOT, CANCEL_REQUEST_KEY)
    _expect(got == {"by": winner}, "reserved-keys", f"the cancel request reads {got!r}")
    _expect(
        await a.save_if_absent(TENANT, ROOT, UNWINDING_KEY, {"from": 3}),
        "reserved-keys",
        "writing the unwinding key returned False",
    )
    compensated = {
        f"{COMPENSATED_PREFIX}step-1": {"undone": True},
        f"{COMPENSATED_PREFIX}step-2": {"undone": True},
        f"{COMPENSATED_PREFIX}tool/call_%1": {"undone": True},
    }
    for i, (key, value) in enumerate(compensated.items()):
        _expect(
            await _tree(ctx, i % 2).save_if_absent(TENANT, ROOT, key, value),
            "reserved-keys",
            f"writing {key} returned False",
        )
    repeat = await b.save_if_absent(TENANT, ROOT, f"{COMPENSATED_PREFIX}step-1", {"undone": 2})
    _expect(not repeat, "save-once", "a compensated step was marked twice")
    lookalikes = ["@agboss/compensated", "@agboss/compensatedX/step-1", "@agboss_compensated/x"]
    for key in lookalikes:
        await a.save_if_absent(TENANT, ROOT, key, "not compensated")
    listed = await b.list(TENANT, ROOT, COMPENSATED_PREFIX)
    _expect(
        listed == compensated,
        "reserved-keys",
        f"list(COMPENSATED_PREFIX) gave {sorted(listed)}, expected {sorted(compensated)}",
    )
    unwinding = await a.get(TENANT, ROOT, UNWINDING_KEY)
    _expect(unwinding == {"from": 3}, "reserved-keys", f"unwinding reads {unwinding!r}")
    reserved = await a.list(TENANT, ROOT, "@agboss/")
    want = {CANCEL_REQUEST_KEY, UNWINDING_KEY, *compensated, "@agboss/compensated"}
    want.add("@agboss/compensatedX/step-1")
    _expect(set(reserved) == want, "reserved-keys", f"list('@agboss/') gave {sorted(reserved)}")


async def keeps_trees_and_tenants_apart(ctx: CaseContext) -> None:
    """One key in two trees, and in one tree id under two tenants, is three keys."""
    a, b = _tree(ctx, 0), _tree(ctx, 1)
    spots = [(TENANT, ROOT), (TENANT, "root-2"), ("tenant-2", ROOT)]
    for i, (tenant, root) in enumerate(spots):
        saved = await _tree(ctx, i % 2).save_if_absent(tenant, root, CANCEL_REQUEST_KEY, i)
        _expect(saved, "tree-isolation", f"{tenant}/{root}: the write saw another tree's key")
    for i, (tenant, root) in enumerate(spots):
        got = await b.get(tenant, root, CANCEL_REQUEST_KEY)
        _expect(got == i, "tree-isolation", f"{tenant}/{root} reads {got!r}, expected {i}")
        listed = await a.list(tenant, root)
        _expect(listed == {CANCEL_REQUEST_KEY: i}, "tree-isolation", f"{tenant}/{root}: {listed}")


async def deletes_a_tree_and_counts_its_keys(ctx: CaseContext) -> None:
    """`delete_tree` removes every key of the tree and answers how many; other trees keep
    theirs, and a deleted tree's keys can be written again."""
    a, b = _tree(ctx, 0), _tree(ctx, 1)
    for i, key in enumerate(["k-1", "k-2", CANCEL_REQUEST_KEY, f"{COMPENSATED_PREFIX}s"]):
        await _tree(ctx, i % 2).save_if_absent(TENANT, ROOT, key, i)
    await a.save_if_absent(TENANT, "root-2", "k-1", "keep")
    await b.save_if_absent("tenant-2", ROOT, "k-1", "keep")
    deleted = await b.delete_tree(TENANT, ROOT)
    _expect(deleted == 4, "delete-tree", f"delete_tree answered {deleted}, expected 4")
    left = await a.list(TENANT, ROOT)
    _expect(left == {}, "delete-tree", f"the deleted tree still lists {left}")
    gone = await a.get(TENANT, ROOT, "k-1")
    _expect(gone is None, "delete-tree", f"a deleted key reads {gone!r}")
    for tenant, root in [(TENANT, "root-2"), ("tenant-2", ROOT)]:
        kept = await a.get(tenant, root, "k-1")
        _expect(kept == "keep", "delete-tree", f"{tenant}/{root} lost its key: {kept!r}")
    again = await a.delete_tree(TENANT, ROOT)
    _expect(again == 0, "delete-tree", f"deleting an empty tree answered {again}")
    rewritten = await b.save_if_absent(TENANT, ROOT, "k-1", "new")
    _expect(rewritten, "delete-tree", "a deleted tree's key could not be written again")
    got = await a.get(TENANT, ROOT, "k-1")
    _expect(got == "new", "delete-tree", f"the rewritten key reads {got!r}")


async def keeps_long_and_unicode_keys(ctx: CaseContext) -> None:
    """A 255-character key and non-ASCII keys are stored and found exactly."""
    long_key = "k" * 254 + "é"
    keys = [long_key, "ключ/1", "键_%", "emoji-🙂"]
    for i, key in enumerate(keys):
        _expect(
            await _tree(ctx, i % 2).save_if_absent(TENANT, ROOT, key, i),
            "save-once",
            f"writing {key[:20]!r} returned False",
        )
    for i, key in enumerate(keys):
        got = await _tree(ctx, 1).get(TENANT, ROOT, key)
        _expect(got == i, "save-once", f"{key[:20]!r} reads {got!r}")
    near = await _tree(ctx, 0).get(TENANT, ROOT, "k" * 254)
    _expect(near is None, "save-once", f"a 254-character prefix of a key reads {near!r}")
    listed = await _tree(ctx, 0).list(TENANT, ROOT, "k" * 200)
    _expect(list(listed) == [long_key], "prefix-literal", f"long prefix: {list(listed)}")


async def refuses_a_key_that_ends_with_a_space(ctx: CaseContext) -> None:
    """A key ending with a space is `InvalidIdentifierError` on every backend (MySQL and
    MariaDB compare `"k"` and `"k "` as equal); spaces elsewhere in a key are characters."""
    _expect(await _tree(ctx, 0).save_if_absent(TENANT, ROOT, "k", 0), "save-once", "k refused")
    for instance, key in [(0, "k "), (1, "k  "), (1, "@agboss/compensated/ ")]:
        try:
            await _tree(ctx, instance).save_if_absent(TENANT, ROOT, key, 1)
        except InvalidIdentifierError:
            pass
        else:
            raise AssertionError(f"[trailing-space] the key {key!r} was accepted")
    keys = [" k", "a b", "a  b", "ab"]
    for i, key in enumerate(keys):
        saved = await _tree(ctx, i % 2).save_if_absent(TENANT, ROOT, key, key)
        _expect(saved, "save-once", f"writing {key!r} returned False: it found another key")
    listed = await _tree(ctx, 1).list(TENANT, ROOT)
    want = {"k": 0, **{key: key for key in keys}}
    _expect(listed == want, "trailing-space", f"the tree lists {listed}, expected {want}")


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("writes a key once", writes_a_key_once),
    (
        "writes a key once under concurrent writers",
        writes_a_key_once_under_concurrent_writers,
    ),
    ("keeps values as JSON", keeps_values_as_json),
    (
        "lists by a literal prefix: %, _ and backslash match only themselves",
        lists_by_a_literal_prefix,
    ),
    ("lists keys in key order", lists_keys_in_key_order),
    ("keeps the reserved keys", keeps_the_reserved_keys),
    ("keeps trees and tenants apart", keeps_trees_and_tenants_apart),
    ("deletes a tree and counts its keys", deletes_a_tree_and_counts_its_keys),
    ("keeps long and unicode keys", keeps_long_and_unicode_keys),
    ("refuses a key that ends with a space", refuses_a_key_that_ends_with_a_space),
]


def cases() -> list[Case]:
    """The tree keys' cases (none is a fencing case: tree keys are not fenced)."""
    return [Case(CONTRACT, name, run) for name, run in CASES] + more_cases()


__all__ = ["CONTRACT", "cases"]
