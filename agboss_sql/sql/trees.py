"""`SqlExecutionTreeRepository`: request-scoped keys of an execution tree.

A key is written once: `save_if_absent` is one insert-if-absent on the
`(tenant_id, root_execution_id, key)` primary key, so of concurrent writers of one
key exactly one inserts it. `list` selects a prefix as the range
`prefix <= key < upper bound` compared by exact characters (code point order, whatever
the database's collation, through the dialect's `exact_text`), so `%`, `_` and `\\` in
a prefix are plain characters, never patterns.

Statements per operation: one each, on every dialect.
"""

from __future__ import annotations

import builtins
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import checked_key_prefix
from agboss_sql.contracts.stores import ExecutionTreeRepository
from agboss_sql.contracts.types import JsonValue
from agboss_sql.sql._base import ApplicationClockStore, dumps, loads
from agboss_sql.sql.connection import SqlBuilder
from agboss_sql.sql.schema import execution_tree_keys

T = execution_tree_keys

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def prefix_upper_bound(prefix: str) -> str | None:
    """The least text greater than every text that starts with `prefix`, in code point
    order (`None` when there is none: every character of `prefix` is U+10FFFF). A text
    starts with a non-empty `prefix` exactly when `prefix <= text < prefix_upper_bound`."""
    chars = builtins.list(prefix)
    while chars:
        following = ord(chars[-1]) + 1
        if following <= _MAX_CODE_POINT:
            if following in _SURROGATES:
                following = _SURROGATES.stop  # no text holds a lone surrogate
            chars[-1] = chr(following)
            return "".join(chars)
        chars.pop()
    return None


class TreeStatements:
    """The tree key statements for one dialect."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        the_tree = sa.and_(
            T.c.tenant_id == sa.bindparam("tenant_id"),
            T.c.root_execution_id == sa.bindparam("root_execution_id"),
        )
        self.save_if_absent = ops.insert_if_absent(
            T, ["tenant_id", "root_execution_id", "key"]
        ).values(
            tenant_id=sa.bindparam("tenant_id"),
            root_execution_id=sa.bindparam("root_execution_id"),
            key=sa.bindparam("key"),
            value=sa.bindparam("value"),
        )
        self.get = sa.select(T.c.value).where(the_tree, T.c.key == sa.bindparam("key"))
        exact_key = ops.exact_text(T.c.key)
        listed = sa.select(T.c.key, T.c.value).order_by(exact_key)
        self.list_all = listed.where(the_tree)
        at_or_after = exact_key >= ops.exact_text(sa.bindparam("prefix"))
        self.list_from = listed.where(the_tree, at_or_after)
        self.list_range = listed.where(
            the_tree, at_or_after, exact_key < ops.exact_text(sa.bindparam("upper"))
        )
        self.delete_tree = sa.delete(T).where(the_tree)


class SqlExecutionTreeRepository(ApplicationClockStore[TreeStatements], ExecutionTreeRepository):
    """Tree keys on SQL: the first write of a key wins; values are JSON."""

    statements = TreeStatements

    @staticmethod
    def _tree(tenant_id: str, root_execution_id: str) -> dict[str, Any]:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("root_execution_id", root_execution_id)
        return {"tenant_id": tenant_id, "root_execution_id": root_execution_id}

    async def save_if_absent(
        self, tenant_id: str, root_execution_id: str, key: str, value: JsonValue
    ) -> bool:
        """Insert `key` with its JSON value in one statement if the tree has no such key.
        True when this call inserted it (of concurrent writers, exactly one)."""
        params = self._tree(tenant_id, root_execution_id)
        params["key"] = checked_identifier("key", key)
        params["value"] = dumps(value)
        return await self.connection.insert_if_absent(self._sql.save_if_absent, params)

    async def get(self, tenant_id: str, root_execution_id: str, key: str) -> JsonValue | None:
        """The key's value, or `None`."""
        params = self._tree(tenant_id, root_execution_id)
        params["key"] = checked_identifier("key", key)
        return loads((await self.connection.execute(self._sql.get, params)).scalar())

    async def list(
        self, tenant_id: str, root_execution_id: str, prefix: str = ""
    ) -> dict[str, JsonValue]:
        """The tree's keys that start with `prefix` (a plain text, no pattern), in code
        point order, with their values."""
        params = self._tree(tenant_id, root_execution_id)
        checked_key_prefix(prefix)
        if not prefix:
            statement = self._sql.list_all
        else:
            params["prefix"] = prefix
            upper = prefix_upper_bound(prefix)
            if upper is None:
                statement = self._sql.list_from
            else:
                params["upper"] = upper
                statement = self._sql.list_range
        result = await self.connection.execute(statement, params)
        return {key: loads(value) for key, value in result.rows}

    async def delete_tree(self, tenant_id: str, root_execution_id: str) -> int:
        """Delete every key of the tree in one statement. The number deleted."""
        params = self._tree(tenant_id, root_execution_id)
        return (await self.connection.execute(self._sql.delete_tree, params)).rowcount


__all__ = ["SqlExecutionTreeRepository", "TreeStatements", "prefix_upper_bound"]
