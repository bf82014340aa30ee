"""`MIN_MAX_ALLOWED_PACKET` (docs/limits.md): a MySQL/MariaDB server that takes smaller
statements is refused at connect, typed, by the stores' async connections and by the saver's
sync ones; at the limit it is served, and a statement carrying a payload at its limit, as
the driver escapes it, fits.

The server is a private MariaDB, started here on a scratch data directory (the shared test
servers' settings are never changed); skipped where `mariadbd` is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agboss_sql.contracts.errors import ServerSettingError
from agboss_sql.contracts.limits import MAX_PAYLOAD_BYTES, MIN_MAX_ALLOWED_PACKET
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection

START_S = 30
"""Bound on the private server's start (its data directory is made in well under 1 s)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def private_mariadb(tmp_path: Path, packet: int) -> AsyncIterator[str]:
    """The URL of a MariaDB started with `max_allowed_packet = packet`, stopped after."""
    server, install = shutil.which("mariadbd"), shutil.which("mariadb-install-db")
    if server is None or install is None:
        pytest.skip("no MariaDB server installed here to start a private one")
    data = tmp_path / "data"
    subprocess.run(
        [install, "--no-defaults", f"--datadir={data}", "--skip-test-db"],
        check=True,
        capture_output=True,
        timeout=START_S,
    )
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        server,
        "--no-defaults",
        "--user=root",
        f"--datadir={data}",
        f"--socket={tmp_path / 'sock'}",
        f"--port={port}",
        "--bind-address=127.0.0.1",
        f"--max-allowed-packet={packet}",
        "--skip-log-bin",
        "--innodb-buffer-pool-size=16M",
        "--skip-grant-tables",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        async with asyncio.timeout(START_S):
            while b"ready for connections" not in await process.stderr.readline():
                assert process.returncode is None, "the private server stopped"
        yield f"mysql://root@127.0.0.1:{port}/mysql"
    finally:
        process.kill()  # a scratch server: nothing of it is kept
        async with asyncio.timeout(START_S):
            await process.wait()


async def test_a_server_under_the_packet_limit_is_refused_at_connect_and_served_at_it(
    tmp_path: Path,
) -> None:
    below = MIN_MAX_ALLOWED_PACKET - 1024  # whole KiB: the server rounds to them
    async with private_mariadb(tmp_path, below) as url:
        connection = SqlConnection(url)
        try:
            with pytest.raises(ServerSettingError) as refused:
                await connection.ping()
            assert (refused.value.setting, refused.value.value) == ("max_allowed_packet", below)
            assert refused.value.required == MIN_MAX_ALLOWED_PACKET
            assert refused.value.facts["limit"] == "MIN_MAX_ALLOWED_PACKET"
            # The saver's sync connections ask the same.
            saver = SqlCheckpointSaver(connection)
            with pytest.raises(ServerSettingError):
                await asyncio.to_thread(
                    saver.get_tuple, {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
                )
        finally:
            await connection.close()

        # Raised to the limit (the private server's own setting; new sessions read it).
        admin = await asyncio.to_thread(_admin, url)
        try:
            await asyncio.to_thread(
                _run, admin, f"SET GLOBAL max_allowed_packet = {MIN_MAX_ALLOWED_PACKET}"
            )
        finally:
            admin.close()
        connection = SqlConnection(url)
        try:
            # A JSON text of quotes: every byte of it escaped by the driver, twice its size.
            text = json.dumps('"' * ((MAX_PAYLOAD_BYTES - 2) // 2))
            assert len(text) == MAX_PAYLOAD_BYTES
            result = await connection.execute(sa.text("SELECT LENGTH(:text)"), {"text": text})
            assert result.scalar() == MAX_PAYLOAD_BYTES
        finally:
            await connection.close()


def _admin(url: str) -> Any:
    import pymysql

    parsed = sa.make_url(url)
    return pymysql.connect(host=parsed.host, port=parsed.port, user="root", password="")


def _run(raw: Any, statement: str) -> None:
    with raw.cursor() as cursor:
        cursor.execute(statement)
