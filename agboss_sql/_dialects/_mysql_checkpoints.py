"""MySQL and MariaDB's statements for the checkpoint saver (named from `mysql`, whose
`Dialect` they complete): folded writes' duplicate handling and metadata filters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.expression import ColumnElement


def skip_duplicates(statement: Any, keys: Sequence[str]) -> Any:
    """`statement` (this dialect's insert, any number of rows) skipping rows whose unique key
    `keys` is already taken (a no-op `ON DUPLICATE KEY UPDATE`; `INSERT IGNORE` would also
    turn other errors into warnings)."""
    # The key column set to its proposed value, which equals the stored one: a no-op that
    # names no table (an `INSERT … SELECT` from the same table would make it ambiguous).
    first = keys[0]
    return statement.on_duplicate_key_update([(first, statement.inserted[first])])


def replace_duplicates(statement: Any, keys: Sequence[str], columns: Sequence[str]) -> Any:
    """`statement` (this dialect's insert) setting `columns` to the proposed values on a row
    whose unique key `keys` is already taken (`keys` must be the table's only unique key)."""
    new = statement.inserted
    return statement.on_duplicate_key_update([(column, new[column]) for column in columns])


def json_key_equals(document: Any, index: int) -> ColumnElement[bool]:
    """The JSON object in the text column `document` has key `:meta_path<index>` holding the
    JSON value `:meta_value<index>` (`JSON_CONTAINS`: equality for scalars, containment for
    objects and arrays). Params: `json_key_params`."""
    return (
        sa.func.json_contains(
            document,
            sa.bindparam(f"meta_value{index}", type_=sa.Text),
            sa.bindparam(f"meta_path{index}", type_=sa.Text),
        )
        == 1
    )


def json_key_params(index: int, key: str, value: Any) -> dict[str, Any]:
    """The parameters of `json_key_equals(document, index)` for `key` and a JSON value."""
    quoted = key.replace("\\", "\\\\").replace('"', '\\"')
    # Raw UTF-8, as the documents are stored: MariaDB's JSON_CONTAINS compares string bytes
    # without decoding `\uXXXX` escapes, so an escaped "José" never matched a stored one.
    return {
        f"meta_path{index}": f'$."{quoted}"',
        f"meta_value{index}": json.dumps(value, ensure_ascii=False),
    }
