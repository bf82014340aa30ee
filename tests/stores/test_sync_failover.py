"""The synchronous connections fail over as the stores' async ones do: the checkpoint
saver's sync path (`_sync_drivers`) and migrations (`migrate.connect`), given a URL whose
first server is dead or silent, reach the live one.

MySQL/MariaDB: a `failover` list whose first node is a closed port, or a listener that never
accepts (TCP connects, the greeting never comes: a frozen node), then the server under test;
the node is chosen by the async driver's own code (`_mysql_failover.first_serving`, whose
memory of the node that served is shared). PostgreSQL: a multi-host URL
(`?host=…&host=…&target_session_attrs=read-write`) naming the same kinds of dead server
first. SQLite names one file: skipped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from support.capabilities import embedded_url
from support.ports import closed_port, silent_listener

from agboss_sql._dialects import mysql
from agboss_sql.contracts.errors import StoreUnavailableError
from agboss_sql.sql import migrate
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.checkpoint._sync_drivers import driver_for
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.timeouts import Timeouts

CONNECT_MS = 4_000
"""Two servers: the dead one is given half (MySQL's share; libpq's per-host timeout is
whole seconds, at least 2), the live one answers within the rest."""


@pytest.fixture
def server(sql_url: str) -> sa.URL:
    """The server under test (its schema at head: `sql_url`)."""
    if embedded_url(sql_url):
        pytest.skip("a SQLite URL names one file: nothing to fail over")
    return sa.make_url(sql_url)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener never accepts: TCP connects, the greeting never comes."""
    with silent_listener() as port:
        yield port


def live(server: sa.URL) -> tuple[str, int]:
    assert server.port is not None, "the test servers' URLs name their ports"
    return server.host or "127.0.0.1", server.port


def dead_first(server: sa.URL, dead_port: int) -> sa.URL:
    """`server`'s URL naming a dead server at `dead_port` first, then `server`."""
    host, port = live(server)
    if server.get_backend_name() == "postgresql":
        return (
            server.set(host=None, port=None)
            .update_query_dict({"host": [f"127.0.0.1:{dead_port}", f"{host}:{port}"]})
            .update_query_dict({"target_session_attrs": "read-write"})
        )
    return server.set(host="127.0.0.1", port=dead_port).update_query_dict(
        {mysql.FAILOVER_PARAM: f"{host}:{port}"}
    )


def assert_reached(url: sa.URL, rows: Any) -> None:
    """`rows` answered `SELECT 1`: the dead server answers nothing, so the live one did."""
    assert rows == [(1,)]
    if mysql.FAILOVER_PARAM in url.query:
        # The node that served is remembered for the next connection, by the one choice of
        # node the async driver makes too.
        assert mysql._PREFERRED[tuple(mysql.nodes_of(url))] == 1


@pytest.mark.parametrize("dead", ["closed", "silent"])
def test_the_savers_sync_driver_reaches_the_live_server(
    server: sa.URL, silent_port: int, dead: str
) -> None:
    url = dead_first(server, closed_port() if dead == "closed" else silent_port)
    driver = driver_for(url, Timeouts(connect_ms=CONNECT_MS))
    raw = driver.connect()
    try:
        rows, _ = driver.execute(raw, "SELECT 1", None)
        assert_reached(url, rows)
    finally:
        driver.close(raw)


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


async def test_the_savers_sync_methods_write_and_read_through_the_live_server(
    server: sa.URL, silent_port: int
) -> None:
    url = dead_first(server, silent_port)
    connection = SqlConnection(url, timeouts=Timeouts(connect_ms=CONNECT_MS))
    try:
        async with SqlCheckpointSaver(connection) as saver:
            checkpoint: Checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"answer": 42}
            checkpoint["channel_versions"] = {"answer": saver.get_next_version(None, None)}
            config = _config(f"thread-{uuid.uuid4()}")
            stored = saver.put(
                config, checkpoint, {"source": "input", "step": -1}, checkpoint["channel_versions"]
            )
            found = saver.get_tuple(config)
            assert found is not None
            wanted = stored["configurable"]["checkpoint_id"]
            assert found.config["configurable"]["checkpoint_id"] == wanted
            assert found.checkpoint["channel_values"] == {"answer": 42}
    finally:
        await connection.close()


def test_no_server_answering_is_a_typed_error_on_the_sync_driver(
    server: sa.URL, silent_port: int
) -> None:
    url = dead_first(server.set(host="127.0.0.1", port=closed_port()), silent_port)
    driver = driver_for(url, Timeouts(connect_ms=2_000))
    with pytest.raises(StoreUnavailableError):
        driver.connect()


@pytest.mark.parametrize("dead", ["closed", "silent"])
def test_migrations_reach_the_live_server(server: sa.URL, silent_port: int, dead: str) -> None:
    url = dead_first(server, closed_port() if dead == "closed" else silent_port)
    # The schema is at head (`sql_url`): the upgrade reads it there and does nothing.
    assert migrate.upgrade(url) == migrate.Migration(migrate.head(), migrate.head())
    assert migrate.current(url) == migrate.head()
    with migrate.connect(url) as connection, connection.begin():
        rows = [tuple(row) for row in connection.exec_driver_sql("SELECT 1")]
    assert_reached(url, rows)
