"""A MySQL/MariaDB URL with `failover` alternates: a new connection goes to the first node
that answers, each node tried within its share of `connect_ms`, starting from the node the
last one reached; no node answering is a typed error. A node that accepts TCP and never
greets (a frozen server) is modelled by a socket that listens and never accepts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from support.ports import closed_port, silent_listener

from agboss_sql._dialects import mysql
from agboss_sql.contracts.errors import StoreUnavailableError
from agboss_sql.sql import SqlConnection
from agboss_sql.sql.timeouts import Timeouts


@pytest.fixture
def server(database_url: str) -> sa.URL:
    url = sa.make_url(database_url)
    if url.get_backend_name() not in ("mysql", "mariadb"):
        pytest.skip("failover alternates are the MySQL/MariaDB dialect's")
    return url


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener never accepts: TCP connects, the greeting never comes."""
    with silent_listener() as port:
        yield port


def with_nodes(server: sa.URL, first: tuple[str, int], *rest: tuple[str, int]) -> sa.URL:
    alternates = ",".join(f"{h}:{p}" for h, p in rest)
    return server.set(host=first[0], port=first[1]).update_query_dict({"failover": alternates})


async def port_answering(url: sa.URL, connect_ms: int) -> int:
    async with SqlConnection(url, timeouts=Timeouts(connect_ms=connect_ms)) as connection:
        return int((await connection.execute("SELECT @@port")).scalar())


def test_a_silent_node_is_passed_over_within_its_share(server: sa.URL, silent_port: int) -> None:
    real = (server.host or "127.0.0.1", server.port or 3306)
    url = with_nodes(server, ("127.0.0.1", silent_port), real)
    # 2 nodes: the silent one is given 2 of the 4 s, the server answers within the rest.
    assert asyncio.run(port_answering(url, 4_000)) == real[1]
    # The next connection starts from the node that served.
    assert mysql._PREFERRED[tuple(mysql.nodes_of(url))] == 1


def test_a_gone_node_is_passed_over(server: sa.URL) -> None:
    real = (server.host or "127.0.0.1", server.port or 3306)
    url = with_nodes(server, ("127.0.0.1", closed_port()), real)
    assert asyncio.run(port_answering(url, 4_000)) == real[1]


def test_no_node_answering_is_a_typed_error(server: sa.URL, silent_port: int) -> None:
    url = with_nodes(server, ("127.0.0.1", closed_port()), ("127.0.0.1", silent_port))
    with pytest.raises(StoreUnavailableError, match=r"no node of 127\.0\.0\.1:"):
        asyncio.run(port_answering(url, 2_000))


def test_the_sqlalchemy_engine_fails_over_too(server: sa.URL) -> None:
    real = (server.host or "127.0.0.1", server.port or 3306)
    url = with_nodes(server, ("127.0.0.1", closed_port()), real)

    async def engine_port() -> int:
        async with SqlConnection(url, timeouts=Timeouts(connect_ms=4_000)) as connection:
            async with connection.engine.connect() as engine_connection:
                found = await engine_connection.execute(sa.text("SELECT @@port"))
                return int(found.scalar_one())

    assert asyncio.run(engine_port()) == real[1]
