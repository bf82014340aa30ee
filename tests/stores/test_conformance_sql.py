"""The SQL store set passes every contract suite on the database under test
(`AGBOSS_TEST_DATABASE_URL`, else a temporary SQLite file).

Each instance of a case is its own `SqlConnection` (two connections are two instances of
one application); the schema is created once per session (`create_schema`), every table
is emptied before each case (`truncate_all`), and the fenced effects' work writes the
business table through the effect's transaction (`insert_business_row`).

Every store comes from `sql_stores()`, imported normally: a store module that does not
import fails the run at collection (tests/stores/test_store_imports.py proves it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from support.nodes import node_url

from agboss_sql.contracts.stores import CONTRACTS
from agboss_sql.lab.business import (
    committed_business_rows,
    insert_business_row,
)
from agboss_sql.lab.database import truncate_all
from agboss_sql.sql import sql_stores
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.testing.contracts import BusinessRows, Seam, StoreFactory, store_conformance

STORE_TIME_CONTRACTS = frozenset(
    {"execution_lease", "fenced_effect", "outbound_call", "rate_limit"}
)
"""The contracts whose SQL store decides by the store's time; the others decide by the
application's own (possibly skewed) clock."""

SQL_STORES: dict[str, type[Any]] = {
    contract: cls
    for cls in sql_stores()
    for contract, interface in CONTRACTS.items()
    if issubclass(cls, interface)
}
"""Every contract's SQL store, from the public list (`sql_stores()`): imported normally, so
a store module that does not import fails the whole run instead of leaving a gap."""


class Instances:
    """One `SqlConnection` per instance id, opened on first use, on the database under test."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.connections: dict[str, SqlConnection] = {}

    def connection(self, instance_id: str) -> SqlConnection:
        found = self.connections.get(instance_id)
        if found is None:
            if self.url is None:
                raise RuntimeError("the database fixture has not run")
            found = self.connections[instance_id] = SqlConnection(
                node_url(self.url, len(self.connections))
            )
        return found

    @property
    def first(self) -> SqlConnection:
        return self.connection("instance-1")

    async def close(self) -> None:
        for connection in self.connections.values():
            await connection.close()
        self.connections.clear()


INSTANCES = Instances()


@pytest_asyncio.fixture(scope="module", loop_scope="session", autouse=True)
async def _database(sql_url: str) -> AsyncIterator[None]:
    INSTANCES.url = sql_url
    yield
    await INSTANCES.close()


async def reset() -> None:
    await truncate_all(INSTANCES.first)


async def insert(tx: Any, row: str) -> None:
    await insert_business_row(tx, row)


async def committed() -> list[str]:
    return await committed_business_rows(INSTANCES.first)


def _factory(contract: str, cls: type[Any]) -> StoreFactory:
    def build(seam: Seam) -> Any:
        connection = INSTANCES.connection(seam.application.instance_id)
        chosen = seam.store_clock if contract in STORE_TIME_CONTRACTS else seam.clock
        return cls(connection, chosen, seam.application)

    return StoreFactory(build)


TestSql = store_conformance(
    name="SQL",
    reset=reset,
    stores={contract: _factory(contract, cls) for contract, cls in SQL_STORES.items()},
    business_rows=BusinessRows(insert=insert, committed=committed),
    # The explorer searches this set's worlds deeper in tests/explorer/test_explorer_sql.py;
    # registering it here too would run a shallower search of the same worlds again.
    interleavings=False,
)


def test_every_contract_has_exactly_one_sql_store_in_the_set() -> None:
    stores = [cls for cls in sql_stores() if any(issubclass(cls, c) for c in CONTRACTS.values())]
    assert len(stores) == len(SQL_STORES), [cls.__name__ for cls in stores]
    assert set(SQL_STORES) == set(CONTRACTS)
