"""The nodes of a cluster of MySQL/MariaDB servers (Galera): which lists can be one, and
each worker's URL on them. Below both the cluster command and the fault suite."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa


def nodes_problem(nodes: Sequence[str]) -> str | None:
    """Why `nodes` cannot be the nodes of one cluster (`None` when they can): a node list
    is of MySQL/MariaDB URLs (the failover is that dialect's), each naming its host and
    port, with the first one's user, password and database, and no node twice."""
    parsed = [sa.make_url(node) for node in nodes]
    first = parsed[0]
    seen: set[tuple[str | None, int | None]] = set()
    for url in parsed:
        shown = url.render_as_string(hide_password=True)
        if url.get_backend_name() not in ("mysql", "mariadb"):
            return (
                f"a list of database nodes is for MySQL/MariaDB clusters (Galera), not "
                f"{url.get_backend_name()}: give one URL ({shown})"
            )
        if url.host is None or url.port is None:
            return f"give each node's host and port: {shown}"
        if (url.username, url.password, url.database) != (
            first.username,
            first.password,
            first.database,
        ):
            return (
                f"every node must have the first one's user, password and database "
                f"({first.render_as_string(hide_password=True)}): {shown}"
            )
        if (url.host, url.port) in seen:
            return f"node {url.host}:{url.port} is given twice"
        seen.add((url.host, url.port))
    return None


def node_url(nodes: Sequence[str], index: int) -> str:
    """Worker `index`'s URL on the cluster `nodes`: node `index mod n`, the next nodes in
    turn as its `failover` alternates (tried in order when its node is gone)."""
    count = len(nodes)
    order = [sa.make_url(nodes[(index + k) % count]) for k in range(count)]
    url = order[0]
    if count > 1:
        alternates = ",".join(f"{u.host}:{u.port}" for u in order[1:])
        url = url.update_query_dict({"failover": alternates})
    return url.render_as_string(hide_password=False)


__all__ = ["node_url", "nodes_problem"]
