"""The README's quick start, walked as a newcomer walks it, and its test command.

The shell blocks of README.md marked `<!-- readme-test: quick-start -->` are run in a
directory of their own with no `AGBOSS_DATABASE_URL` (so on the embedded SQLite
default), and what the cluster and the demo print is compared with the README's samples
(`<!-- sample: COMMAND -->`), figures, times and ids aside. The block marked
`<!-- readme-test: servers -->` runs the cluster on a server: the line for the server
under test (`AGBOSS_TEST_DATABASE_URL`), with the ready script pointed at that server and
at a database of the test's own, dropped after. In the default run the install steps
(`python3 -m venv`, `pip install`) are taken as done by the environment running the
tests, whose `agboss-sql` stands for `.venv/bin/agboss-sql`; the `slow` test runs every
line as written, install included, in a copy of the checkout (it needs the package
index). The block marked `<!-- readme-test: test-command -->` is the project's test
command: the one `.ci/run` runs, over every env `tox.ini` lists.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from support.capabilities import embedded_url, pooled_url
from support.docs import README, blocks, normalised, samples
from support.sql import server_admin

from agboss_sql.sql.migrate import sync_url

REPOSITORY = README.parent
MARK = "<!-- readme-test: quick-start -->"
SCRIPTS = Path(sys.executable).parent
INSTALL_STEP = re.compile(r"^(python3 -m venv \.venv|\.venv/bin/pip install .*)$")


def marked_commands(mark: str = MARK) -> list[str]:
    """Each command of the marked blocks, in order (`a && b` is two commands)."""
    blocks = re.findall(re.escape(mark) + r"\n```sh\n(.*?)```", README.read_text(), re.S)
    commands: list[str] = []
    for block in blocks:
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.extend(part.strip() for part in line.split(" && "))
    return commands


def readme_sample(command: str) -> str:
    """The output the README shows for `command` (its `<!-- sample: COMMAND -->` block)."""
    (block,) = [b for shown, b in samples(README) if shown == command]
    return block.text


def env_without_database_url() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "AGBOSS_DATABASE_URL"}


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shlex.split(command), capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


CLUSTER_VARYING = [
    (re.compile(r"\b(cluster-|r)[0-9a-f]{8}\b"), r"\1<id>"),
    (re.compile(r"/tmp/agboss-cluster-\w+"), "<run dir>"),
    (re.compile(r"^runs: .*$", re.M), "runs: <states>"),  # one cancel may come too late
    (re.compile(r" \(run on w\d+\)$|: too late$", re.M), " <cancel's outcome>"),
    (re.compile(r"\d+(\.\d+)?"), "N"),
]


def cluster_shape(report: str) -> str:
    """A cluster report without what changes from run to run: its figures, ids, which
    worker the chaos picked, the run directory."""
    for pattern, replacement in CLUSTER_VARYING:
        report = pattern.sub(replacement, report)
    return report.rstrip() + "\n"


def check_cluster(out: str, url: str) -> None:
    """A cluster report on `url`, every invariant held, shaped as the README shows it."""
    assert out.startswith(f"cluster on {url}: 3 workers, workload tree, tenant cluster-"), out
    assert out.rstrip().endswith("\nevery invariant held"), out
    shown = readme_sample("agboss-sql cluster").replace("sqlite:///.agboss/agboss.sqlite", url)
    assert cluster_shape(out) == cluster_shape(shown)


def check_outputs(outputs: dict[str, str]) -> None:
    cluster = next(o for command, o in outputs.items() if command.endswith("agboss-sql cluster"))
    check_cluster(cluster, "sqlite:///.agboss/agboss.sqlite")
    demo = next(out for command, out in outputs.items() if command.endswith("agboss-sql demo"))
    assert normalised(demo) == normalised(readme_sample("agboss-sql demo"))
    check = next(out for command, out in outputs.items() if command.endswith("agboss-sql check"))
    assert check.startswith("database: sqlite:///.agboss/agboss.sqlite\n")
    assert check.rstrip().endswith("\nready")
    leases = next(out for command, out in outputs.items() if " leases" in command)
    assert "taken-over from pod-a@1" in leases and "lost (superseded)" in leases


def test_the_readme_reads_in_ten_minutes() -> None:
    """What it is, the quick start, your own workflow, the tests, the install and the list
    of docs/, in at most 350 lines: everything else lives in docs/, linked."""
    assert len(README.read_text().splitlines()) <= 350


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    commands = marked_commands()
    installs = [c for c in commands if INSTALL_STEP.match(c)]
    assert installs == ["python3 -m venv .venv", ".venv/bin/pip install -q '.[lab]'"], commands
    env = env_without_database_url()
    outputs: dict[str, str] = {}
    for command in commands:
        if command in installs:
            continue
        assert command.startswith(".venv/bin/agboss-sql "), command
        done = run(command.replace(".venv/bin/", f"{SCRIPTS}/", 1), tmp_path, env)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        outputs[command] = done.stdout
    check_outputs(outputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".agboss"]


@pytest.mark.slow
def test_the_quick_start_runs_with_its_install_in_a_copy_of_the_checkout(
    tmp_path: Path,
) -> None:
    checkout = tmp_path / "agboss-sql"
    shutil.copytree(
        REPOSITORY,
        checkout,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".tox",
            ".agboss",
            "__pycache__",
            "*.egg-info",
            "build",
            "dist",
            # Local servers' directories (sockets cannot be copied): .gitignore's.
            ".galera",
            ".replica",
            ".pgbouncer",
        ),
    )
    env = {k: v for k, v in env_without_database_url().items() if k != "PYTHONPATH"}
    outputs: dict[str, str] = {}
    for command in marked_commands():
        done = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=checkout,
            env=env,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        outputs[command] = done.stdout
    check_outputs(outputs)


SERVERS_MARK = "<!-- readme-test: servers -->"


def drop_database(url: sa.URL) -> None:
    name = url.database
    assert name is not None and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), name
    admin, quote, force = server_admin(url)
    statement = f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}"
    engine = sa.create_engine(sync_url(admin), poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_the_server_cluster_runs_as_written(database_url: str, tmp_path: Path) -> None:
    url = make_url(database_url)
    backend = url.get_backend_name()
    if embedded_url(database_url):
        pytest.skip("the server lines of the README need a server under test")
    if pooled_url(database_url):
        pytest.skip("the README's ready script reaches the server directly, not a pooler's URL")
    commands = marked_commands(SERVERS_MARK)
    assert commands[0].startswith(".venv/bin/pip install"), commands
    script = "postgresql" if backend == "postgresql" else "mysql"
    (line,) = [c for c in commands if f"dialects/{script}/ready.sh" in c]
    prefix = "AGBOSS_PG" if script == "postgresql" else "AGBOSS_MYSQL"
    own = f"{url.database}_readme"
    env = env_without_database_url() | {
        f"{prefix}_HOST": url.host or "127.0.0.1",
        f"{prefix}_PORT": str(url.port or (5432 if script == "postgresql" else 3306)),
        f"{prefix}_USER": url.username or "",
        f"{prefix}_DB": own,
    }
    try:
        done = subprocess.run(
            ["bash", "-c", line.replace(".venv/bin/", f"{SCRIPTS}/")],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPOSITORY,
            env=env,
            check=False,
        )
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        assert f"cluster on {script}://" in done.stdout and f"/{own}: 3 workers" in done.stdout
        assert done.stdout.rstrip().endswith("\nevery invariant held"), done.stdout
    finally:
        drop_database(url.set(database=own))


def test_the_test_command_is_what_ci_runs_over_every_env_tox_lists() -> None:
    """README's test command is `tox -p 2`; `.ci/run` runs it with no env named (so tox's
    env_list), and the README names every env of that list."""
    (command,) = [b.text.strip() for b in blocks(README) if b.mark == TEST_COMMAND_MARK]
    assert command == "tox -p 2"
    ci = (REPOSITORY / ".ci" / "run").read_text()
    assert re.search(r"^\s*tox \"\$@\"$", ci, re.M), "run_tox no longer runs tox"
    assert re.search(r"^run_tox -p 2( --parallel-live)?$", ci, re.M), (
        ".ci/run no longer runs the default tox run two envs at a time"
    )
    tox = configparser.ConfigParser()
    tox.read(REPOSITORY / "tox.ini")
    envs = [e.strip() for e in tox["tox"]["env_list"].split(",")]
    tests = README.read_text().split("## Tests", 1)[1].split("\n## ", 1)[0]
    assert [env for env in envs if f"`{env}`" not in tests] == [], envs


TEST_COMMAND_MARK = "<!-- readme-test: test-command -->"
