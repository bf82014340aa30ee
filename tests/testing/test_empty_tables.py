"""`empty_project_tables` (and `truncate_all`, the `sql` fixture's reset) empties every
table of the project's metadata, whichever of them hold rows: it asks which do and deletes
from those alone."""

from __future__ import annotations

from support.rows import counts, fill

from agboss_sql.lab.business import business_rows
from agboss_sql.lab.database import truncate_all
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import metadata
from agboss_sql.testing.database import empty_project_tables

TABLES = metadata.sorted_tables


async def test_every_project_table_holding_a_row_is_emptied(
    sql: SqlConnection, sql_url: str
) -> None:
    fill(sql_url, TABLES)
    assert set(counts(sql_url, TABLES).values()) == {1}
    await empty_project_tables(sql)
    assert counts(sql_url, TABLES) == dict.fromkeys((t.name for t in TABLES), 0)


async def test_a_lone_table_holding_rows_is_emptied_among_empty_ones(
    sql: SqlConnection, sql_url: str
) -> None:
    for table in (TABLES[0], TABLES[-1]):
        fill(sql_url, [table])
        await empty_project_tables(sql)
        assert counts(sql_url, TABLES) == dict.fromkeys((t.name for t in TABLES), 0), table


async def test_truncate_all_empties_the_business_table_too(
    sql: SqlConnection, sql_url: str
) -> None:
    fill(sql_url, [*TABLES, business_rows])
    await truncate_all(sql)
    assert counts(sql_url, [*TABLES, business_rows]) == dict.fromkeys(
        (t.name for t in [*TABLES, business_rows]), 0
    )
