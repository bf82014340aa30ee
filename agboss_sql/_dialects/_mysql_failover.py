"""A MySQL/MariaDB URL's failover alternates (Galera): which nodes a URL names, and the
first of them that serves a new connection."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.engine import URL

from agboss_sql.contracts.errors import ServerSettingError

FAILOVER_PARAM = "failover"
"""The URL query parameter naming a Galera node's alternates, tried in order when it is gone:
`mysql://root@node1:3306/db?failover=node2:3306,node3:3306`."""

_PREFERRED: dict[tuple[tuple[str, int], ...], int] = {}
"""Per node list, the index of the node the last new connection reached: the next one
tries it first (a gone node costs its bound once, not at every new connection)."""

_SYNCED = "4"  # wsrep_local_state: Synced (a donor or a joiner is 1, 2 or 3)

SERVING = ("ON", _SYNCED)
"""The state of a node that serves: ready, Synced (a server that is no Galera node too)."""

NO_NODE = "no node of"
"""How the error of a node list none of whose nodes served begins."""


def nodes_of(url: URL) -> list[tuple[str, int]]:
    """The `(host, port)` of the URL's node, then of each `failover` alternate, in order;
    a malformed alternate is `ValueError` naming it."""
    nodes = [(url.host or "localhost", url.port or 3306)]
    raw = url.query.get(FAILOVER_PARAM)
    values = [raw] if isinstance(raw, str) else list(raw or ())
    for value in values:
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                continue
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    f"failover node {item!r} is not host:port (in {FAILOVER_PARAM}={value!r})"
                )
            if (host, int(port)) not in nodes:
                nodes.append((host, int(port)))
    return nodes


def without_failover(url: URL) -> URL:
    """The URL of its first node alone (for SQLAlchemy's own URL: its connections are
    opened by `_mysql_sync`, which reads the alternates from the URL they were taken from)."""
    if FAILOVER_PARAM not in url.query:
        return url
    return url.difference_update_query([FAILOVER_PARAM])


async def first_serving(
    nodes: list[tuple[str, int]],
    connect_ms: int,
    open_node: Callable[[tuple[str, int], int], Awaitable[tuple[Any, tuple[str, str]]]],
    close: Callable[[Any], None],
) -> Any:
    """The connection of the first node of `nodes` that serves, starting from the one the
    last new connection reached. `open_node(node, bound_ms)` opens one within its share of
    `connect_ms` and answers it with its `(wsrep_ready, wsrep_local_state)` (`SERVING` for a
    server that is no Galera node); `close` closes one passed over.

    The one choice of node for every driver: the async one awaits its connections
    (`mysql.connect`); the synchronous one (`_mysql_sync`) gives coroutines that never
    suspend, and runs this to its end at its first step (`first_serving_now`)."""
    key = tuple(nodes)
    first = _PREFERRED.get(key, 0)
    share_ms = max(200, connect_ms // len(nodes))
    fallback: tuple[int, Any] | None = None
    failure: BaseException | None = None
    for step in range(len(nodes)):
        index = (first + step) % len(nodes)
        try:
            raw, state = await open_node(nodes[index], share_ms)
        except ServerSettingError:
            if fallback is not None:
                close(fallback[1])
            raise
        except Exception as exc:
            failure = exc
            continue
        if state == SERVING:
            if fallback is not None:
                close(fallback[1])
            _PREFERRED[key] = index
            return raw
        if state[0] == "ON" and fallback is None:
            fallback = (index, raw)
        else:
            close(raw)
            failure = _not_ready(nodes[index], state)
    if fallback is not None:
        _PREFERRED[key] = fallback[0]
        return fallback[1]
    from pymysql.err import OperationalError

    raise OperationalError(
        2003,
        f"{NO_NODE} {', '.join(f'{h}:{p}' for h, p in nodes)} served a connection within its "
        f"{share_ms} ms share of connect_ms (last: {type(failure).__name__}: {failure})",
    ) from failure


def first_serving_now(
    nodes: list[tuple[str, int]],
    connect_ms: int,
    open_node: Callable[[tuple[str, int], int], tuple[Any, tuple[str, str]]],
    close: Callable[[Any], None],
) -> Any:
    """`first_serving` for a synchronous driver: `open_node` blocks (within its bound) and
    answers at once."""

    async def opened(node: tuple[str, int], bound_ms: int) -> tuple[Any, tuple[str, str]]:
        return open_node(node, bound_ms)

    choosing = first_serving(nodes, connect_ms, opened, close)
    try:
        choosing.send(None)
    except StopIteration as done:
        return done.value
    choosing.close()
    raise RuntimeError("choosing a node awaited something other than its connections")


def _not_ready(node: tuple[str, int], state: tuple[str, str]) -> Exception:
    from pymysql.err import OperationalError

    error: Exception = OperationalError(
        1047,
        f"node {node[0]}:{node[1]} is not ready (wsrep_ready {state[0]}, "
        f"wsrep_local_state {state[1]})",
    )
    return error


async def node_state(raw: Any) -> tuple[str, str]:
    """An aiomysql connection's node's `(wsrep_ready, wsrep_local_state)` (`SERVING` when it
    is no Galera node); the connection is closed when asking fails."""
    if not raw._agboss_galera:
        return SERVING
    try:
        cursor = await raw.cursor()
        try:
            await cursor.execute(NODE_STATE_QUERY)
            rows = {str(k).lower(): str(v) for k, v in await cursor.fetchall()}
        finally:
            await cursor.close()
        if raw.get_transaction_status():
            await raw.commit()
    except BaseException:
        raw.close()
        raise
    return rows.get("wsrep_ready", "").upper(), rows.get("wsrep_local_state", "")


def node_state_now(raw: Any) -> tuple[str, str]:
    """`node_state` of a PyMySQL connection (in autocommit)."""
    if not raw._agboss_galera:
        return SERVING
    try:
        with raw.cursor() as cursor:
            cursor.execute(NODE_STATE_QUERY)
            rows = {str(k).lower(): str(v) for k, v in cursor.fetchall()}
    except BaseException:
        with contextlib.suppress(Exception):
            raw._force_close()
        raise
    return rows.get("wsrep_ready", "").upper(), rows.get("wsrep_local_state", "")


NODE_STATE_QUERY = "SHOW STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_local_state')"
"""What a connection with `failover` alternates asks a Galera node before using it."""
