"""The commands that run the migrations, as a user runs them: `agboss-sql upgrade`
(from the installed package, including a plain wheel install) and `alembic` in a
checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from migration_support import schema_difference, table_names, version_rows

from agboss_sql.sql import migrate
from agboss_sql.sql.schema import metadata

pytestmark = pytest.mark.database

REPOSITORY = Path(__file__).resolve().parents[2]
SCRIPTS = Path(sys.executable).parent


def _run(
    command: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=env, cwd=cwd, check=False
    )


def _env_without_database_url() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != migrate.DATABASE_URL_ENV}


def _agboss_sql(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return _run([str(SCRIPTS / "agboss-sql"), *args], env=env, cwd=cwd)


def test_agboss_sql_upgrade_migrates_and_says_what_it_did(empty_url: str) -> None:
    head = migrate.head()

    first = _agboss_sql("upgrade", "--url", empty_url)
    assert first.returncode == 0, first.stderr
    assert f"base (no schema) -> {head}" in first.stdout
    assert migrate.current(empty_url) == head

    again = _agboss_sql("upgrade", "--url", empty_url)
    assert again.returncode == 0, again.stderr
    assert f"already at {head}" in again.stdout

    current = _agboss_sql("current", "--url", empty_url)
    assert current.returncode == 0, current.stderr
    assert f"{head} (up to date)" in current.stdout


def test_agboss_sql_upgrade_to_a_revision_and_history(empty_url: str) -> None:
    head = migrate.head()

    done = _agboss_sql("upgrade", "--url", empty_url, "--revision", head)
    history = _agboss_sql("history")

    assert done.returncode == 0, done.stderr
    assert migrate.current(empty_url) == head
    assert history.returncode == 0, history.stderr
    assert "base (no schema) -> 0001" in history.stdout
    assert f"-> {head} (head)" in history.stdout


def test_agboss_sql_upgrade_reads_the_url_from_the_environment(empty_url: str) -> None:
    env = _env_without_database_url() | {migrate.DATABASE_URL_ENV: empty_url}

    done = _agboss_sql("upgrade", env=env)

    assert done.returncode == 0, done.stderr
    assert migrate.current(empty_url) == migrate.head()


def test_agboss_sql_upgrade_defaults_to_a_local_sqlite_file(tmp_path: Path) -> None:
    done = _agboss_sql("upgrade", env=_env_without_database_url(), cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    database = tmp_path / ".agboss" / "agboss.sqlite"
    assert database.is_file()
    assert migrate.current(f"sqlite:///{database}") == migrate.head()


def test_agboss_sql_upgrade_reports_an_unreachable_database() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    done = _agboss_sql("upgrade", "--url", "postgresql://nobody@127.0.0.1:1/nothing")

    assert done.returncode == 1
    assert done.stderr == (
        "agboss-sql upgrade: nothing answers at 127.0.0.1:1 (connection refused): start the "
        "database server, or correct the host and port in the URL\n"
    )


def test_alembic_in_a_checkout_round_trips(empty_url: str) -> None:
    def alembic(*args: str) -> subprocess.CompletedProcess[str]:
        ini = str(REPOSITORY / "alembic.ini")
        return _run(
            [sys.executable, "-m", "alembic", "-c", ini, "-x", f"url={empty_url}", *args],
            env=_env_without_database_url(),
        )

    for step, expected in (("upgrade", migrate.head()), ("downgrade", None)):
        done = alembic(step, "head" if step == "upgrade" else "base")
        assert done.returncode == 0, done.stderr
        assert migrate.current(empty_url) == expected
    done = alembic("upgrade", "head")
    assert done.returncode == 0, done.stderr
    # `alembic check`: autogenerate, through the environment, finds nothing to do.
    checked = alembic("check")
    assert checked.returncode == 0, checked.stderr + checked.stdout

    assert version_rows(empty_url) == [migrate.head()]
    assert "alembic_version" not in table_names(empty_url)
    assert schema_difference(empty_url) == []


def _wheel(tmp_path: Path) -> Path:
    """The wheel under test: the one tox built from this checkout for this run and installed
    in its env (`TOX_PACKAGE`), else one built here. tox builds it once per run, so each
    database env saves a build with its isolated build environment."""
    for named in os.environ.get("TOX_PACKAGE", "").split(os.pathsep):
        built_by_tox = Path(named)
        if built_by_tox.name.startswith("agboss_sql-") and built_by_tox.suffix == ".whl":
            assert built_by_tox.is_file(), built_by_tox
            return built_by_tox
    wheels = tmp_path / "wheels"
    built = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(wheels),
            str(REPOSITORY),
        ]
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("agboss_sql-*.whl")
    return wheel


@pytest.mark.slow
def test_the_installed_wheel_migrates_without_a_checkout(empty_url: str, tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "agboss_sql/_alembic/env.py" in names
    assert any(n.startswith("agboss_sql/_alembic/versions/") for n in names)

    # A venv holding only the wheel; its dependencies come from this environment's
    # site-packages, appended after the venv's own (a path line in a .pth file adds the
    # directory without running its .pth files, so an editable checkout stays out), and
    # it runs outside the checkout.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    installed = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ]
    )
    assert installed.returncode == 0, installed.stderr
    # Only now: pip would take this environment's agboss-sql for the wheel's.
    (site / "_agboss_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    # Nor through PYTHONPATH: a checkout on it would be imported instead of the wheel.
    env = {k: v for k, v in _env_without_database_url().items() if k != "PYTHONPATH"}
    located = _run(
        [str(python), "-c", "from agboss_sql.sql import migrate; print(migrate.script_location())"],
        env=env,
        cwd=outside,
    )
    assert located.returncode == 0, located.stderr
    assert Path(located.stdout.strip()) == site / "agboss_sql" / "_alembic"

    done = _run(
        [str(env_dir / "bin" / "agboss-sql"), "upgrade", "--url", empty_url], env=env, cwd=outside
    )

    assert done.returncode == 0, done.stderr
    assert "base (no schema) -> " in done.stdout
    assert migrate.current(empty_url) == migrate.head()
    assert table_names(empty_url) == set(metadata.tables) | {migrate.VERSION_TABLE}
