"""A database server lost during a test run stops the run with one line
(`tests/support/server_watch.py`), checked by its port, at the start and after a
failed test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.ports import closed_port
from support.server_watch import server_of, unanswered

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import os, socket, sys
sys.path.insert(0, {str(TESTS)!r})
from support.server_watch import (
    pytest_collection_finish, pytest_runtest_logreport, pytest_sessionstart,
)

def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker("database")

# A listening socket stands for the database server; a test closes it.
SERVER = socket.socket()
SERVER.bind(("127.0.0.1", 0))
SERVER.listen()
if os.environ.get("WATCH_SERVER") == "listening":
    os.environ["AGBOSS_TEST_DATABASE_URL"] = (
        f"postgresql://u@127.0.0.1:{{SERVER.getsockname()[1]}}/db"
    )
"""

TESTS_FILE = """
import conftest

def test_1_passes():
    pass

def test_2_the_server_goes_away():
    conftest.SERVER.close()
    raise ConnectionRefusedError("connection refused")

def test_3_never_runs():
    raise AssertionError("ran after the server went away")

def test_4_never_runs():
    raise AssertionError("ran after the server went away")
"""


def run_pytest(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_watched.py").write_text(TESTS_FILE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AGBOSS_TEST_DATABASE_URL"}
    return env | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def test_a_server_lost_mid_run_stops_the_run_with_one_line(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, base_env() | {"WATCH_SERVER": "listening"})

    assert done.returncode != 0
    out = done.stdout
    assert "1 failed, 1 passed" in out, out
    assert "never_runs" not in out.split("short test summary")[-1], out
    assert "the database server at 127.0.0.1:" in out
    assert "does not answer during the run (Connection refused): stopping here" in out


def test_a_server_down_at_the_start_stops_before_any_test(tmp_path: Path) -> None:
    port = closed_port()
    env = base_env() | {"AGBOSS_TEST_DATABASE_URL": f"mysql://root@127.0.0.1:{port}/db"}

    done = run_pytest(tmp_path, env)

    assert done.returncode == 3
    assert (
        f"the database server at 127.0.0.1:{port} does not answer at the start of the run "
        "(Connection refused)" in done.stdout + done.stderr
    )
    assert "passed" not in done.stdout


def test_the_probe_reads_the_server_from_the_url() -> None:
    assert server_of("sqlite:////tmp/x.sqlite") is None
    assert server_of(None) is None
    assert server_of("postgresql://u@db.example/x") == ("db.example", 5432)
    assert server_of("mysql://root@127.0.0.1:3307/x") == ("127.0.0.1", 3307)
    assert unanswered(("127.0.0.1", closed_port())) == "Connection refused"
