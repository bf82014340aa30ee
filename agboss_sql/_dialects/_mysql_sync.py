"""PyMySQL connections (the checkpoint saver's synchronous path, migrations) that fail over
as the async driver's do: to the first node of a URL's (`failover` alternates) that answers
and is Synced, each within its share of `Timeouts.connect_ms` (`_mysql_failover`)."""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy.engine import URL

from agboss_sql._dialects._mysql_failover import (
    SERVING,
    first_serving_now,
    node_state_now,
    nodes_of,
)
from agboss_sql._dialects.mysql import GALERA_SESSION, SETTINGS_QUERY, checked_settings


def connect(url: URL, connect_ms: int, **options: Any) -> Any:
    """A PyMySQL connection to the first node of `url`'s that serves (its user, password and
    database; `options` are PyMySQL's other arguments, `host` and `port` excepted)."""
    params = {
        "user": url.username or "root",
        "password": url.password or "",
        "database": url.database,
        **options,
    }
    return connect_params(nodes_of(url), connect_ms, params)


def connect_params(nodes: list[tuple[str, int]], connect_ms: int, params: dict[str, Any]) -> Any:
    """A PyMySQL connection of `params` (PyMySQL's arguments; their `host`, `port` and
    `connect_timeout` are replaced) to the first node of `nodes` that serves, as the async
    driver chooses it: a node is given its share of `connect_ms` to accept, greet and answer
    the set-up (its settings, a Galera node's state), then passed over (a frozen node accepts
    TCP and never greets). With one node, it has all of `connect_ms`. No node serving raises the last
    node's error, in a PyMySQL `OperationalError` (2003) beginning `NO_NODE`; a server whose
    `max_allowed_packet` is too small, `ServerSettingError`."""
    import pymysql

    read_timeout = params.get("read_timeout")
    write_timeout = params.get("write_timeout")
    chosen = {k: v for k, v in params.items() if k not in ("host", "port", "connect_timeout")}

    def open_node(
        node: tuple[str, int], bound_ms: int, ask_state: bool = True
    ) -> tuple[Any, tuple[str, str]]:
        bound_s = bound_ms / 1000
        # The set-up's reads (greeting, authentication, settings) within the node's share,
        # then the caller's own bounds.
        raw = pymysql.connect(
            **{**chosen, "read_timeout": bound_s, "write_timeout": bound_s},
            host=node[0],
            port=node[1],
            connect_timeout=bound_s,
        )
        try:
            with raw.cursor() as cursor:
                cursor.execute(SETTINGS_QUERY)
                raw._agboss_galera = checked_settings(cursor.fetchall())
                if raw._agboss_galera:
                    cursor.execute(GALERA_SESSION)
            state = node_state_now(raw) if ask_state else SERVING
        except BaseException:
            _close(raw)
            raise
        raw._read_timeout, raw._write_timeout = read_timeout, write_timeout
        return raw, state

    if len(nodes) == 1:
        raw, _ = open_node(nodes[0], connect_ms, ask_state=False)
        return raw
    return first_serving_now(nodes, connect_ms, open_node, _close)


def _close(raw: Any) -> None:
    """Close `raw`'s socket, sending nothing (a node passed over may not be reading)."""
    with contextlib.suppress(Exception):
        raw._force_close()
