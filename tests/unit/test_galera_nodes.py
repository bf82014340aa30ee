"""The node-loss harness's own pieces that need no cluster: which process it would signal
(only a server started with the node's own config file), how it reads the state transfer a
node received, and the pods' URLs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from agboss_sql.lab.faults.galera import GaleraNodes, NodeError, _last_transfer

URLS = [f"mysql://root@127.0.0.1:{port}/db" for port in (3311, 3312, 3313)]


def test_a_pid_file_naming_another_process_is_not_signalled(tmp_path: Path) -> None:
    nodes = GaleraNodes(URLS, directory=tmp_path)
    (tmp_path / "node2").mkdir()
    (tmp_path / "node2" / "mysqld.pid").write_text(str(os.getpid()))
    assert nodes.pid(2) is None
    assert nodes.pid(3) is None  # no pid file at all
    with pytest.raises(NodeError, match="node 2 runs no server of this cluster"):
        nodes.kill(2)


def test_the_last_start_tells_ist_from_sst(tmp_path: Path) -> None:
    nodes = GaleraNodes(URLS, directory=tmp_path)
    log = tmp_path / "node2" / "error.log"
    log.parent.mkdir()
    full = "Starting MariaDB\n\tLocal state: 00000000-0000-0000-0000-000000000000:-1\n"
    incremental = "Starting MariaDB\n\tLocal state: 2de9:9\nWSREP: IST received: 2de9:11\n"
    log.write_text(full + incremental)
    assert _last_transfer(nodes, 2) == "IST"
    log.write_text(incremental + full)
    assert _last_transfer(nodes, 2) == "SST"
    assert _last_transfer(nodes, 3) == "unknown"


def test_each_pod_starts_on_its_node_with_the_others_as_alternates() -> None:
    nodes = GaleraNodes(URLS)
    url = sa.make_url(nodes.url_with_failover(2))
    assert (url.port, url.query["failover"]) == (3312, "127.0.0.1:3313,127.0.0.1:3311")
    with pytest.raises(ValueError, match="give the 3 nodes' URLs"):
        GaleraNodes(URLS[:2])
