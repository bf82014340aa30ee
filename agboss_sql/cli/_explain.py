"""What a failed `agboss-sql` command prints: `explain` turns an exception into one line
saying what is wrong and what to do."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from agboss_sql.cli._common import PROG, database_url, shown

_EXTRAS = {
    "psycopg": ("the PostgreSQL driver", "postgresql"),
    "psycopg_binary": ("the PostgreSQL driver", "postgresql"),
    "aiomysql": ("the MySQL/MariaDB driver", "mysql"),
    "pymysql": ("the MySQL/MariaDB driver", "mysql"),
    "langgraph": ("LangGraph's checkpoint package", "langgraph"),
    "rich": ("the lab's live view", "lab"),
}
"""A missing module, what it is and the extra that installs it."""


def explain(exc: BaseException, args: argparse.Namespace) -> str:
    """One line saying what `exc` means to the person who ran the command, and what to
    do about it: a missing driver names its extra, a file path given as a URL gets its
    `sqlite:///` form, a refused connection, a missing database, missing tables, a
    refused login each say so. Anything else is shown as its type and first line, with
    the hint to run again with `--debug`."""
    from agboss_sql.contracts.errors import AgbossError

    given = getattr(args, "url", None)
    try:
        url = database_url(args) if hasattr(args, "url") else None
    except Exception:  # pragma: no cover - resolving a URL reads only the environment
        url = None
    chain = list(_chain(exc))
    text = " | ".join(str(e) for e in chain)
    lowered = text.lower()
    rerun = f"--url {shown_or(url)}"

    missing = next((e for e in chain if isinstance(e, ImportError)), None)
    if missing is not None:
        module = (missing.name or "").split(".")[0]
        if module in _EXTRAS:
            what, extra = _EXTRAS[module]
            return (
                f"{what} ({module}) is not installed: install agboss-sql with its `{extra}` "
                f"extra: `pip install '.[{extra}]'` in a checkout, or "
                f"`pip install 'dist/agboss_sql-<version>-py3-none-any.whl[{extra}]'`"
            )
    if "could not parse sqlalchemy url" in lowered or (
        url is not None and "://" not in url and isinstance(exc, ValueError)
    ):
        written = given or url or ""
        return (
            f"{written!r} is not a database URL: for a SQLite file write "
            f"sqlite:///{written} (relative to here) or sqlite:////absolute/path; "
            "for a server postgresql://user@host/db or mysql://user@host/db"
        )
    if isinstance(exc, ValueError) and "unsupported database" in lowered:
        return f"{exc}: e.g. sqlite:///file.sqlite, postgresql://user@host/db, mysql://user@host/db"
    where = _server_of(url)
    if (
        "connection refused" in lowered
        or "can't connect to" in lowered
        or "could not connect to server" in lowered
    ):
        why = "connection refused" if "refused" in lowered else "cannot connect"
        return (
            f"nothing answers at {where} ({why}): start the database server, "
            "or correct the host and port in the URL"
        )
    if "connection timeout expired" in lowered or isinstance(_innermost(chain), TimeoutError):
        from agboss_sql._timeouts import Timeouts

        return (
            f"{where} did not answer the connection within {Timeouts().connect_ms / 1000:g} s "
            "(Timeouts.connect_ms): a server that "
            "accepts it and never greets is frozen or overloaded; check it, or the host and "
            "port in the URL"
        )
    database = _database_of(url)
    if f'database "{database}" does not exist' in lowered or "unknown database" in lowered:
        return (
            f"database {database!r} does not exist on {where}: create it "
            f"(`CREATE DATABASE {database}`), then run `{PROG} upgrade {rerun}`"
        )
    if (
        "password authentication failed" in lowered
        or "access denied" in lowered
        or (f'role "{_user_of(url)}" does not exist' in lowered)
    ):
        return (
            f"{where} refused the login ({_first_line(_innermost(chain))}): check the user "
            "and password in the URL"
        )
    if "agboss_" in lowered and (
        "no such table" in lowered or "doesn't exist" in lowered or "does not exist" in lowered
    ):
        return f"the agboss tables are missing on {shown_or(url)}: run `{PROG} upgrade {rerun}`"
    if "unable to open database file" in lowered or "readonly database" in lowered:
        return (
            f"SQLite cannot open {shown_or(url)} for writing ({_first_line(_innermost(chain))}): "
            "its directory must exist and be writable (SQLite writes the file and its -wal "
            "and -shm files beside it): use a path in a writable directory, e.g. --url "
            "sqlite:///.agboss/agboss.sqlite"
        )
    if isinstance(exc, AgbossError):
        return str(exc).replace("--url URL", rerun)
    cause = _innermost(chain)
    return (
        f"{type(cause).__name__}: {_first_line(cause)} (run again with --debug for the traceback)"
    )


def shown_or(url: str | None) -> str:
    """`shown(url)`, or `URL` when there is none or it cannot be parsed."""
    if url is None:
        return "URL"
    try:
        return shown(url)
    except Exception:
        return url


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        pending.extend(
            [
                orig if isinstance(orig, BaseException) else None,
                current.__cause__,
                current.__context__,
            ]
        )


def _innermost(chain: list[BaseException]) -> BaseException:
    # A driver's error says it best; SQLAlchemy's wrapper adds the statement and a link.
    return chain[-1] if len(chain) > 1 else chain[0]


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _server_of(url: str | None) -> str:
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url or "")
    except Exception:
        return "the database"
    if parsed.host is None:
        return shown_or(url)
    return f"{parsed.host}:{parsed.port}" if parsed.port else parsed.host


def _user_of(url: str | None) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url or "").username or ""
    except Exception:
        return ""


def _database_of(url: str | None) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url or "").database or ""
    except Exception:
        return ""
