"""Fixtures of the Galera tests: connections to each node of a running cluster.

`AGBOSS_GALERA_URLS` names the nodes (whitespace-separated URLs, as
`dialects/galera/ready.sh` prints them); every test here is skipped, with that reason,
when it is unset. The schema is created once per session through node 1 (DDL replicates
to every node in total order) and every table emptied before each test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable

import pytest

from agboss_sql.lab.database import create_schema, truncate_all
from agboss_sql.sql.connection import SqlConnection

GALERA_URLS_ENV = "AGBOSS_GALERA_URLS"


def galera_urls_from_env() -> list[str]:
    return os.environ.get(GALERA_URLS_ENV, "").split()


@pytest.fixture(scope="session")
def galera_urls() -> list[str]:
    """The URL of each node of the cluster, node 1 first (at least two)."""
    urls = galera_urls_from_env()
    if len(urls) < 2:
        pytest.skip(
            f"{GALERA_URLS_ENV} is unset (or names fewer than two nodes): start a cluster "
            f'with dialects/galera/ready.sh and export {GALERA_URLS_ENV}="$(bash '
            'dialects/galera/ready.sh)"'
        )
    return urls


@pytest.fixture(scope="session")
def galera_schema(galera_urls: list[str]) -> list[str]:
    create_schema(galera_urls[0], drop_first=True)
    return galera_urls


@pytest.fixture
async def nodes(galera_schema: list[str]) -> AsyncIterator[Callable[[int], SqlConnection]]:
    """`nodes(i)`: a new connection (another instance) to node `i % len(nodes)`, on emptied
    tables; every connection made is closed after the test."""
    made: list[SqlConnection] = []
    first = SqlConnection(galera_schema[0])
    made.append(first)
    await truncate_all(first)

    def make(index: int) -> SqlConnection:
        connection = SqlConnection(galera_schema[index % len(galera_schema)])
        made.append(connection)
        return connection

    yield make
    for connection in made:
        await connection.close()
