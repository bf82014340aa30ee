"""The MySQL stores write their statements' parameters into the text themselves
(`_mysql_literals.rendered`): it must give the very text the drivers' own `mogrify` gives,
and the server must read back every value as it was given: every byte, every escaped
character, text beyond ASCII. In `NO_BACKSLASH_ESCAPES` mode the drivers' own quoting is
used."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from agboss_sql._dialects import mysql
from agboss_sql._dialects._mysql_literals import rendered
from agboss_sql.sql.checkpoint._sync_drivers import MysqlDriver
from agboss_sql.sql.timeouts import Timeouts

SPECIAL = "\0\\\n\r\032\"'%"


def values() -> list[Any]:
    """What the stores pass, and what they do not (these take the driver's way)."""
    chooser = random.Random(31)
    every_byte = bytes(range(256))
    return [
        "",
        "plain-ascii_text 0123",
        SPECIAL,
        "é ünïcødé ☃ 😀" + SPECIAL,
        every_byte,
        every_byte[::-1] * 3,
        b"",
        bytes(chooser.randrange(256) for _ in range(4096)),
        "".join(chooser.choice(SPECIAL + "ab\u00e9\u2603") for _ in range(500)),
        b"".join(chooser.choice([b"\\", b"'", b'"', b"\0", b"\n", b"x\xff"]) for _ in range(500)),
        0,
        -17,
        2**62,
        None,
        True,
        False,
        1.5,
    ]


def statement(count: int) -> tuple[str, dict[str, Any]]:
    given = values()[:count] if count else values()
    params = {f"p{i}": value for i, value in enumerate(given)}
    return "SELECT " + ", ".join(f"%(p{i})s" for i in range(len(given))), params


@pytest.fixture
def server(database_url: str) -> sa.URL:
    url = sa.make_url(database_url)
    if url.get_backend_name() not in ("mysql", "mariadb"):
        pytest.skip("the literals are the MySQL/MariaDB drivers'")
    return url


@pytest.fixture
def driver(server: sa.URL) -> MysqlDriver:
    return MysqlDriver(server, Timeouts())


@pytest.fixture
def sync_raw(driver: MysqlDriver) -> Iterator[Any]:
    raw = driver.connect()
    yield raw
    driver.close(raw)


def expected(value: Any) -> Any:
    """What the server answers for `value` sent as a literal (booleans are integers)."""
    return int(value) if isinstance(value, bool) else value


@pytest.mark.parametrize("no_backslash_escapes", [False, True])
def test_the_text_is_pymysqls_own_and_the_server_reads_each_value_back(
    driver: MysqlDriver, sync_raw: Any, no_backslash_escapes: bool
) -> None:
    if no_backslash_escapes:
        driver.execute(sync_raw, "SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'", None)
    sql, params = statement(0)
    with sync_raw.cursor() as cursor:
        assert rendered(sync_raw, sql, params) == cursor.mogrify(sql, params)
    rows, _ = driver.execute(sync_raw, sql, params)
    assert rows is not None
    assert list(rows[0]) == [expected(value) for value in params.values()]


def test_aiomysqls_text_too_and_the_server_reads_each_value_back(server: sa.URL) -> None:
    async def check() -> None:
        raw = await mysql.connect(server, Timeouts())
        try:
            sql, params = statement(0)
            cursor = await raw.cursor()
            assert rendered(raw, sql, params) == cursor.mogrify(sql, params)
            await cursor.close()
            rows, _ = await mysql.execute(raw, sql, params)
            assert rows is not None
            assert list(rows[0]) == [expected(value) for value in params.values()]
        finally:
            await mysql.close(raw)

    asyncio.run(check())


def test_no_parameters_send_the_text_verbatim_and_empty_ones_format_it(
    driver: MysqlDriver, sync_raw: Any
) -> None:
    rows, _ = driver.execute(sync_raw, "SELECT '%%'", None)
    assert rows is not None and rows[0][0] == "%%"
    rows, _ = driver.execute(sync_raw, "SELECT '%%'", {})
    assert rows is not None and rows[0][0] == "%"
