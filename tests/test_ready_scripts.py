"""The MySQL/MariaDB ready script checks its server by its port: a port where
something else listens is reported at once, and no server is started for it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

READY = Path(__file__).resolve().parents[1] / "dialects" / "mysql" / "ready.sh"


@pytest.mark.skipif(
    not (shutil.which("mysqladmin") or shutil.which("mariadb-admin")),
    reason="needs the MySQL/MariaDB client tools",
)
def test_a_port_held_by_something_else_is_reported_not_started_over(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = os.environ | {
            "AGBOSS_MYSQL_PORT": str(port),
            "AGBOSS_MYSQL_DB": "agboss_never_created",
            "AGBOSS_READY_TIMEOUT": "1",
            # Were it to start a server, this one would fail loudly instead.
            "AGBOSS_MYSQL_SERVER": str(tmp_path / "no-server"),
        }

        done = subprocess.run(
            ["bash", str(READY)], capture_output=True, text=True, timeout=60, env=env, check=False
        )

    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        f"mysql/ready.sh: ERROR: something listens on 127.0.0.1:{port} but does not answer "
        "as MySQL/MariaDB (mysqladmin ping failed): check what owns that port\n"
    )
