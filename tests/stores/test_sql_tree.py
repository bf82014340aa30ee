"""`SqlExecutionTreeRepository` on the database under test (docs/contracts.md).

Keys are compared by their exact characters on every database: a prefix with `%`,
`_` or `\\` is plain text, and keys list in code point order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from support.sql import statements

from agboss_sql.contracts import (
    CANCEL_REQUEST_KEY,
    COMPENSATED_PREFIX,
    UNWINDING_KEY,
    ApplicationContext,
    InvalidIdentifierError,
    VirtualClock,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.trees import SqlExecutionTreeRepository, prefix_upper_bound

TENANT = "tenant-1"
NewConnection = Callable[[], SqlConnection]


def store(connection: SqlConnection, instance: str = "instance-1") -> SqlExecutionTreeRepository:
    return SqlExecutionTreeRepository(connection, VirtualClock(0), ApplicationContext(instance))


async def test_the_first_write_of_a_tree_key_wins(
    sql: SqlConnection, new_connection: NewConnection
) -> None:
    trees, other = store(sql), store(new_connection(), "instance-2")
    assert await trees.save_if_absent(TENANT, "root-1", CANCEL_REQUEST_KEY, {"by": "a"})
    assert await other.save_if_absent(TENANT, "root-1", CANCEL_REQUEST_KEY, {"by": "b"}) is False
    assert await other.get(TENANT, "root-1", CANCEL_REQUEST_KEY) == {"by": "a"}
    assert await trees.get(TENANT, "root-1", UNWINDING_KEY) is None
    assert await trees.get("tenant-2", "root-1", CANCEL_REQUEST_KEY) is None
    assert await trees.get(TENANT, "root-2", CANCEL_REQUEST_KEY) is None
    assert await trees.save_if_absent("tenant-2", "root-1", CANCEL_REQUEST_KEY, "theirs")
    assert await trees.get("tenant-2", "root-1", CANCEL_REQUEST_KEY) == "theirs"


async def test_concurrent_writes_of_one_tree_key_insert_it_once(
    sql: SqlConnection, new_connection: NewConnection
) -> None:
    trees = [store(sql)] + [store(new_connection(), f"instance-{i}") for i in range(2, 5)]
    for round_ in range(5):
        saved = await asyncio.gather(
            *(
                trees[i % 4].save_if_absent(TENANT, f"root-{round_}", UNWINDING_KEY, i)
                for i in range(12)
            )
        )
        assert saved.count(True) == 1
        winner = saved.index(True)
        assert await trees[0].get(TENANT, f"root-{round_}", UNWINDING_KEY) == winner


async def test_list_gives_the_keys_with_a_prefix_in_key_order(sql: SqlConnection) -> None:
    trees = store(sql)
    await trees.save_if_absent(TENANT, "root-1", UNWINDING_KEY, True)
    await trees.save_if_absent(TENANT, "root-1", COMPENSATED_PREFIX + "step-b", 2)
    await trees.save_if_absent(TENANT, "root-1", COMPENSATED_PREFIX + "step-a", 1)
    await trees.save_if_absent(TENANT, "root-2", COMPENSATED_PREFIX + "step-c", 3)
    await trees.save_if_absent("tenant-2", "root-1", COMPENSATED_PREFIX + "step-d", 4)
    assert await trees.list(TENANT, "root-1", COMPENSATED_PREFIX) == {
        COMPENSATED_PREFIX + "step-a": 1,
        COMPENSATED_PREFIX + "step-b": 2,
    }
    everything = await trees.list(TENANT, "root-1")
    assert list(everything) == [
        COMPENSATED_PREFIX + "step-a",
        COMPENSATED_PREFIX + "step-b",
        UNWINDING_KEY,
    ]
    assert await trees.list(TENANT, "nothing") == {}
    assert await trees.list(TENANT, "root-1", "@agboss/z") == {}


async def test_a_prefix_is_plain_text_never_a_pattern(sql: SqlConnection) -> None:
    trees = store(sql)
    keys = [
        "a%b",
        "a%b/x",
        "aXb",
        "a_c",
        "abc",
        "a\\d",
        "a\\\\d",
        "ad",
        "a",
        "b",
        "%",
        "_",
    ]
    for i, key in enumerate(keys):
        assert await trees.save_if_absent(TENANT, "root-1", key, i)

    async def listed(prefix: str) -> list[str]:
        return list(await trees.list(TENANT, "root-1", prefix))

    assert await listed("a%") == ["a%b", "a%b/x"]
    assert await listed("a_") == ["a_c"]
    assert await listed("a\\") == ["a\\\\d", "a\\d"]
    assert await listed("a\\d") == ["a\\d"]
    assert await listed("%") == ["%"]
    assert await listed("_") == ["_"]
    assert await listed("a") == sorted(k for k in keys if k.startswith("a"))


async def test_keys_compare_by_their_exact_characters(sql: SqlConnection) -> None:
    """Code point order, whatever the collation: upper case before lower case, accents
    and other scripts after ASCII, astral characters last; no two keys fold together."""
    trees = store(sql)
    keys = [
        "a",
        "B",
        "b",
        "é",
        "e",
        "E",
        "中",
        "😀",
        "a-b",
        "a.b",
        "A",
        "\U0010ffff",
        "ab\U0010ffff",
        "a\t",
    ]
    for i, key in enumerate(keys):
        assert await trees.save_if_absent(TENANT, "root-1", key, i)
    everything = await trees.list(TENANT, "root-1")
    assert list(everything) == sorted(keys)
    assert {k: everything[k] for k in keys} == {k: i for i, k in enumerate(keys)}
    assert list(await trees.list(TENANT, "root-1", "a")) == [
        "a",
        "a\t",
        "a-b",
        "a.b",
        "ab\U0010ffff",
    ]
    assert list(await trees.list(TENANT, "root-1", "ab\U0010ffff")) == ["ab\U0010ffff"]
    assert list(await trees.list(TENANT, "root-1", "\U0010ffff")) == ["\U0010ffff"]
    assert list(await trees.list(TENANT, "root-1", "e")) == ["e"]


async def test_a_key_ending_with_a_space_is_refused_on_every_database(
    sql: SqlConnection,
) -> None:
    """MySQL/MariaDB compare `'k'` and `'k '` as equal (PAD SPACE): such a key is refused
    everywhere, so a key never means one row on one database and two on another."""
    trees = store(sql)
    assert await trees.save_if_absent(TENANT, "root-1", "k", 1)
    with statements(sql, transaction_control=False) as sent:
        with pytest.raises(InvalidIdentifierError):
            await trees.save_if_absent(TENANT, "root-1", "k ", 2)
        with pytest.raises(InvalidIdentifierError):
            await trees.get(TENANT, "root-1", "k ")
    assert sent == []
    assert await trees.list(TENANT, "root-1") == {"k": 1}


def test_a_prefix_upper_bound_is_the_least_text_past_the_prefix() -> None:
    assert prefix_upper_bound("abc") == "abd"
    assert prefix_upper_bound("a%") == "a&"
    assert prefix_upper_bound("a\U0010ffff") == "b"
    assert prefix_upper_bound("\U0010ffff\U0010ffff") is None
    assert prefix_upper_bound("a\ud7ff") == "a\ue000"  # past the surrogates
    assert prefix_upper_bound("") is None


async def test_delete_tree_deletes_every_key_of_the_tree_only(sql: SqlConnection) -> None:
    trees = store(sql)
    await trees.save_if_absent(TENANT, "root-1", "a", 1)
    await trees.save_if_absent(TENANT, "root-1", "b", 2)
    await trees.save_if_absent(TENANT, "root-2", "a", 1)
    await trees.save_if_absent("tenant-2", "root-1", "a", 1)
    assert await trees.delete_tree(TENANT, "root-1") == 2
    assert await trees.delete_tree(TENANT, "root-1") == 0
    assert await trees.list(TENANT, "root-1") == {}
    assert await trees.get(TENANT, "root-2", "a") == 1
    assert await trees.get("tenant-2", "root-1", "a") == 1
    assert await trees.save_if_absent(TENANT, "root-1", "a", "again")


async def test_values_are_json_read_back_as_saved(sql: SqlConnection) -> None:
    trees = store(sql)
    value = {"text": "grüße ✓ 😀", "items": [1, 2.5, None, True], "empty": {}}
    await trees.save_if_absent(TENANT, "root-1", "k", value)
    assert await trees.get(TENANT, "root-1", "k") == value
    assert await trees.list(TENANT, "root-1") == {"k": value}
    with pytest.raises(TypeError):
        await trees.save_if_absent(TENANT, "root-1", "bad", {1, 2})


async def test_each_operation_sends_one_statement(sql: SqlConnection) -> None:
    trees = store(sql)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: trees.save_if_absent(TENANT, "root-1", "k", 1),
        lambda: trees.save_if_absent(TENANT, "root-1", "k", 2),
        lambda: trees.get(TENANT, "root-1", "k"),
        lambda: trees.list(TENANT, "root-1"),
        lambda: trees.list(TENANT, "root-1", "k"),
        lambda: trees.delete_tree(TENANT, "root-1"),
    ]
    for call in calls:
        with statements(sql, transaction_control=False) as sent:
            await call()
        assert len(sent) == 1


async def test_arguments_are_checked_before_any_statement(sql: SqlConnection) -> None:
    trees = store(sql)
    with statements(sql, transaction_control=False) as sent:
        with pytest.raises(InvalidIdentifierError):
            await trees.save_if_absent(TENANT, "root-1", "", 1)
        with pytest.raises(InvalidIdentifierError):
            await trees.save_if_absent(TENANT, "root-1", "k" * 256, 1)
        with pytest.raises(InvalidIdentifierError):
            await trees.save_if_absent("", "root-1", "k", 1)
        with pytest.raises(InvalidIdentifierError):
            await trees.get(TENANT, "", "k")
        with pytest.raises(ValueError):
            await trees.list(TENANT, "root-1", None)  # type: ignore[arg-type]
        with pytest.raises(InvalidIdentifierError):
            await trees.delete_tree(TENANT, "")
    assert sent == []
