"""PostgreSQL URLs that name several servers (libpq's multi-host connection strings).

SQLAlchemy writes them as `postgresql://user@/db?host=h1:p1&host=h2:p2` (or
`?host=h1,h2&port=p1,p2`); libpq takes `host=h1,h2 port=p1,p2` and, with
`target_session_attrs=read-write`, connects to the first of them that accepts writes:
after a failover, the standby that was promoted.
"""

from __future__ import annotations

from sqlalchemy.engine import URL


def libpq_hosts(url: URL) -> dict[str, str] | None:
    """libpq's `host` and `port` for the servers `url` names in its query (`?host=…`), or
    `None` when it names its server the usual way (`user@host:port`). A server given
    without a port gets the URL's port, else 5432."""
    hosts = url.query.get("host")
    if not hosts:
        return None
    tokens = [hosts] if isinstance(hosts, str) else list(hosts)
    names: list[str] = []
    ports: list[str] = []
    for token in tokens:
        for one in token.split(","):
            name, _, port = one.partition(":") if one.count(":") == 1 else (one, "", "")
            names.append(name)
            ports.append(port)
    given = url.query.get("port")
    if given:
        listed = (given if isinstance(given, str) else ",".join(given)).split(",")
        if len(listed) == 1:
            listed = listed * len(names)
        if len(listed) != len(names):
            raise ValueError(
                f"the URL names {len(names)} hosts and {len(listed)} ports: give one port per "
                "host (?host=h1:p1&host=h2:p2, or ?host=h1,h2&port=p1,p2)"
            )
        ports = [port or listed[i] for i, port in enumerate(ports)]
    default = str(url.port or 5432)
    return {"host": ",".join(names), "port": ",".join(p or default for p in ports)}


def several_hosts(url: URL) -> bool:
    """`url` names more than one server."""
    found = libpq_hosts(url)
    return found is not None and "," in found["host"]


__all__ = ["libpq_hosts", "several_hosts"]
