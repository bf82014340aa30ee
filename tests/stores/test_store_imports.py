"""A store module that does not import fails the suite: it is never turned into a skip.

The run below breaks one store module's import on purpose (an import hook raises for it)
and collects the SQL conformance suite in a fresh interpreter: pytest must exit with an
error naming the import. Were the suite to leave the store out of the set (or skip its
cases), collection would succeed and this test would fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BROKEN_RUN = """
import importlib.abc, sys

class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == {module!r}:
            raise ImportError("{module} is broken on purpose")
        return None

sys.meta_path.insert(0, Broken())
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", {target!r}]))
"""


@pytest.mark.parametrize("module", ["agboss_sql.sql.mesh"])
def test_a_store_module_that_does_not_import_fails_the_suite(module: str) -> None:
    target = str(ROOT / "tests" / "stores" / "test_conformance_sql.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), *sys.path]))}
    done = subprocess.run(
        [sys.executable, "-c", BROKEN_RUN.format(module=module, target=target)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode not in (0, 5), output  # 0: collected, 5: nothing collected
    assert f"{module} is broken on purpose" in output, output
