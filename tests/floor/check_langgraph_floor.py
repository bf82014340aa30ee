"""Install the lowest versions the `langgraph` extra declares, in a fresh virtual environment,
and use the checkpoint saver there: the declared floor must be one the saver works with.

    python tests/floor/check_langgraph_floor.py [--keep DIR] [--pin NAME==VERSION ...]

Every requirement of the extra with a lower bound (`>=X`) is installed at exactly `X`
(pip constraints); the saver is then imported and runs a put and a read on a SQLite file
migrated by the project's own migrations. Exit status 0 when it works. `--pin` overrides a
floor (to show what an older version does). Run by `tox -e floor` (not in the default list:
it downloads and installs packages).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SMOKE = r"""
import asyncio, sys, tempfile
from importlib.metadata import version
from langgraph.checkpoint.base import empty_checkpoint
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.migrate import upgrade

expected = dict(pin.split("==") for pin in sys.argv[1:])
for name, pinned in expected.items():
    assert version(name) == pinned, (name, version(name), pinned)

async def main(url):
    async with SqlCheckpointSaver.from_conn_string(url) as saver:
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"answer": 42}
        checkpoint["channel_versions"] = {"answer": saver.get_next_version(None, None)}
        config = {"configurable": {"thread_id": "floor", "checkpoint_ns": ""}}
        await saver.aput(config, checkpoint, {"source": "input", "step": -1},
                         checkpoint["channel_versions"])
        found = await saver.aget_tuple(config)
        assert found is not None and found.checkpoint["channel_values"] == {"answer": 42}

url = "sqlite:///" + tempfile.mkdtemp() + "/floor.sqlite"
upgrade(url)
asyncio.run(main(url))
print("the saver works with", ", ".join(f"{n} {v}" for n, v in expected.items()))
"""


def floors(extra: str = "langgraph") -> list[str]:
    """`name==X` for each requirement of `extra` in pyproject.toml with a `>=X` bound."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = []
    for requirement in project["optional-dependencies"][extra]:
        found = re.match(
            r"^\s*([A-Za-z0-9_.\-\[\]]+?)\s*(?:\[.*\])?\s*>=\s*([^,;\s]+)", requirement
        )
        if found is None:
            raise SystemExit(f"the {extra} extra's {requirement!r} declares no floor (>=)")
        pins.append(f"{found.group(1)}=={found.group(2)}")
    return pins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="build the environment here and keep it")
    parser.add_argument(
        "--pin", action="append", default=[], help="NAME==VERSION instead of a floor"
    )
    args = parser.parse_args()
    pins = {pin.split("==")[0].lower(): pin for pin in floors()}
    pins.update({pin.split("==")[0].lower(): pin for pin in args.pin})
    with tempfile.TemporaryDirectory() as scratch:
        where = args.keep or Path(scratch) / "venv"
        venv.create(where, with_pip=True, clear=True)
        python = where / ("Scripts" if sys.platform == "win32" else "bin") / "python"
        constraints = Path(scratch) / "constraints.txt"
        constraints.write_text("\n".join(pins.values()) + "\n")
        print("installing", ROOT, "[langgraph] with", ", ".join(pins.values()), flush=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "-c",
                str(constraints),
                f"{ROOT}[langgraph]",
            ],
            check=True,
        )
        smoke = subprocess.run([str(python), "-c", SMOKE, *pins.values()], cwd=scratch)
        return smoke.returncode


if __name__ == "__main__":
    raise SystemExit(main())
