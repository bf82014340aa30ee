"""SQL helpers of the store tests: the statements a connection sends, a statement's plan, and
each server's own SQL for what the tests ask of it (sessions, sleeps, lock waits).

How to say these is SQL of each database, not a capability: the database is named here, in
this one place, and the tests ask for what the SQL does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import URL

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
        if connection.dialect_name == "postgresql":
            yield Exec("SET LOCAL enable_seqscan = off", {})
        rows = (yield Exec(explain_prefix(connection) + compiled.sql, merged)).rows
        return "\n".join(" ".join(str(part) for part in row) for row in rows)

    return await connection.run(step, transaction=True)


def explain_prefix(connection: SqlConnection) -> str:
    """What asks the database for a statement's plan, put before the statement."""
    return "EXPLAIN QUERY PLAN " if connection.dialect_name == "sqlite" else "EXPLAIN "


def _postgresql(connection: SqlConnection) -> bool:
    return connection.dialect_name == "postgresql"


def sleep_sql(connection: SqlConnection, seconds: float) -> str:
    """A statement that takes `seconds` on the server."""
    return f"SELECT {sleep_expression(connection, seconds)}"


def sleep_expression(connection: SqlConnection, seconds: float) -> str:
    """An expression that takes `seconds` on the server."""
    return f"pg_sleep({seconds})" if _postgresql(connection) else f"SLEEP({seconds})"


def sleep_condition(connection: SqlConnection, seconds: float) -> str:
    """A condition that takes `seconds` on the server and then holds (for a `WHERE`)."""
    test = " IS NOT NULL" if _postgresql(connection) else " = 0"
    return sleep_expression(connection, seconds) + test


def session_id_sql(connection: SqlConnection) -> str:
    """A statement answering the server's id of the session it runs on."""
    return "SELECT pg_backend_pid()" if _postgresql(connection) else "SELECT CONNECTION_ID()"


def kill_sql(connection: SqlConnection, session: int) -> str:
    """A statement that ends the server session `session` (its client sees a disconnect)."""
    if _postgresql(connection):
        return f"SELECT pg_terminate_backend({int(session)})"
    return f"KILL {int(session)}"


def sessions_alive_sql(connection: SqlConnection, sessions: set[int]) -> str:
    """A statement answering which of `sessions` the server still has."""
    listed = ", ".join(str(int(s)) for s in sessions)
    if _postgresql(connection):
        return f"SELECT pid FROM pg_stat_activity WHERE pid IN ({listed})"
    return f"SELECT id FROM information_schema.processlist WHERE id IN ({listed})"


def statement_past_its_bound(connection: SqlConnection) -> tuple[list[str], str]:
    """`(session setup, statement)`: a statement the server ends at a 100 ms bound."""
    if _postgresql(connection):
        return ["SET statement_timeout = 100"], "SELECT pg_sleep(2)"
    return [], "SET STATEMENT max_statement_time = 0.1 FOR SELECT SLEEP(2) FROM (SELECT 1) AS one"


def lock_waits_sql(connection: SqlConnection, statement: str) -> str:
    """A statement counting the sessions of this database waiting for a lock while running a
    statement that starts with `statement` (PostgreSQL counts every lock wait of the
    database). MariaDB lists an autocommit statement's lock wait in no InnoDB table, so
    there the statement is seen running in the process list."""
    if _postgresql(connection):
        return (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    return (
        "SELECT count(*) FROM information_schema.processlist "
        f"WHERE db = DATABASE() AND command = 'Query' AND info LIKE '{statement}%'"
    )


def server_admin(url: URL) -> tuple[URL, str, str]:
    """`(admin URL, quote, force)` of `url`'s server: the URL to create and drop databases
    from, the quote around a database's name, and what ends a `DROP DATABASE`'s target's
    sessions first."""
    if url.get_backend_name() == "postgresql":
        return url.set(database="postgres"), '"', " WITH (FORCE)"
    return url.set(database=None), "`", ""


def refusing_trigger_sql(
    connection: SqlConnection, table: str, message: str
) -> tuple[list[str], list[str]]:
    """The statements that make every insert into `table` fail in a trigger with `message`
    (each database's own trigger language), and those that drop it again."""
    name = f"{table}_refuses"
    if connection.dialect_name == "sqlite":
        return (
            [
                f"CREATE TRIGGER {name} BEFORE INSERT ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
            ],
            [f"DROP TRIGGER IF EXISTS {name}"],
        )
    if _postgresql(connection):
        return (
            [
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN RAISE EXCEPTION '{message}'; END $$",
                f"CREATE TRIGGER {name} BEFORE INSERT ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {name}()",
            ],
            [f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {name}()"],
        )
    return (
        [
            f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW "
            f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'"
        ],
        [f"DROP TRIGGER IF EXISTS {name}"],
    )
