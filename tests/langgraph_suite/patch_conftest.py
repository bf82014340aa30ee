"""Add `SqlCheckpointSaver` to the checkpointer fixtures of a LangGraph checkout.

    python tests/langgraph_suite/patch_conftest.py <langgraph>/libs/langgraph/tests

Copies `agboss_checkpointer.py` beside LangGraph's `conftest.py` and adds the parameters
`agboss_sqlite`, `agboss_postgres`, `agboss_mysql` to its `sync_checkpointer` fixture and
`agboss_sqlite_aio`, `agboss_postgres_aio`, `agboss_mysql_aio` to `async_checkpointer`.
Idempotent: a patched file is left as it is.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

MARK = "# agboss-sql checkpointers"
SYNC = ["agboss_sqlite", "agboss_postgres", "agboss_mysql"]
ASYNC = [f"{name}_aio" for name in SYNC]


def patch(tests: Path) -> None:
    shutil.copyfile(
        Path(__file__).with_name("agboss_checkpointer.py"), tests / "agboss_checkpointer.py"
    )
    conftest = tests / "conftest.py"
    text = conftest.read_text()
    if MARK in text:
        return
    text = text.replace(
        "from tests.conftest_checkpointer import (",
        f"{MARK}\nfrom tests.agboss_checkpointer import agboss_checkpointer, agboss_checkpointer_aio\n"
        "from tests.conftest_checkpointer import (",
        1,
    )
    sync_params = "".join(f'        "{name}",\n' for name in SYNC)
    async_params = "".join(f'        "{name}",\n' for name in ASYNC)
    # Both fixtures' parameter lists end with their last Postgres variant.
    text = text.replace(
        '        "postgres_pool",\n    ],', f'        "postgres_pool",\n{sync_params}    ],', 1
    )
    text = text.replace(
        '        "sqlite_aes",\n    ]\n    if NO_DOCKER',
        f'        "sqlite_aes",\n{sync_params}    ]\n    if NO_DOCKER',
        1,
    )
    text = text.replace(
        '        "postgres_aio_pool",\n    ],',
        f'        "postgres_aio_pool",\n{async_params}    ],',
        1,
    )
    text = text.replace(
        '        "sqlite_aio",\n    ]\n    if NO_DOCKER',
        f'        "sqlite_aio",\n{async_params}    ]\n    if NO_DOCKER',
        1,
    )
    text = text.replace(
        '    checkpointer_name = request.param\n    if checkpointer_name == "memory":\n'
        "        with _checkpointer_memory() as checkpointer:\n            yield checkpointer\n"
        '    elif checkpointer_name == "memory_migrate_sends":',
        '    checkpointer_name = request.param\n    if checkpointer_name.startswith("agboss_"):\n'
        '        with agboss_checkpointer(checkpointer_name.removeprefix("agboss_")) as checkpointer:\n'
        "            yield checkpointer\n"
        '    elif checkpointer_name == "memory":\n'
        "        with _checkpointer_memory() as checkpointer:\n            yield checkpointer\n"
        '    elif checkpointer_name == "memory_migrate_sends":',
        1,
    )
    text = text.replace(
        '    checkpointer_name = request.param\n    if checkpointer_name == "memory":\n'
        "        with _checkpointer_memory() as checkpointer:\n            yield checkpointer\n"
        '    elif checkpointer_name == "sqlite_aio":',
        '    checkpointer_name = request.param\n    if checkpointer_name.startswith("agboss_"):\n'
        "        async with agboss_checkpointer_aio(\n"
        '            checkpointer_name.removeprefix("agboss_").removesuffix("_aio")\n'
        "        ) as checkpointer:\n"
        "            yield checkpointer\n"
        '    elif checkpointer_name == "memory":\n'
        "        with _checkpointer_memory() as checkpointer:\n            yield checkpointer\n"
        '    elif checkpointer_name == "sqlite_aio":',
        1,
    )
    if text.count("agboss_") < 16:
        raise SystemExit(f"{conftest}: the fixtures are not where this patch expects them")
    conftest.write_text(text)


if __name__ == "__main__":
    patch(Path(sys.argv[1]))
