"""PostgreSQL: psycopg 3 (async), `ON CONFLICT`, `RETURNING`, row locks, `SKIP LOCKED`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import URL
from sqlalchemy.sql.expression import ColumnElement

NAME = "postgresql"
UPDATE_RETURNING = True
INSERT_RETURNING = True
UPSERT_RETURNING = True
ROW_LOCKS = True
SKIP_LOCKED = True
BEGIN = "BEGIN"
ASYNC_DRIVER = "psycopg"

insert = pg.insert


def compile_dialect() -> sa.Dialect:
    from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg

    return PGDialectAsync_psycopg(paramstyle="pyformat")  # type: ignore[no-untyped-call]


def now_ms() -> ColumnElement[int]:
    """The database clock in ms. `clock_timestamp()` is volatile: reference it once per
    statement (through `now_source`), never in several places."""
    return sa.cast(
        sa.func.floor(sa.extract("epoch", sa.func.clock_timestamp()) * 1000), sa.BigInteger
    )


def now_source(database_time: bool) -> tuple[sa.CTE, ColumnElement[int]]:
    """A one-row CTE holding the statement's time, read once: the database clock or `:now`."""
    value = (
        now_ms()
        if database_time
        else sa.cast(sa.bindparam("now", type_=sa.BigInteger), sa.BigInteger)
    )
    cte = sa.select(value.label("now")).cte("agboss_now")
    return cte, cte.c.now


def greatest(*values: Any) -> ColumnElement[Any]:
    return sa.func.greatest(*values)


def least(*values: Any) -> ColumnElement[Any]:
    return sa.func.least(*values)


def for_update(select: sa.Select[Any]) -> sa.Select[Any]:
    return select.with_for_update()


def skip_locked(select: sa.Select[Any]) -> sa.Select[Any]:
    return select.with_for_update(skip_locked=True)


def insert_if_absent(table: sa.Table, keys: Sequence[str]) -> Any:
    """`INSERT … ON CONFLICT DO NOTHING` on the unique key `keys`."""
    return insert(table).on_conflict_do_nothing(index_elements=list(keys))


INSERT_IF_ABSENT_RAISES = False


# --- the raw async driver -------------------------------------------------------------


def conninfo(url: URL) -> dict[str, Any]:
    args: dict[str, Any] = {
        "host": url.host or "localhost",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "dbname": url.database or "postgres",
    }
    if url.password:
        args["password"] = url.password
    args.update({k: v for k, v in url.query.items() if isinstance(v, str)})
    return args


async def connect(url: URL) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(**conninfo(url), autocommit=True)


async def execute(raw: Any, sql: str, params: Mapping[str, Any]) -> tuple[list[Any] | None, int]:
    cursor = raw.cursor()
    try:
        await cursor.execute(sql, params)
        rows = await cursor.fetchall() if cursor.description is not None else None
        return rows, cursor.rowcount
    finally:
        await cursor.close()


async def run_text(raw: Any, sql: str) -> None:
    await raw.execute(sql)


async def close(raw: Any) -> None:
    await raw.close()


def is_retryable(exc: BaseException) -> bool:
    """Serialization failure, deadlock, lock-not-available: the transaction did not apply."""
    sqlstate = getattr(exc, "sqlstate", None) or getattr(
        getattr(exc, "orig", None), "sqlstate", None
    )
    return sqlstate in ("40001", "40P01", "55P03")


def is_unique_violation(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None) or getattr(
        getattr(exc, "orig", None), "sqlstate", None
    )
    return sqlstate == "23505"


def is_disconnect(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and not is_retryable(
        exc
    )
