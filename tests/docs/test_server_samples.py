"""The samples of the documentation that only a server prints, each run on the database
under test where it applies (skipped elsewhere) and compared with its page.

A sample of this kind is marked `<!-- sample by tests/docs/test_server_samples.py: WHAT -->`
(`tests/docs/test_samples.py` accepts no other mark naming a test file than one whose
test reads that page).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from support.docs import REPOSITORY, blocks
from support.sql import server_admin

from agboss_sql.sql import migrate

OPERATIONS = REPOSITORY / "docs" / "operations.md"
COLLATION_MARK = (
    "<!-- sample by tests/docs/test_server_samples.py: "
    "agboss-sql check on a database collated utf8mb4_general_ci -->"
)
SHOWN_NAME = "shop"
"""The database's name as the sample shows it."""


def agboss_sql(*arguments: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGBOSS_DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "agboss_sql.cli", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=Path(__file__).parent,
    )


@pytest.fixture
def general_ci_url(database_url: str) -> Iterator[str]:
    """A database of the server under test made with a case-insensitive default collation
    (the server's usual default); skipped where text has no per-database collation."""
    if migrate.collation(database_url) is None:
        pytest.skip("only MySQL and MariaDB collate a database's text by a setting")
    url = make_url(database_url)
    name = f"{url.database}_docs_ci"
    admin_url, quote, force = server_admin(migrate.sync_url(url))
    engine = sa.create_engine(admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")

    def drop() -> None:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}")

    drop()
    with engine.connect() as connection:
        connection.exec_driver_sql(
            f"CREATE DATABASE {quote}{name}{quote} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
        )
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        drop()
        engine.dispose()


def shape(text: str, name: str) -> str:
    """`text` with the database's name as the sample shows it and its table count aside
    (it grows with the schema)."""
    text = re.sub(rf"\b{re.escape(name)}\b", SHOWN_NAME, text)
    return re.sub(r"\b\d+ agboss table\(s\)", "N agboss table(s)", text)


def test_the_collation_sample_is_what_check_prints(general_ci_url: str) -> None:
    (block,) = [b for b in blocks(OPERATIONS) if b.mark == COLLATION_MARK]
    name = make_url(general_ci_url).database
    assert name is not None
    forced = agboss_sql("upgrade", "--url", general_ci_url, "--force")
    assert forced.returncode == 0, forced.stderr
    done = agboss_sql("check", "--url", general_ci_url)
    assert done.returncode == 1, (done.stdout, done.stderr)
    printed = done.stdout.splitlines()
    start = next(i for i, line in enumerate(printed) if line.startswith("collation: "))
    shown = block.text.splitlines()
    assert shown[-1].strip() == "…", "the sample elides the statements after its first two"
    kept = len(shown) - 1
    assert len(printed) > start + kept, done.stdout
    assert [shape(line, name) for line in printed[start : start + kept]] == [
        shape(line, SHOWN_NAME) for line in shown[:kept]
    ], done.stdout
