"""`agboss-sql import-threads`: LangGraph threads brought over from the saver that wrote
them (LangGraph's saver of that database, or this project's on another database) into the
checkpoint saver on `--url` (`agboss_sql.sql.checkpoint.import_threads`)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from agboss_sql._timeouts import Timeouts
from agboss_sql.cli._common import (
    MISUSED,
    CommandFailed,
    add_url_argument,
    require_head,
    shown,
    writable_database,
)

LANGGRAPH = "langgraph"
AGBOSS = "agboss"

_OFFICIAL = {
    "sqlite": ("langgraph.checkpoint.sqlite", "SqliteSaver", "langgraph-checkpoint-sqlite"),
    "postgresql": (
        "langgraph.checkpoint.postgres",
        "PostgresSaver",
        "langgraph-checkpoint-postgres",
    ),
    "mysql": (
        "langgraph.checkpoint.mysql.pymysql",
        "PyMySQLSaver",
        "'langgraph-checkpoint-mysql[pymysql]'",
    ),
}
"""Per database: the module, class and package of the LangGraph saver that reads it."""


def _import_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--from",
        dest="source",
        metavar="URL",
        required=True,
        help="the database the threads are on now (sqlite:///path, postgresql://…, mysql://…)",
    )
    parser.add_argument(
        "--from-saver",
        choices=(LANGGRAPH, AGBOSS),
        default=LANGGRAPH,
        help="the saver that wrote them: LangGraph's for that database (SqliteSaver, "
        "PostgresSaver, the community PyMySQLSaver), or agboss-sql's own",
    )
    parser.add_argument(
        "--thread",
        dest="threads",
        action="append",
        metavar="ID",
        help="a thread to bring over (repeat); default: every thread the source lists",
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="do not read each thread's newest checkpoint back and compare it with the source's",
    )


@contextlib.contextmanager
def _langgraph_saver(url: str) -> Iterator[Any]:
    """LangGraph's saver of the database `url` names, open on it."""
    import importlib

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    backend = "mysql" if parsed.get_backend_name() == "mariadb" else parsed.get_backend_name()
    if backend not in _OFFICIAL:
        raise CommandFailed(f"--from {shown(url)}: not a SQLite, PostgreSQL or MySQL URL", MISUSED)
    module, name, package = _OFFICIAL[backend]
    try:
        saver_class = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise CommandFailed(
            f"reading {shown(url)} needs LangGraph's {name} ({exc.name or module} is not "
            f"installed): `pip install {package}`",
            MISUSED,
        ) from exc
    from agboss_sql.sql.checkpoint._sync_drivers import driver_for

    bounds = Timeouts()
    if backend == "sqlite":
        import sqlite3
        from pathlib import Path

        path = parsed.database or ""
        if not path or path == ":memory:" or not Path(path).is_file():
            raise CommandFailed(f"--from {shown(url)}: no SQLite file there")
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, check_same_thread=False, timeout=bounds.lock_ms / 1000
        )
        try:
            yield saver_class(conn)
        finally:
            conn.close()
        return
    # The saver's own synchronous driver: the connection's, statements' and locks' waits
    # bounded by `Timeouts` as the project's own connections are (LangGraph's
    # `from_conn_string` bounds none of them).
    driver = driver_for(parsed, bounds)
    try:
        raw = driver.connect()
    except Exception as exc:
        raise _unreadable(url, exc) from exc
    try:
        if backend == "postgresql":
            from psycopg.rows import dict_row

            raw.row_factory = dict_row  # as PostgresSaver.from_conn_string opens it
            raw.prepare_threshold = 0
        yield saver_class(raw)
    finally:
        driver.close(raw)


@contextlib.contextmanager
def _agboss_saver(url: str) -> Iterator[Any]:
    """This project's saver on the database `url` names, refused unless its schema is at
    the head."""
    from agboss_sql.sql.checkpoint import SqlCheckpointSaver
    from agboss_sql.sql.migrate import missing_sqlite_file

    missing = missing_sqlite_file(url)
    if missing is not None:
        raise CommandFailed(f"--from {shown(url)}: no database at {missing}")
    try:
        require_head(url)
    except CommandFailed as refused:
        raise CommandFailed(f"--from {refused}") from refused
    except Exception as exc:
        raise _unreadable(url, exc) from exc
    with SqlCheckpointSaver.from_conn_string(url) as saver:
        yield saver


def _unreadable(url: str, exc: BaseException) -> CommandFailed:
    """The failure of a source that cannot be opened or read (nothing answers, no tables),
    naming it: the failures `explain` words are the target's (`--url`)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return CommandFailed(
        f"cannot read the threads on --from {shown(url)}: {type(exc).__name__}: {first}"
    )


def _readable(source: Any, url: str) -> None:
    """Refuse a source whose threads cannot be listed, before anything is written."""
    try:
        next(iter(source.list(None, limit=1)), None)
    except Exception as exc:
        raise _unreadable(url, exc) from exc


def _import(args: argparse.Namespace) -> int:
    from agboss_sql.sql.checkpoint import SqlCheckpointSaver, import_threads

    opened = _agboss_saver if args.from_saver == AGBOSS else _langgraph_saver
    with opened(args.source) as source:
        _readable(source, args.source)
        url = writable_database(args)
        require_head(url)
        with SqlCheckpointSaver.from_conn_string(url) as target:
            report = import_threads(source, target, args.threads, verify=not args.no_verify)
    checked = "" if args.no_verify else "; each thread's newest checkpoints checked"
    print(
        f"imported {report.threads} threads from {shown(args.source)} into {shown(url)}: "
        f"{report.checkpoints} checkpoints, {report.writes} pending writes{checked}"
    )
    return 0
