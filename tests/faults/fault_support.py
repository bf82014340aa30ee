"""The database the fault scenarios run on: `AGBOSS_TEST_DATABASE_URL`, else a SQLite file
of this session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_made: list[str] = []


def fault_url() -> str:
    """The URL every pod of a scenario connects to."""
    url = os.environ.get("AGBOSS_TEST_DATABASE_URL")
    if url:
        return url
    if not _made:
        directory = Path(tempfile.mkdtemp(prefix="agboss-faults-"))
        _made.append(f"sqlite:///{directory / 'faults.sqlite'}")
    return _made[0]
