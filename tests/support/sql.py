"""SQL helpers of the store tests: the statements a connection sends, a statement's plan."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agboss_sql.sql.connection import Exec, SqlConnection, Step

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK")


@contextmanager
def statements(
    connection: SqlConnection, *, transaction_control: bool = True
) -> Iterator[list[str]]:
    """The statements `connection` sends inside the block, in order; with
    `transaction_control=False`, BEGIN, COMMIT and ROLLBACK are left out."""
    sent: list[str] = []

    def listen(sql: str, _params: Any) -> None:
        if transaction_control or sql.split()[0].upper() not in TRANSACTION_CONTROL:
            sent.append(sql)

    remove = connection.add_statement_listener(listen)
    try:
        yield sent
    finally:
        remove()


async def plan_of(connection: SqlConnection, statement: Any, params: dict[str, Any]) -> str:
    """The database's plan for `statement` (on PostgreSQL with sequential scans disabled, so
    the plan shows whether an index can serve it at all, whatever the table's size)."""
    compiled = connection.compiled(statement)
    merged = {**compiled.defaults, **params}

    def step() -> Step[str]:
        # How to ask for a plan is SQL of each database, not a capability.
        if connection.dialect_name == "postgresql":
            yield Exec("SET LOCAL enable_seqscan = off", {})
        prefix = "EXPLAIN QUERY PLAN " if connection.dialect_name == "sqlite" else "EXPLAIN "
        rows = (yield Exec(prefix + compiled.sql, merged)).rows
        return "\n".join(" ".join(str(part) for part in row) for row in rows)

    return await connection.run(step, transaction=True)
