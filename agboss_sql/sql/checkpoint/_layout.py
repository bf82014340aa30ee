"""The saver's rows as its statements bind them: the key and value columns of each table,
the kinds of row a combined read answers, how many rows one statement takes, and the
helpers that bind and chunk keyed parameters (`_statements`, `_write_statements`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

T = TypeVar("T")

MAX_ROWS = 32
"""Rows per multi-row statement (inserts and keyed look-ups); more take several."""

LIST_PAGE = 100
"""Checkpoints read by the first statement of a listing of one namespace of a thread."""

LIST_PAGE_MORE = 400
"""Checkpoints read by each later statement of that listing: a listing read past its first
page is most often read whole (`get_state_history`), and each page costs two round trips.
A new saver's `get_state_history` of the small graph's 210 checkpoints took 5 to 10% less
time than with later pages of 100 on each database (docs/checkpoint.md)."""

MAX_CHECKPOINT_ID = 64
"""Characters of a checkpoint id (the width of its columns)."""
MAX_VERSION = 128
"""Characters of a channel version (the width of its column)."""
MAX_BODY_TYPE = 64
"""Characters of a checkpoint body's serde type (the width of its column)."""

BODY_HOLDS_LISTS = "agboss-lists:"
"""Prefix of the serde type of a checkpoint body that keeps lists inline (`_writes._inlined`),
whose versions have no value row. A reader strips it (`_core.SaverCore._loads`); a saver of
a release before lists were kept inline does not know the type and refuses the body with its
serde's error, rather than resuming the thread without those lists or writing a later
checkpoint that names a value row nobody wrote."""

CHECKPOINT_KEY = ("thread_hash", "ns_hash", "checkpoint_id")
BLOB_KEY = ("thread_hash", "ns_hash", "channel_hash", "version")
WRITE_KEY = ("thread_hash", "ns_hash", "checkpoint_id", "task_hash", "idx")
BLOB_VALUES = ("channel_hash", "version", "value_type", "value", "base_version")
CHECKPOINT_VALUES = (
    "thread_id",
    "checkpoint_ns",
    "parent_checkpoint_id",
    "run_hash",
    "checkpoint_type",
    "checkpoint",
    "metadata",
)
LISTED = (
    "thread_id",
    "checkpoint_ns",
    "ns_hash",
    "checkpoint_id",
    "parent_checkpoint_id",
    "checkpoint_type",
    "checkpoint",
    "metadata",
    "thread_hash",
)

# Rows of the checkpoint-with-writes read: the checkpoint, its pending writes, then the
# values it was expected to read (`read`).
CHECKPOINT_ROW = 0
WRITE_ROW = 1
BLOB_ROW = 2

PAGE_BLOBS = (0, 8, 32, 128)
"""How many value look-ups a statement of a listing's page takes (`page_values`): a page's
keys are padded up to the next of these, so a process compiles four shapes at most."""

MAX_LOOKUPS = 64
"""Keyed look-ups per statement where values and pending writes are read together (a page of
`list`): at most four parameters each."""


def _bind(name: str, column: sa.Column[Any]) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=column.type)


def _bound(table: sa.Table, columns: Sequence[str], prefix: str) -> dict[str, Any]:
    return {column: _bind(f"{prefix}{column}", table.c[column]) for column in columns}


def chunks(items: Sequence[T], size: int = MAX_ROWS) -> Iterator[Sequence[T]]:
    """`items` in runs of at most `size`, one per multi-row statement."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def keyed_params(
    keys: Sequence[Sequence[Any]], columns: Sequence[str], *, prefix: str = "k"
) -> dict[str, Any]:
    """The parameters of a keyed statement (`keyed`, `keyed_delete`; `values_and_writes` with
    its prefixes) for `keys`."""
    params: dict[str, Any] = {}
    for i, key in enumerate(keys):
        for column, value in zip(columns, key, strict=True):
            params[f"{prefix}{i}_{column}"] = value
    return params
