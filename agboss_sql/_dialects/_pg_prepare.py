"""PostgreSQL: when a statement is prepared on a pooled connection.

psycopg prepares a statement on a connection once that connection has run its text
`prepare_threshold` times (5); until then each run is parsed and planned by the server
again. That count is per connection, and a pool spreads a process's statements over several:
a saver's chat turn runs on two or three, so a new saver ran a fifth of its statements
unprepared over 60 turns, and the latest checkpoint's read cost the server 0.45-0.52 ms of
CPU unprepared against 0.08-0.10 ms prepared. Here the count is the process's: once a text
has run `PREPARE_AFTER` times on any connection, every connection prepares it at its first
run there (one more round trip on that connection, as psycopg's own threshold costs at
the sixth run). Behind a transaction pooler psycopg prepares nothing whatever is asked
(`prepare_threshold=None`, `_pg_pooling`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREPARE_AFTER = 5
"""Runs of a text in the process after which each connection prepares it (psycopg's own
default threshold, counted per process rather than per connection)."""

COUNTED_TEXTS = 4096
"""Texts whose runs are counted: a process making texts without end (values written into
the text) counts its first ones, and leaves the rest to psycopg's count per connection."""

_runs: dict[str, int] = {}


def prepare(sql: str, params: Mapping[str, Any] | None) -> bool | None:
    """psycopg's `prepare` argument for one run of `sql`: True once the process ran it
    `PREPARE_AFTER` times, else None (psycopg's count decides). A text sent verbatim
    (`params` None) is never forced: it may hold several statements, which only the simple
    protocol takes. Counting is unlocked: a count lost between threads only delays it."""
    if params is None:
        return None
    runs = _runs.get(sql, 0)
    if runs >= PREPARE_AFTER:
        return True
    if runs or len(_runs) < COUNTED_TEXTS:
        _runs[sql] = runs + 1
    return None
