"""Each failure an operator meets with `agboss-sql`, as they meet it, answered by one line
and the right exit status: misused options (2), a SQLite file that cannot be written or
read, a worker whose database does not answer (one line per try, then 1), Ctrl-C on a
worker (130), a cluster whose worker cannot start, a MySQL/MariaDB database not collated
`utf8mb4_bin`; and `--version`, and the defaults `--help` gives.

Real processes where the process matters (the worker's retries and its signal, the
cluster's workers, a read-only mount); the others run `main(argv)` in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from migration_support import table_names
from sqlalchemy.engine import make_url
from support.capabilities import proxied_network_path
from support.sql import server_admin
from test_cli_failures import (
    cli,
    closed_port,
    env_without_database_url,
    migrate_revisions,
    one_line,
)

from agboss_sql.cli import (
    FAILED,
    INTERRUPTED,
    MISUSED,
    SUBCOMMANDS,
    WORKER_SETTINGS,
    main,
    parser,
    shown,
)
from agboss_sql.lab.faults.proxy import ProxyControl
from agboss_sql.sql import migrate

SCRIPTS = Path(sys.executable).parent
AGBOSS_SQL = str(SCRIPTS / "agboss-sql")
APP = "agboss_sql.lab.tree_app:app"


def run(
    *argv: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`agboss-sql argv` as a process of its own, without `AGBOSS_DATABASE_URL`."""
    return subprocess.run(
        [AGBOSS_SQL, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env_without_database_url(),
        cwd=cwd,
    )


# --- --version and --help -----------------------------------------------------------------


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    from agboss_sql import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])

    assert exited.value.code == 0
    assert capsys.readouterr().out == f"agboss-sql {__version__}\n"


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_help_gives_every_default(command: str) -> None:
    top = parser()
    subparsers = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    sub = subparsers.choices[command]
    text = " ".join(sub.format_help().split())

    for action in sub._actions:
        if not action.option_strings or action.default in (None, False, True, argparse.SUPPRESS):
            continue
        assert f"default: {action.default}" in text, (command, action.option_strings, text)


# --- misused options: exit 2, the option named ------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["cluster", "--workers", "1"],
            "--workers 1 is too few for the chaos (one worker killed, one frozen, one left "
            "sane): give --workers 3 or more, or add --no-chaos",
        ),
        (
            ["cluster", "--url", "sqlite:///:memory:", "--no-chaos"],
            "sqlite:///:memory: is a database of one process: the workers are processes of "
            "their own and must share one database: give a file (--url "
            "sqlite:///.agboss/cluster.sqlite) or a server",
        ),
        (["cluster", "--trees", "0"], "--trees must be at least 1, got 0"),
        (["cluster", "--timeout", "0"], "--timeout must be above 0 s, got 0"),
        (
            ["cluster", "--workload", "no_such_workload:workload"],
            "--workload 'no_such_workload:workload': no module 'no_such_workload' (run from "
            "the directory that holds it, or put it on PYTHONPATH)",
        ),
        (["bench", "--ops", "0"], "--ops must be at least 1, got 0"),
        (["bench", "--runs", "0"], "--runs must be at least 1, got 0"),
        (
            ["bench", "--scale", "1000,abc"],
            "--scale 'abc': each size must be a power of ten of at least 10 (e.g. --scale "
            "1000,100000)",
        ),
        (["faults", "--pods", "1"], "--pods must be at least 2, got 1"),
        (["faults", "--repeat", "0"], "--repeat must be at least 1, got 0"),
        (
            ["faults", "--stores", "no_such_stores:factory"],
            "--stores 'no_such_stores:factory': cannot import 'no_such_stores' (No module "
            "named 'no_such_stores'): run from the directory that holds it, or put it on "
            "PYTHONPATH",
        ),
        (
            ["worker", "--app", APP, "--lease-ms", "0"],
            "--lease-ms must be a positive integer, got 0",
        ),
        (
            ["worker", "--app", APP, "--start-timeout", "0"],
            "--start-timeout must be above 0 s, got 0",
        ),
    ],
)
def test_a_misused_option_exits_2_naming_it(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'agboss.sqlite'}"
    if "--url" not in argv:
        argv = [*argv, "--url", url]

    status, _, err = cli(capsys, *argv)

    assert status == MISUSED
    assert one_line(err, argv[0]) == line
    assert not (tmp_path / "db").exists()


