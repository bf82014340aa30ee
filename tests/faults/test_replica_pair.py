"""On a real PostgreSQL primary and standby (dialects/postgresql/replica.sh; tox -e failover
sets AGBOSS_REPLICA_TESTS=1, skipped elsewhere): `check` says whether the standby is
synchronous and `--require-sync` refuses an asynchronous one; a write sent to the standby
itself is `StoreReadOnlyError`, while the URL naming both servers reaches the primary."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from agboss_sql.cli import main
from agboss_sql.contracts import ApplicationContext, StoreClock, StoreReadOnlyError
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.migrate import upgrade

SCRIPT = Path(__file__).resolve().parents[2] / "dialects" / "postgresql" / "replica.sh"
BOUND_S = 180

pytestmark = pytest.mark.skipif(
    os.environ.get("AGBOSS_REPLICA_TESTS") != "1",
    reason="needs a local primary and standby (tox -e failover sets AGBOSS_REPLICA_TESTS=1)",
)


@pytest.fixture(params=["sync", "async"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The URL naming both servers, and the mode, of a fresh pair (stopped after). Its
    directory is one the postgres user can reach (pytest's are the caller's only)."""
    where = Path(tempfile.mkdtemp(prefix="agboss-replica-"))
    where.chmod(0o755)
    env = {**os.environ, "AGBOSS_REPLICA_DIR": str(where / "pair")}
    mode = ["--async"] if request.param == "async" else []
    made = subprocess.run(
        ["bash", str(SCRIPT), "start", *mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    try:
        assert made.returncode == 0, made.stderr
        url = made.stdout.strip()
        upgrade(url)
        yield url, request.param
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, timeout=BOUND_S)
        shutil.rmtree(where, ignore_errors=True)


def _standby_url(url: str) -> str:
    parsed = sa.make_url(url)
    standby = parsed.query["host"][1]
    host, _, port = standby.partition(":")
    return parsed.set(host=host, port=int(port), query={}).render_as_string(hide_password=False)


def test_check_names_the_replication_and_require_sync_refuses_async(
    pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, mode = pair
    expected = 0 if mode == "sync" else 1
    assert main(["check", "--url", url, "--require-sync"]) == expected
    out = capsys.readouterr().out
    if mode == "sync":
        assert "replication: synchronous standby standby1 (synchronous_commit=on)" in out
        assert out.rstrip().endswith("ready")
    else:
        assert "replication: WARNING: asynchronous standby standby1 (async)" in out
        assert out.rstrip().endswith("NOT ready")


def test_a_write_to_the_standby_is_read_only_and_the_pair_url_reaches_the_primary(
    pair: tuple[str, str],
) -> None:
    url, _ = pair

    async def take(target: str, execution: str) -> None:
        connection = SqlConnection(target)
        try:
            leases = SqlExecutionLeaseRepository(
                connection, StoreClock(), ApplicationContext("instance-1")
            )
            assert await leases.acquire("tenant", execution, 60_000) is not None
        finally:
            await connection.close()

    asyncio.run(take(url, "on-the-primary"))
    with pytest.raises(StoreReadOnlyError, match="read-only"):
        asyncio.run(take(_standby_url(url), "on-the-standby"))
