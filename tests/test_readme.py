"""The README's quick start, walked as a newcomer walks it.

The shell blocks of README.md marked `<!-- readme-test: quick-start -->` are run in a
directory of their own with no `AGBOSS_DATABASE_URL` (so on the embedded SQLite
default). The block marked `<!-- readme-test: servers -->` runs the cluster on a server:
the line for the server under test (`AGBOSS_TEST_DATABASE_URL`), with the ready
script pointed at that server and at a database of the test's own, dropped after. In the default run the install steps (`python3 -m venv`, `pip install`) are
taken as done by the environment running the tests, whose `agboss-sql` stands for
`.venv/bin/agboss-sql`; the `slow` test runs every line as written, install included,
in a copy of the checkout (it needs the package index).
"""

from __future__ import annotations

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
from support.capabilities import embedded_url
from support.sql import server_admin

from agboss_sql.sql.migrate import sync_url

REPOSITORY = Path(__file__).resolve().parents[1]
README = REPOSITORY / "README.md"
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


def readme_demo_output() -> str:
    """The demo output the README shows (the first plain block after the quick start)."""
    after = README.read_text().split(MARK, 1)[1]
    return re.search(r"\n```\n(pod-a  acquired.*?)```", after, re.S).group(1)  # type: ignore[union-attr]


def ids_hidden(text: str) -> str:
    return re.sub(r"\b(tree|order)-[0-9a-f]+", r"\1-<id>", text)


def env_without_database_url() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "AGBOSS_DATABASE_URL"}


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shlex.split(command), capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


def readme_cluster_output() -> str:
    """The cluster report the README shows (the first plain block after the quick start)."""
    after = README.read_text().split(MARK, 1)[1]
    return re.search(r"\n```\n(cluster on .*?)```", after, re.S).group(1)  # type: ignore[union-attr]


def labels(report: str) -> list[str]:
    """What each line of a cluster report says, without its figures."""
    return [
        line.split(":", 1)[0] if ":" in line else line.split(" ", 1)[0]
        for line in (raw.strip() for raw in report.splitlines())
    ]


def check_cluster(out: str, url: str) -> None:
    """A cluster report on `url`, every invariant held, shaped as the README shows it."""
    assert out.startswith(f"cluster on {url}: 3 workers, workload tree, tenant cluster-"), out
    assert out.rstrip().endswith("\nevery invariant held"), out
    shown = [label for label in labels(readme_cluster_output()) if label]
    printed = set(labels(out))
    assert [label for label in shown if label not in printed] == [], out


def check_outputs(outputs: dict[str, str]) -> None:
    cluster = next(o for command, o in outputs.items() if command.endswith("agboss-sql cluster"))
    check_cluster(cluster, "sqlite:///.agboss/agboss.sqlite")
    demo = next(out for command, out in outputs.items() if command.endswith("agboss-sql demo"))
    shown = demo.split("\n", 1)[1]  # after `demo on URL`
    assert ids_hidden(shown) == ids_hidden(readme_demo_output())
    check = next(out for command, out in outputs.items() if command.endswith("agboss-sql check"))
    assert check.startswith("database: sqlite:///.agboss/agboss.sqlite\n")
    assert check.rstrip().endswith("\nready")
    leases = next(out for command, out in outputs.items() if " leases" in command)
    assert "taken-over from pod-a@1" in leases and "lost (superseded)" in leases


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
            ".git", ".venv", ".tox", ".agboss", "__pycache__", "*.egg-info", "build", "dist"
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
