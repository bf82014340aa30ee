"""The operator commands on each database: demo, check, leases, bench, cluster."""

from __future__ import annotations

import json

import pytest

from agboss_sql.cli import main, shown
from agboss_sql.sql import migrate


def test_demo_keeps_both_promises(empty_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--url", empty_url]) == 0
    out = capsys.readouterr().out
    assert "took" in out and "over at epoch 2 (from pod-a at 1)" in out
    assert "(replayed: True)" in out
    assert "charges again at epoch 1: refused (superseded)" in out
    assert "charges committed for" in out and ": 1\n" in out
    assert out.rstrip().endswith("one owner at a time, one effect per key: held")

    assert main(["leases", "--url", empty_url, "--limit", "10"]) == 0
    log = capsys.readouterr().out
    assert "taken-over from pod-a@1" in log
    assert "pod-a epoch 1 lost (superseded)" in log


def test_check_says_what_to_run_when_the_schema_is_behind(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--url", empty_url]) == 1
    out = capsys.readouterr().out
    head = migrate.head()
    assert (
        f"schema: base (no schema), head is {head}: run `agboss-sql upgrade --url {shown(empty_url)}`"
        in out
    )
    assert out.rstrip().endswith("NOT ready")

    assert main(["upgrade", "--url", empty_url]) == 0
    capsys.readouterr()
    assert main(["check", "--url", empty_url]) == 0
    out = capsys.readouterr().out
    assert f"schema: {head} (head)" in out
    assert "readiness: up" in out and "SqlFencedEffectRepository): up" in out
    assert "clock skew: the database's clock is" in out
    assert out.rstrip().endswith("ready")


def test_bench_runs_ours_beside_the_raw_driver(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--url", empty_url, "--ops", "20", "--runs", "1", "--only", "lease.acquire"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert {line["impl"] for line in lines} == {"raw", "agboss"}
    ours = next(line for line in lines if line["impl"] == "agboss")
    assert ours["statements_per_op"] <= 2.0 and ours["ratio"] > 0  # two on MySQL 8 only
    assert "lease.acquire" in out and "verdict" in out


def test_cluster_migrates_runs_and_reports_as_json(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The smallest cluster: two workers, no chaos; the chaos runs in the runtime tests.
    args = ["cluster", "--url", empty_url, "--json", "--workers", "2", "--trees", "3"]
    args += ["--depth", "1", "--pause-every", "3", "--no-chaos", "--lease-ms", "3000"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True, report["violations"]
    assert report["runs"] == {"succeeded": 3}
    assert report["workload"] == "tree"
    assert report["children_finished"] == 6
    assert report["pauses_answered"] == 1
    assert report["violations"] == []
