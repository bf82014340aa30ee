"""The shipped `bench` command stands on the library alone: no test kit, no database name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import agboss_sql.lab.bench

BENCH = Path(agboss_sql.lab.bench.__file__)
# The bench's module and the modules it is split into (its floor, tables, child claim).
SOURCE = "\n".join(
    path.read_text(encoding="utf-8") for path in (BENCH, *sorted(BENCH.parent.glob("_bench_*.py")))
)


def test_bench_does_not_import_the_test_kit() -> None:
    # A fresh interpreter: this test session imports the test kit on its own.
    probe = (
        "import sys, agboss_sql.lab.bench\n"
        "kit = sorted(m for m in sys.modules if m.startswith('agboss_sql.testing'))\n"
        "print(kit)\n"
        "sys.exit(1 if kit else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_bench_asks_capabilities_not_database_names() -> None:
    names = re.findall(r"[\"'](sqlite|postgresql|mysql|mariadb)[\"']|dialect_name", SOURCE)
    assert names == []


def test_bench_uses_no_private_store_attribute() -> None:
    assert re.findall(r"\._sql\b", SOURCE) == []
