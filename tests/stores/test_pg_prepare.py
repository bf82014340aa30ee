"""A statement text the process runs often is prepared on each pooled connection at its
first run there (`_dialects._pg_prepare`), not after that connection's own five runs: a
pool spreads a process's statements over several connections, and each unprepared run is
parsed and planned by the server again."""

from __future__ import annotations

import uuid
from typing import Any

from support.capabilities import prepares_statements, require

from agboss_sql._dialects._pg_prepare import PREPARE_AFTER
from agboss_sql.sql.connection import SqlConnection


async def _prepared_here(sql: SqlConnection, raw: Any, marker: str) -> int:
    """How many statements holding `marker` the session of `raw` has prepared."""
    cursor = await raw.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", (f"%{marker}%",)
    )
    row = await cursor.fetchone()
    return int(row[0])


async def test_a_text_the_process_ran_often_is_prepared_at_once_on_another_connection(
    sql: SqlConnection,
) -> None:
    require(prepares_statements(sql), "statements its driver prepares")
    marker = f"n_{uuid.uuid4().hex}"
    text = f"SELECT %(n)s::integer AS {marker}"
    runner: Any = sql._runner
    async with runner.connection() as first, runner.connection() as second:
        for n in range(PREPARE_AFTER - 1):
            await sql.dialect.execute(first, text, {"n": n})
        await sql.dialect.execute(second, text, {"n": 0})
        # Fewer runs than the threshold, in the process and on each connection: none.
        assert await _prepared_here(sql, second, marker) == 0
        rows, _ = await sql.dialect.execute(second, text, {"n": 7})
        # The process's fifth run, the second on this connection: prepared, and answered.
        assert rows == [(7,)]
        assert await _prepared_here(sql, second, marker) == 1
        assert await _prepared_here(sql, first, marker) == 0


async def test_a_text_sent_verbatim_is_left_to_the_driver(sql: SqlConnection) -> None:
    require(prepares_statements(sql), "statements its driver prepares")
    marker = f"n_{uuid.uuid4().hex}"
    text = f"SELECT 1 AS {marker}"
    runner: Any = sql._runner
    async with runner.connection() as first, runner.connection() as second:
        for _ in range(PREPARE_AFTER + 1):
            await sql.dialect.execute(first, text, None)
        await sql.dialect.execute(second, text, None)
        # A verbatim text may hold several statements (the simple protocol's): never forced.
        assert await _prepared_here(sql, second, marker) == 0
