"""Fixtures of the example tests: the shop's tables made afresh by the example's own
command, the agboss tables emptied (`sql`), two workers of the example's app, a client."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from saga_support import EXAMPLE, START_S, Worker, drop_shop_tables, ok, run_example

from agboss_sql.runtime import Engine
from agboss_sql.sql.connection import SqlConnection

# The tests import the example's package as its client and workers do (from its directory).
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))


@pytest.fixture
def shop_url(sql: SqlConnection, sql_url: str) -> str:
    """The database under test: the agboss tables empty, the shop's tables dropped and
    created by `python -m order_saga.schema URL`, as the README does."""
    drop_shop_tables(sql_url)
    assert ok(run_example("order_saga.schema", sql_url)).strip() == "shop tables ready"
    return sql_url


@pytest.fixture
def workers(shop_url: str, tmp_path: Path) -> Iterator[list[Worker]]:
    """Two workers of the example's app, ready (their names registered); each process
    group stopped after the test, killed if it does not stop."""
    started: list[Worker] = []
    try:
        for index in range(2):
            started.append(Worker(shop_url, tmp_path / f"worker{index}.err"))
        for worker in started:
            worker.wait_for(lambda e: e.get("kind") == "ready", START_S, "ready event")
        yield started
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture
async def client_engine(workers: list[Worker], shop_url: str) -> AsyncIterator[Engine]:
    """A client in this process (`Engine(app, work=False)`): starts and reads, runs nothing."""
    from order_saga.app import app

    async with Engine(app, url=shop_url, work=False) as engine:
        yield engine
