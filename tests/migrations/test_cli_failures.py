"""Every expected failure of the `agboss-sql` commands: one line on stderr saying what is
wrong and what to do, a non-zero exit, the traceback only with `--debug`; and the
read-only commands never create a database.

The tests that reach a database run on the database under test (a scratch database of
the migration tests); the others need no database at all.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from migration_support import connected, table_names
from sqlalchemy.engine import make_url
from support.capabilities import embedded_url
from support.ports import closed_port, silent_listener

from agboss_sql.cli import FAILED, INTERRUPTED, MISUSED, main, shown
from agboss_sql.sql import migrate
from agboss_sql.sql.schema import metadata

SCRIPTS = Path(sys.executable).parent
READ_ONLY = ("current", "check", "leases")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `agboss-sql argv` in this process: its exit status, stdout and stderr."""
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def one_line(err: str, command: str) -> str:
    """The single stderr line of a failed `command`, without its prefix."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefix = f"agboss-sql {command}: "
    assert lines[0].startswith(prefix), err
    assert "Traceback" not in err
    return lines[0][len(prefix) :]


def env_without_database_url() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != migrate.DATABASE_URL_ENV}


def absent_database(url: str, tmp_path: Path) -> str:
    """A URL of a database that does not exist, on the same server (or a missing file)."""
    parsed = make_url(url)
    if embedded_url(url):
        return f"sqlite:///{tmp_path / 'absent' / 'nothing.sqlite'}"
    return parsed.set(database=f"{parsed.database}_absent").render_as_string(hide_password=False)


# --- no database needed ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["upgrade", "stamp", "demo", "bench", "history", *READ_ONLY])
@pytest.mark.parametrize("scheme", ["postgresql://postgres@", "mysql://root@"])
def test_nothing_listening_is_one_line(
    command: str, scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closed_port()

    status, _, err = cli(capsys, command, "--url", f"{scheme}127.0.0.1:{port}/nothing")

    assert status == FAILED
    assert one_line(err, command) == (
        f"nothing answers at 127.0.0.1:{port} (connection refused): start the database "
        "server, or correct the host and port in the URL"
    )


@pytest.mark.parametrize(
    ("command", "scheme"), [("upgrade", "postgresql://postgres@"), ("current", "mysql://root@")]
)
def test_a_server_that_never_greets_ends_the_wait_at_the_connect_bound(
    command: str, scheme: str
) -> None:
    """A frozen server accepts the connection and never greets: the migration commands'
    wait ends at the default `Timeouts.connect_ms` (5 s; libpq counts whole seconds), one
    line saying so. Unbounded, the command would wait for ever: it runs in a process of its
    own, given a minute (room for a loaded machine) before the test fails."""
    with silent_listener() as port:
        done = subprocess.run(
            [str(SCRIPTS / "agboss-sql"), command, "--url", f"{scheme}127.0.0.1:{port}/frozen"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    assert done.returncode == FAILED
    assert one_line(done.stderr, command) == (
        f"127.0.0.1:{port} did not answer the connection within 5 s (Timeouts.connect_ms): a "
        "server that accepts it and never greets is frozen or overloaded; check it, or the "
        "host and port in the URL"
    )


@pytest.mark.parametrize("command", ["upgrade", "stamp", "demo", *READ_ONLY])
def test_a_file_path_as_url_is_told_to_write_sqlite(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = cli(capsys, command, "--url", "x.sqlite")

    assert status == FAILED
    assert one_line(err, command).startswith(
        "'x.sqlite' is not a database URL: for a SQLite file write sqlite:///x.sqlite"
    )


@pytest.mark.parametrize("command", ["history", *READ_ONLY])
def test_read_only_commands_create_no_sqlite_file(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "nowhere" / "agboss.sqlite"

    status, _, err = cli(capsys, command, "--url", f"sqlite:///{path}")

    assert status == FAILED
    assert one_line(err, command) == (
        f"no database at {path} (this command never creates one): "
        f"`agboss-sql upgrade --url sqlite:///{path}` creates and migrates it"
    )
    assert not path.parent.exists()


@pytest.mark.parametrize("command", READ_ONLY)
def test_read_only_commands_create_nothing_at_the_default_url(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv(migrate.DATABASE_URL_ENV, raising=False)
    monkeypatch.chdir(tmp_path)

    status, _, err = cli(capsys, command)

    assert status == FAILED
    assert one_line(err, command).startswith("no database at .agboss/agboss.sqlite")
    assert list(tmp_path.iterdir()) == []


def test_memory_url_is_printed_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    assert shown("sqlite:///:memory:") == "sqlite:///:memory:"

    status, out, _ = cli(capsys, "upgrade", "--url", "sqlite:///:memory:")

    assert status == 0
    assert out.startswith("upgraded sqlite:///:memory:: base (no schema) -> ")


def test_leases_refuses_tenant_without_execution(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = cli(capsys, "leases", "--tenant", "t", "--url", "sqlite:///unused.sqlite")
    assert status == MISUSED
    assert one_line(err, "leases").startswith("--tenant needs --execution")

    status, _, err = cli(capsys, "leases", "--execution", "e", "--url", "sqlite:///unused.sqlite")
    assert status == MISUSED
    assert one_line(err, "leases").startswith("--execution needs --tenant")
    assert not Path("unused.sqlite").exists()


def test_debug_adds_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/nothing"

    status, _, err = cli(capsys, "--debug", "current", "--url", url)
    after, _, err_after = cli(capsys, "current", "--url", url, "--debug")

    assert status == after == FAILED
    for text in (err, err_after):
        first, *rest = text.splitlines()
        assert first.startswith("agboss-sql current: nothing answers at")
        assert "Traceback (most recent call last):" in rest


@pytest.mark.parametrize(
    ("module", "scheme", "extra"),
    [("psycopg", "postgresql", "postgresql"), ("pymysql", "mysql", "mysql")],
)
def test_a_missing_driver_names_its_extra(
    module: str, scheme: str, extra: str, tmp_path: Path
) -> None:
    # A package of that name that fails to import, first on the path: the driver as a
    # base install (without the extra) lacks it.
    (tmp_path / module).mkdir()
    (tmp_path / module / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name={module!r})\n"
    )
    env = env_without_database_url()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH", "")) if p)
    for command in ("upgrade", "check", "leases"):
        done = subprocess.run(
            [str(SCRIPTS / "agboss-sql"), command, "--url", f"{scheme}://u@127.0.0.1:1/db"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        assert done.returncode == FAILED, done.stderr
        line = one_line(done.stderr, command)
        assert f"({module}) is not installed" in line
        assert f"`pip install '.[{extra}]'` in a checkout" in line


def test_ctrl_c_in_demo_is_one_line(tmp_path: Path) -> None:
    env = env_without_database_url() | {"PYTHONUNBUFFERED": "1"}
    demo = subprocess.Popen(
        [str(SCRIPTS / "agboss-sql"), "demo", "--url", f"sqlite:///{tmp_path / 'demo.sqlite'}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if "freezes" in line:  # the demo now waits for its lease to run out
                demo.send_signal(signal.SIGINT)
                break
        _, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()

    assert demo.returncode == INTERRUPTED
    assert err == "agboss-sql demo: interrupted (Ctrl-C)\n"


# --- on the database under test ----------------------------------------------------------


@pytest.mark.parametrize("command", ["history", "upgrade", "stamp", "demo", *READ_ONLY])
def test_a_missing_database_is_one_line(
    command: str, scratch_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = absent_database(scratch_url, tmp_path)

    if embedded_url(url) and command in ("upgrade", "stamp", "demo"):
        pytest.skip("these create a SQLite file: a missing one is no failure")
    status, _, err = cli(capsys, command, "--url", url)

    assert status == FAILED
    line = one_line(err, command)
    if embedded_url(url):
        assert line.startswith("no database at ")
        assert not (tmp_path / "absent").exists()
    else:
        name = make_url(url).database
        assert line.startswith(f"database '{name}' does not exist on 127.0.0.1:")
        assert line.endswith(f"then run `agboss-sql upgrade --url {shown(url)}`")


@pytest.mark.parametrize("command", ["current", "leases"])
def test_an_unmigrated_database_is_one_line(
    command: str, empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = cli(capsys, command, "--url", empty_url)

    assert status == FAILED
    assert one_line(err, command) == (
        f"{shown(empty_url)} has no agboss schema revision recorded: run "
        f"`agboss-sql upgrade --url {shown(empty_url)}` (or `agboss-sql stamp` to adopt "
        "tables made another way)"
    )
    assert table_names(empty_url) == set()


def test_a_database_behind_head_is_not_ready(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    head = migrate.head()
    first = next(iter(migrate_revisions()))
    assert first != head
    migrate.upgrade(empty_url, first)

    status, _, err = cli(capsys, "current", "--url", empty_url)
    assert status == FAILED
    assert one_line(err, "current") == (
        f"{shown(empty_url)} is at schema revision {first}, behind {head}: run "
        f"`agboss-sql upgrade --url {shown(empty_url)}`"
    )

    status, out, _ = cli(capsys, "check", "--url", empty_url)
    assert status == FAILED
    assert f"schema: {first}, head is {head}" in out
    assert re.search(rf"schema \(.*\): down in [0-9.]+ ms \(.*revision {first}, behind", out)
    assert out.rstrip().endswith("NOT ready")


def migrate_revisions() -> list[str]:
    """Every revision, oldest first."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory(str(migrate.script_location()))
    return [s.revision for s in reversed(list(scripts.walk_revisions()))]