def test_bench_only_an_unknown_operation_lists_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = cli(
        capsys, "bench", "--only", "lease.take", "--url", f"sqlite:///{tmp_path / 'b.sqlite'}"
    )

    assert status == MISUSED
    line = one_line(err, "bench")
    assert line.startswith("--only lease.take: no such operation; the operations are ")
    assert "lease.acquire" in line


def test_a_network_scenario_on_sqlite_says_where_it_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'f.sqlite'}"

    status, _, err = cli(capsys, "faults", "--scenario", "net-drop", "--url", url)

    assert status == MISUSED
    assert one_line(err, "faults") == (
        "net-drop cut(s) the network between a pod and its database server: it runs on "
        "postgresql, mysql, not on sqlite, whose database is a file (see `agboss-sql faults "
        "--list`)"
    )


@pytest.mark.parametrize("command", ["upgrade", "stamp"])
def test_a_revision_that_does_not_exist_points_to_history(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "r.sqlite"

    status, _, err = cli(capsys, command, "--revision", "0005", "--url", f"sqlite:///{path}")

    assert status == MISUSED
    assert one_line(err, command) == (
        "--revision '0005' is no revision of the agboss schema: `agboss-sql history` lists "
        f"them (the newest is {migrate.head()}; give its full id, or `head`)"
    )
    assert not path.exists()


def test_an_unreadable_worker_config_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "worker.json"

    status, _, err = cli(capsys, "worker", "--app", APP, "--config", str(missing))

    assert status == MISUSED
    line = one_line(err, "worker")
    assert line.startswith(f"cannot read --config {missing}: ")
    assert line.endswith(f"give a JSON file of worker settings ({', '.join(WORKER_SETTINGS)})")
    assert "start_timeout" in WORKER_SETTINGS and "down_timeout" in WORKER_SETTINGS


# --- a SQLite file that cannot be written ----------------------------------------------


WRITERS = [
    ["upgrade"],
    ["stamp"],
    ["demo"],
    ["bench"],
    ["faults", "--scenario", "zombie"],
    ["cluster", "--no-chaos", "--workers", "2", "--no-live"],
    ["worker", "--app", APP],
]


@pytest.mark.parametrize("argv", WRITERS, ids=lambda argv: argv[0])
def test_a_file_where_the_directory_must_be_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("not a directory")
    path = blocker / "agboss.sqlite"

    status, _, err = cli(capsys, *argv, "--url", f"sqlite:///{path}")

    assert status == FAILED
    assert one_line(err, argv[0]) == (
        f"{blocker} is a file, not a directory, so {path} cannot be made: use a path in a "
        "writable directory, e.g. --url sqlite:///.agboss/agboss.sqlite"
    )
    assert blocker.read_text() == "not a directory"


def test_faults_makes_the_directory_of_its_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "faults.sqlite"

    # The cheapest scenario, once, on fast clocks: it runs on the file, so the file's
    # directory was made. Whether the scenario holds on a loaded machine at fifty times
    # speed is the fault suite's own tests' to say; this one asks only for the directory.
    done = run(
        "faults",
        *("--scenario", "sigterm", "--pods", "2", "--time-scale", "50"),
        *("--url", f"sqlite:///{path}"),
        timeout=180,
    )

    assert "unable to open" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert path.exists()
    assert "sigterm" in done.stdout, done.stdout + done.stderr


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A directory holding a migrated SQLite file, and the command prefix that runs a
    process to which that directory is read-only: a read-only bind mount in a mount
    namespace of its own when run as root (permissions do not stop root), else the
    directory's write permission removed."""
    folder = tmp_path / "ro"
    folder.mkdir()
    migrate.upgrade(f"sqlite:///{folder / 'agboss.sqlite'}")
    for leftover in folder.glob("agboss.sqlite-*"):
        leftover.unlink()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield folder, []
        finally:
            folder.chmod(0o755)
        return
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("run as root without unshare(1): no way to make a directory read-only")
    probe = subprocess.run(
        [unshare, "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && ! touch "$0/x"', str(folder)],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"no read-only bind mount here: {probe.stderr.decode().strip()}")
    yield (
        folder,
        [unshare, "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder)],
    )


def run_read_only(prefix: list[str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, AGBOSS_SQL, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_without_database_url(),
    )


def test_a_read_only_directory_is_one_line(read_only_dir: tuple[Path, list[str]]) -> None:
    folder, prefix = read_only_dir
    existing, new = folder / "agboss.sqlite", folder / "sub" / "new.sqlite"
    fix = "use a path in a writable directory, e.g. --url sqlite:///.agboss/agboss.sqlite, or copy the file to one"
    why = f"its directory {folder} is read-only (SQLite writes the file and its -wal and -shm files beside it, even to read)"

    for command, path, verb in (
        ("upgrade", new, "write"),
        ("check", existing, "read"),
    ):
        done = run_read_only(prefix, command, "--url", f"sqlite:///{path}")
        assert done.returncode == FAILED, (command, done.stdout, done.stderr)
        assert one_line(done.stderr, command) == f"cannot {verb} {path}: {why}: {fix}"

    # What needs no journal reads the file as it is.
    done = run_read_only(prefix, "current", "--url", f"sqlite:///{existing}")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sqlite:///{existing}: {migrate.head()} (up to date)\n"


# --- the worker ------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["postgresql://postgres@", "mysql://root@"])
def test_a_worker_with_nothing_listening_retries_then_exits_1(scheme: str) -> None:
    port = closed_port()

    done = run(
        "worker",
        "--app",
        APP,
        "--events",
        "--start-timeout",
        "2",
        "--url",
        f"{scheme}127.0.0.1:{port}/nothing",
    )

    assert done.returncode == FAILED, done.stderr
    assert "Traceback" not in done.stderr
    *tries, last = done.stderr.splitlines()
    assert last.startswith(f"agboss-sql worker: nothing answers at 127.0.0.1:{port} ("), last
    assert last.endswith("): start the database server, or correct the host and port in the URL")
    # One line per try, each pause twice the one before (0.5 s, then 1 s, ...), but the last,
    # which is cut to what is left of --start-timeout (how much is left depends on how long
    # each try took, so only the schedule is asserted, not the times).
    assert len(tries) >= 2, done.stderr
    assert all("database not ready (readiness DOWN): " in line for line in tries), done.stderr
    pauses = [float(re.findall(r"trying again in ([0-9.]+) s", line)[0]) for line in tries]
    for index, pause in enumerate(pauses):
        planned = 0.5 * 2**index
        assert 0 < pause <= planned, pauses
        assert pause == planned or index == len(pauses) - 1, pauses
    events = [json.loads(line) for line in done.stdout.splitlines()]
    down = [e for e in events if e["kind"] == "readiness"]
    assert len(down) == len(tries) and {e["status"] for e in down} == {"DOWN"}
    assert not any(e["kind"] == "ready" for e in events)


def test_a_worker_on_a_database_behind_is_told_to_upgrade(empty_url: str) -> None:
    first = migrate_revisions()[0]
    migrate.upgrade(empty_url, first)

    done = run("worker", "--app", APP, "--start-timeout", "1", "--url", empty_url)

    assert done.returncode == FAILED, done.stderr
    assert "Traceback" not in done.stderr
    line = done.stderr.splitlines()[-1]
    assert line.startswith(
        "agboss-sql worker: [workflow.database-not-ready] the database did not become ready within 1 s: "
    )
    assert (
        f"is at revision {first}, behind {migrate.head()}: run `agboss-sql upgrade --url " in line
    )
    assert "stamp" not in done.stderr


def test_ctrl_c_stops_a_worker_with_130(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    worker = subprocess.Popen(
        [AGBOSS_SQL, "worker", "--app", APP, "--url", empty_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_without_database_url() | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        assert worker.stdout is not None
        first = worker.stdout.readline()
        assert " running " in first, first
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    assert worker.returncode == INTERRUPTED
    assert err == "agboss-sql worker: interrupted (Ctrl-C): stopped gracefully\n"


@pytest.fixture
def proxy_to(empty_url: str) -> Iterator[tuple[str, ProxyControl]]:
    """The database under test, migrated, behind a TCP proxy process: the URL through it
    and the proxy's control (skipped for an embedded database: no network to cut)."""
    if not proxied_network_path(empty_url):
        pytest.skip("an embedded database has no network path to cut")
    migrate.upgrade(empty_url)
    proxy = subprocess.Popen(
        [sys.executable, "-m", "agboss_sql.lab.faults.proxy", "--url", empty_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        told = json.loads(proxy.stdout.readline())
        yield told["url"], ProxyControl(told["control_port"])
    finally:
        assert proxy.stdin is not None
        proxy.stdin.close()
        proxy.wait(timeout=30)


def test_a_running_worker_whose_database_goes_away_says_so_then_exits_1(
    proxy_to: tuple[str, ProxyControl],
) -> None:
    url, control = proxy_to
    # A lease of 3 s: the database is asked every second. Down 6 s on end: the worker stops.
    worker = subprocess.Popen(
        [
            *(AGBOSS_SQL, "worker", "--app", APP, "--events", "--lease-ms", "3000"),
            *("--down-timeout", "6", "--shutdown-ms", "2000", "--url", url),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_without_database_url(),
    )
    seen: list[str] = []
    try:
        assert worker.stdout is not None
        for line in worker.stdout:
            if json.loads(line)["kind"] == "ready":
                break
        control.drop()  # every connection reset, every new one refused
        for line in worker.stdout:
            event = json.loads(line)
            if event["kind"] != "readiness":
                continue
            seen.append(event["status"])
            if seen == ["DOWN", "DOWN"]:
                control.pass_through()  # back after two tries
            elif seen[-1] == "UP":
                control.drop()  # and gone again, for good
        _, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    assert seen[:3] == ["DOWN", "DOWN", "UP"] and set(seen[3:]) == {"DOWN"}, seen
    assert worker.returncode == FAILED, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert sum("database not answering (readiness DOWN) for " in line for line in lines) == (
        len(seen) - 1
    ), err
    assert any("database answers again (readiness UP) after " in line for line in lines), err
    # The cause as the driver tells it: a refused connection is named as such.
    assert lines[-1].startswith(
        (
            "agboss-sql worker: [workflow.database-not-ready] the database did not answer for "
            "6 s while the worker ran (it stopped; its leases expire for others to take over): ",
            "agboss-sql worker: the database stopped answering for 6 s (--down-timeout) while "
            "the worker ran, so it stopped: nothing answers at 127.0.0.1:",
        )
    ), err


# --- check -------------------------------------------------------------------------------


def test_check_on_a_database_without_the_schema_lists_no_store_up(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with migrate.connect(empty_url) as connection, connection.begin():
        connection.exec_driver_sql("CREATE TABLE unrelated (x INTEGER)")

    status, out, _ = cli(capsys, "check", "--url", empty_url)

    assert status == FAILED
    assert "stores: not checked: the database has no agboss schema" in out
    assert " up in " not in out
    assert out.rstrip().endswith("NOT ready")
    assert table_names(empty_url) == {"unrelated"}


# --- the cluster's workers ----------------------------------------------------------------


def test_a_cluster_whose_worker_cannot_start_fails_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_workload.py").write_text(
        "from agboss_sql.lab.workload import ClusterRun, ClusterWorkload\n"
        "workload = ClusterWorkload(name='broken', app='no_such_module:app',\n"
        "    runs=lambda config, run_id: [ClusterRun('tree', {}, f'r-{run_id}')])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    url = f"sqlite:///{tmp_path / 'cluster.sqlite'}"

    status, _, err = cli(
        capsys,
        "cluster",
        "--url",
        url,
        "--workload",
        "broken_workload:workload",
        "--no-chaos",
        "--workers",
        "2",
        "--no-live",
    )

    assert status == FAILED
    assert one_line(err, "cluster") == (
        "worker w1 exited before it was ready: [workflow.app-load] --app 'no_such_module:app': "
        "no module 'no_such_module' (run from the directory that holds it, or put it on "
        "PYTHONPATH)"
    )


def test_a_cluster_honours_its_timeout_while_a_worker_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's app blocks as it is imported, as an app that dials a dead service might.
    (tmp_path / "stuck_app.py").write_text("import sys\nsys.stdin.read()\n")
    (tmp_path / "stuck_workload.py").write_text(
        "from agboss_sql.lab.workload import ClusterRun, ClusterWorkload\n"
        "workload = ClusterWorkload(name='stuck', app='stuck_app:app',\n"
        "    runs=lambda config, run_id: [ClusterRun('tree', {}, f'r-{run_id}')])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    url = f"sqlite:///{tmp_path / 'cluster.sqlite'}"

    status, _, err = cli(
        capsys,
        "cluster",
        "--url",
        url,
        "--workload",
        "stuck_workload:workload",
        "--no-chaos",
        "--workers",
        "2",
        "--no-live",
        "--timeout",
        "2",
    )

    assert status == FAILED
    assert one_line(err, "cluster") == (
        "worker w1 was not ready within 2 s (--timeout): (nothing on its standard error)"
    )


# --- MySQL/MariaDB: the collation ------------------------------------------------------


@pytest.fixture
def general_ci_url(scratch_url: str) -> Iterator[str]:
    """A database of the server under test made with a case-insensitive default collation
    (the server's usual default); skipped where text has no per-database collation."""
    if migrate.collation(scratch_url) is None:
        pytest.skip("only MySQL and MariaDB collate a database's text by a setting")
    url = make_url(scratch_url)
    name = f"{url.database}_ci"
    admin_url, quote, force = server_admin(migrate.sync_url(url))
    engine = sa.create_engine(admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")
        connection.exec_driver_sql(
            f"CREATE DATABASE {quote}{name}{quote} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
        )
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")
        engine.dispose()


def test_a_database_not_collated_utf8mb4_bin_is_refused_then_fixed(
    general_ci_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, name = general_ci_url, make_url(general_ci_url).database
    alter = f"ALTER DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"

    status, _, err = cli(capsys, "upgrade", "--url", url)
    assert status == FAILED
    assert one_line(err, "upgrade") == (
        f"{shown(url)}: database {name} is collated utf8mb4_general_ci, not utf8mb4_bin: "
        f"keys that differ only in case or accents would be one key: fix it with `{alter}`; "
        "or run anyway with --force"
    )
    assert table_names(url) == set()

    # Forced, the tables take the database's collation: check and demo say so.
    status, _, _ = cli(capsys, "upgrade", "--url", url, "--force")
    assert status == 0
    status, out, _ = cli(capsys, "check", "--url", url)
    assert status == FAILED
    assert "agboss table(s) have text columns collated utf8mb4_general_ci" in out
    fixes = [line.strip().rstrip(";") for line in out.splitlines() if line.startswith("  ALTER ")]
    assert fixes[0] == alter and len(fixes) > 1, out
    assert out.rstrip().endswith("NOT ready")
    status, _, err = cli(capsys, "demo", "--url", url)
    assert status == FAILED
    assert f"fix it with `{alter}` and {len(fixes) - 1} more" in one_line(err, "demo")

    # The statements check gave make it right.
    with migrate.connect(url) as connection:
        for statement in fixes:
            connection.exec_driver_sql(statement)
    status, out, _ = cli(capsys, "check", "--url", url)
    assert "collation: utf8mb4_bin (as required)" in out
    assert status == 0, out
