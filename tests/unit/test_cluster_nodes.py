"""A cluster of database nodes (Galera): `agboss-sql cluster --url` takes each node, the
workers are spread over them, and each worker's URL lists the next nodes as its `failover`
alternates, which the MySQL dialect reads; synchronous tools connect to the first node."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agboss_sql._dialects import mysql
from agboss_sql.cli import MISUSED, main
from agboss_sql.cli._common import CommandFailed
from agboss_sql.cli._lab import _cluster_nodes
from agboss_sql.lab.workload import ClusterConfig, node_url, nodes_problem
from agboss_sql.sql.migrate import sync_url

NODES = (
    "mysql://root@127.0.0.1:3311/db",
    "mysql://root@127.0.0.1:3312/db",
    "mysql://root@127.0.0.1:3313/db",
)


def test_each_worker_starts_on_its_node_and_fails_over_to_the_next_ones() -> None:
    urls = [sa.make_url(node_url(NODES, index)) for index in range(4)]
    assert [u.port for u in urls] == [3311, 3312, 3313, 3311]
    assert [u.query["failover"] for u in urls] == [
        "127.0.0.1:3312,127.0.0.1:3313",
        "127.0.0.1:3313,127.0.0.1:3311",
        "127.0.0.1:3311,127.0.0.1:3312",
        "127.0.0.1:3312,127.0.0.1:3313",
    ]
    assert [mysql.nodes_of(u) for u in urls][1] == [
        ("127.0.0.1", 3312),
        ("127.0.0.1", 3313),
        ("127.0.0.1", 3311),
    ]


def test_a_password_survives_in_the_workers_urls() -> None:
    nodes = [n.replace("root@", "root:s%40cret@") for n in NODES]
    assert sa.make_url(node_url(nodes, 1)).password == "s@cret"


def test_the_dialect_reads_alternates_and_refuses_a_malformed_one() -> None:
    url = sa.make_url("mysql://root@a:1/db?failover=b:2, c:3,a:1")
    assert mysql.nodes_of(url) == [("a", 1), ("b", 2), ("c", 3)]
    assert mysql.nodes_of(sa.make_url("mysql://root@a/db")) == [("a", 3306)]
    with pytest.raises(ValueError, match="failover node 'b' is not host:port"):
        mysql.nodes_of(sa.make_url("mysql://root@a:1/db?failover=b"))


def test_a_synchronous_driver_gets_the_first_node_alone() -> None:
    url = sync_url("mysql://root@a:1/db?failover=b:2,c:3&charset=utf8mb4")
    assert (url.drivername, url.host, url.port) == ("mysql+pymysql", "a", 1)
    assert dict(url.query) == {"charset": "utf8mb4"}


def test_the_command_splits_node_lists_but_not_a_urls_own_commas() -> None:
    assert _cluster_nodes([",".join(NODES)]) == list(NODES)
    assert _cluster_nodes([NODES[0], f"{NODES[1]}, {NODES[2]}"]) == list(NODES)
    own = "mysql://root@127.0.0.1:3311/db?failover=127.0.0.1:3312,127.0.0.1:3313"
    assert _cluster_nodes([own]) == [own]
    assert _cluster_nodes(None) == []


@pytest.mark.parametrize(
    ("nodes", "problem"),
    [
        (
            ["postgresql://u@h:5432/db", "postgresql://u@h:5433/db"],
            "a list of database nodes is for MySQL/MariaDB clusters (Galera), not postgresql",
        ),
        ([NODES[0], "mysql://root@127.0.0.1/db"], "give each node's host and port"),
        ([NODES[0], "mysql://root@127.0.0.1:3312/other"], "the first one's user, password"),
        ([NODES[0], NODES[0]], "node 127.0.0.1:3311 is given twice"),
    ],
)
def test_a_list_that_cannot_be_one_cluster_is_refused(nodes: list[str], problem: str) -> None:
    found = nodes_problem(nodes)
    assert found is not None and problem in found
    with pytest.raises(CommandFailed) as refused:
        _cluster_nodes(nodes)
    assert refused.value.status == MISUSED
    with pytest.raises(ValueError, match=r"MySQL|host and port|first one|twice"):
        ClusterConfig(url=nodes[0], nodes=tuple(nodes), chaos=False)


def test_the_command_refuses_a_postgresql_node_list_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["cluster", "--url", "postgresql://u@h:5432/db,postgresql://u@h:5433/db"])
    err = capsys.readouterr().err
    assert status == MISUSED
    assert err.startswith("agboss-sql cluster: --url: a list of database nodes is for MySQL")
    assert len(err.splitlines()) == 1


def test_the_config_takes_its_url_as_the_first_node() -> None:
    config = ClusterConfig(url=NODES[0], nodes=NODES)
    assert config.nodes == NODES
    with pytest.raises(ValueError, match="url must be the first node"):
        ClusterConfig(url=NODES[1], nodes=NODES)