def create_unversioned_tables(url: str) -> None:
    """The agboss tables as another tool made them: no version table."""
    with connected(url) as connection, connection.begin():
        metadata.create_all(connection)


def test_stamp_adopts_tables_made_without_the_migrations(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    head = migrate.head()
    create_unversioned_tables(empty_url)

    for command in ("current", "leases"):
        status, _, err = cli(capsys, command, "--url", empty_url)
        assert status == FAILED
        assert one_line(err, command) == (
            f"{shown(empty_url)} has no agboss schema revision recorded: its agboss tables "
            "were made without these migrations: if they are the current schema, run "
            f"`agboss-sql stamp --url {shown(empty_url)}` (it compares them first)"
        )
    status, out, _ = cli(capsys, "check", "--url", empty_url)
    assert status == FAILED
    assert f"schema: base (no schema), head is {head}: its agboss tables were made" in out

    status, _, err = cli(capsys, "upgrade", "--url", empty_url)
    assert status == FAILED
    line = one_line(err, "upgrade")
    assert "the agboss tables exist" in line and "but carry no revision" in line
    assert f"run `agboss-sql stamp --url {shown(empty_url)}`" in line
    assert migrate.current(empty_url) is None

    status, out, _ = cli(capsys, "stamp", "--url", empty_url)
    assert status == 0
    assert out == f"stamped {shown(empty_url)}: base (no schema) -> {head}\n"
    assert migrate.current(empty_url) == head

    status, out, _ = cli(capsys, "current", "--url", empty_url)
    assert (status, out) == (0, f"{shown(empty_url)}: {head} (up to date)\n")
    status, out, _ = cli(capsys, "upgrade", "--url", empty_url)
    assert (status, out) == (0, f"{shown(empty_url)} is already at {head}: nothing to do\n")
    status, out, _ = cli(capsys, "stamp", "--url", empty_url)
    assert (status, out) == (0, f"{shown(empty_url)} is already stamped {head}: nothing to do\n")


def test_stamp_refuses_an_empty_database(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = cli(capsys, "stamp", "--url", empty_url)

    assert status == FAILED
    assert one_line(err, "stamp") == (
        "[schema.unversioned] no agboss table exists on this database: there is nothing to "
        f"adopt; run `agboss-sql upgrade --url {shown(empty_url)}` to create the schema"
    )
    assert migrate.current(empty_url) is None


def test_stamp_refuses_tables_that_differ_from_head_unless_forced(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create_unversioned_tables(empty_url)
    dropped = sorted(metadata.tables)[0]
    with connected(empty_url) as connection, connection.begin():
        metadata.tables[dropped].drop(connection)

    status, _, err = cli(capsys, "stamp", "--url", empty_url)
    assert status == FAILED
    line = one_line(err, "stamp")
    assert f"the agboss tables differ from revision {migrate.head()}: add_table {dropped}" in line
    assert "`--force`" in line
    assert migrate.current(empty_url) is None

    status, _, _ = cli(capsys, "stamp", "--url", empty_url, "--force")
    assert status == 0
    assert migrate.current(empty_url) == migrate.head()


def test_history_with_url_marks_the_current_revision(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first, *_ = migrate_revisions()
    migrate.upgrade(empty_url, first)

    status, out, _ = cli(capsys, "history", "--url", empty_url)

    assert status == 0
    assert f"-> {first} (current): " in out
    assert f"-> {migrate.head()} (head): " in out


def test_leases_shows_iso_times_and_ages(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--url", empty_url]) == 0
    capsys.readouterr()
    with connected(empty_url) as connection:
        tenant, execution = connection.execute(
            sa.text("SELECT tenant_id, execution_id FROM agboss_execution_leases")
        ).one()

    status, one, _ = cli(capsys, "leases", "--url", empty_url)
    args = ("--tenant", tenant, "--execution", execution)
    status2, lease, _ = cli(capsys, "leases", "--url", empty_url, *args)

    assert status == status2 == 0
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    age = r"\((\d+ ms|[0-9.]+ s|\d+ min|[0-9.]+ [hd]) ago\)"
    assert re.match(rf"database time: {iso}\n", one)
    moves = one.splitlines()[1:]
    assert len(moves) == 4
    assert all(
        re.match(rf"{iso} {age} {tenant}/{execution} pod-[ab] epoch [12] ", m) for m in moves
    )
    assert f"{tenant}/{execution}: pod-b at epoch 2, finished" in lease


def test_faults_refuses_options_that_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = cli(capsys, "faults", "--repeat", "0", "--url", "sqlite:///unused.sqlite")
    assert status == MISUSED
    assert one_line(err, "faults") == "--repeat must be at least 1, got 0"

    status, _, err = cli(capsys, "faults", "--scenario", "no-such", "--url", "sqlite:///u.sqlite")
    assert status == MISUSED
    assert one_line(err, "faults") == (
        "unknown scenario(s) no-such: see `agboss-sql faults --list`"
    )
    assert not Path("unused.sqlite").exists() and not Path("u.sqlite").exists()


@pytest.mark.parametrize("command", ["upgrade", *READ_ONLY])
def test_an_unsupported_database_is_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = cli(capsys, command, "--url", "oracle://scott@db/orcl")

    assert status == FAILED
    assert one_line(err, command).startswith(
        "unsupported database URL oracle://scott@db/orcl: use sqlite, postgresql or mysql"
    )
