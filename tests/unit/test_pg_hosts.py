"""PostgreSQL URLs naming several servers reach libpq as its `host=h1,h2 port=p1,p2`, in
both of SQLAlchemy's spellings; a URL naming one server is unchanged."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agboss_sql._dialects import postgresql
from agboss_sql._dialects._pg_hosts import libpq_hosts, several_hosts
from agboss_sql._timeouts import Timeouts


def _libpq(url: str) -> dict[str, object]:
    args = postgresql.conninfo(sa.make_url(url), Timeouts())
    return {k: args[k] for k in ("host", "port", "dbname") if k in args} | {
        k: v for k, v in args.items() if k == "target_session_attrs"
    }


def test_repeated_hosts_with_ports_reach_libpq_as_lists() -> None:
    url = "postgresql://u@/db?host=10.0.0.1:5442&host=10.0.0.2:5443&target_session_attrs=read-write"
    assert _libpq(url) == {
        "host": "10.0.0.1,10.0.0.2",
        "port": "5442,5443",
        "dbname": "db",
        "target_session_attrs": "read-write",
    }
    assert several_hosts(sa.make_url(url))


def test_comma_lists_and_missing_ports() -> None:
    assert _libpq("postgresql://u@/db?host=a,b&port=1,2") == {
        "host": "a,b",
        "port": "1,2",
        "dbname": "db",
    }
    assert libpq_hosts(sa.make_url("postgresql://u@/db?host=a:7&host=b")) == {
        "host": "a,b",
        "port": "7,5432",
    }
    assert libpq_hosts(sa.make_url("postgresql://u@/db?host=a,b&port=6")) == {
        "host": "a,b",
        "port": "6,6",
    }


def test_one_server_is_unchanged() -> None:
    assert _libpq("postgresql://u@h:5/db") == {"host": "h", "port": 5, "dbname": "db"}
    assert not several_hosts(sa.make_url("postgresql://u@h:5/db"))
    assert libpq_hosts(sa.make_url("postgresql://u@h:5/db")) is None


def test_ports_that_do_not_match_the_hosts_are_refused() -> None:
    with pytest.raises(ValueError, match="3 hosts and 2 ports"):
        libpq_hosts(sa.make_url("postgresql://u@/db?host=a,b,c&port=1,2"))
