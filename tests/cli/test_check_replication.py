"""`agboss-sql check` on replication: a PostgreSQL primary with no synchronous standby is a
warning (a failover could lose a granted lease epoch), refused with `--require-sync`
(exit 1, NOT ready); a standby is NOT ready; `--require-sync` elsewhere is a misused
option (exit 2). What each server state prints is shown on `Replication` itself; a real
primary and standby pair (dialects/postgresql/replica.sh) runs in tox -e failover."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agboss_sql.cli import main
from agboss_sql.cli._replication import Replication, replication_of


def _replication(**given: object) -> Replication:
    facts: dict[str, object] = {
        "in_recovery": False,
        "standby_names": "",
        "synchronous_commit": "on",
        "standbys": (),
        "several_hosts": True,
        "read_write_only": True,
        **given,
    }
    return Replication(**facts)  # type: ignore[arg-type]


def test_only_a_primary_with_a_synchronous_standby_and_commit_is_safe() -> None:
    sync = (("standby1", "streaming", "sync"),)
    assert _replication(standby_names="standby1", standbys=sync).safe
    for unsafe in (
        _replication(),
        _replication(standbys=(("standby1", "streaming", "async"),)),
        _replication(standby_names="standby1", standbys=sync, synchronous_commit="local"),
        _replication(standby_names="standby1"),
        _replication(standby_names="standby1", standbys=sync, in_recovery=True),
    ):
        assert not unsafe.safe, unsafe
        assert unsafe.lines()[0].startswith(("replication: WARNING", "replication: this server"))


def test_each_unsafe_state_names_its_cause() -> None:
    said = {
        "alone": _replication().lines()[0],
        "async": _replication(standbys=(("s1", "streaming", "async"),)).lines()[0],
        "local": _replication(
            standby_names="s1", standbys=(("s1", "streaming", "sync"),), synchronous_commit="local"
        ).lines()[0],
        "waiting": _replication(standby_names="s1").lines()[0],
        "standby": _replication(in_recovery=True).lines()[0],
    }
    assert "no standby" in said["alone"]
    assert "asynchronous standby s1 (async)" in said["async"] and "twice" in said["async"]
    assert "synchronous_commit=local" in said["local"]
    assert "no standby streams in sync" in said["waiting"]
    assert "StoreReadOnlyError" in said["standby"]
    one_server = _replication(
        standbys=(("s1", "streaming", "sync"),), standby_names="s1", several_hosts=False
    )
    assert "target_session_attrs=read-write" in one_server.lines()[-1]


def test_check_warns_on_a_lone_primary_and_require_sync_refuses_it(
    sql_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = sa.make_url(sql_url).get_backend_name()
    if backend != "postgresql":
        assert main(["check", "--url", sql_url, "--require-sync"]) == 2
        assert "--require-sync checks PostgreSQL" in capsys.readouterr().err
        return
    found = replication_of(sql_url)
    assert found is not None
    if found.safe:
        pytest.skip("the server under test has a synchronous standby")
    assert main(["check", "--url", sql_url]) == 0
    out = capsys.readouterr().out
    assert "replication: WARNING" in out and out.rstrip().endswith("ready")
    assert main(["check", "--url", sql_url, "--require-sync"]) == 1
    out = capsys.readouterr().out
    assert "replication: refused (--require-sync)" in out
    assert out.rstrip().endswith("NOT ready")
