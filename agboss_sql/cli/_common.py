"""What every subcommand of `agboss-sql` shares: the exit statuses, `CommandFailed`, the
`Subcommand` entry, the lab check, and the database URL and schema-revision helpers."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

PROG = "agboss-sql"

FAILED = 1
"""The exit status of a command that failed (a database that cannot be used, a bad URL)."""

MISUSED = 2
"""The exit status of a command given options that do not go together (as argparse's)."""

INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT)."""


class CommandFailed(Exception):
    """An expected failure a subcommand reports itself: `message` is the line to print
    (what is wrong and what to do), `status` the exit status."""

    def __init__(self, message: str, status: int = FAILED) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Subcommand:
    """One subcommand: its help line, how it adds its arguments, how it runs. A `lab`
    subcommand runs code of `agboss_sql.lab`: it is refused, naming the `lab` extra, when
    the lab's dependencies are not installed; building the parser never imports the lab."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    lab: bool = False


def require_lab() -> None:
    """Refuse (`MISUSED`) a lab subcommand when a module the lab needs is not installed,
    with the install command of the `lab` extra."""
    from agboss_sql.lab import missing_requirements

    missing = missing_requirements()
    if missing:
        raise CommandFailed(
            f"needs the lab extra ({', '.join(missing)} is not installed): "
            "`pip install '.[lab]'` in a checkout, or "
            "`pip install 'dist/agboss_sql-<version>-py3-none-any.whl[lab]'`",
            MISUSED,
        )


def add_url_argument(parser: argparse.ArgumentParser) -> None:
    """`--url URL`: the database (default: `AGBOSS_DATABASE_URL`, else the local SQLite
    file `.agboss/agboss.sqlite`)."""
    parser.add_argument(
        "--url",
        metavar="URL",
        default=None,
        help="database URL, e.g. postgresql://user@host/db, mysql://user@host/db, "
        "sqlite:///path.sqlite (default: $AGBOSS_DATABASE_URL, else "
        "sqlite:///.agboss/agboss.sqlite)",
    )


def database_url(args: argparse.Namespace) -> str:
    """The URL a subcommand works on: `--url`, else `AGBOSS_DATABASE_URL`, else the default."""
    from agboss_sql.sql.migrate import resolve_url

    return resolve_url(args.url)


def shown(url: str) -> str:
    """A URL as it may be printed: without its password (a SQLite path as written, not
    percent-encoded: `sqlite:///:memory:`)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"{parsed.drivername}:///{parsed.database or ''}"
    return parsed.render_as_string(hide_password=True)


def existing_database(args: argparse.Namespace) -> str:
    """The URL a read-only subcommand works on, refused when it names a SQLite file that
    does not exist: a read never creates a database."""
    from agboss_sql.sql.migrate import missing_sqlite_file

    url = database_url(args)
    missing = missing_sqlite_file(url)
    if missing is not None:
        raise CommandFailed(
            f"no database at {missing} (this command never creates one): "
            f"`{PROG} upgrade --url {shown(url)}` creates and migrates it"
        )
    return url


def require_head(url: str) -> str:
    """The database's revision, refused unless it is the head (the agboss tables exist
    and are current), with the command that brings it there."""
    from agboss_sql.sql import migrate

    revision, head = migrate.current(url), migrate.head()
    if revision != head:
        raise CommandFailed(_behind(url, revision, head))
    return head


def _behind(url: str, revision: str | None, head: str) -> str:
    """What is wrong with a database not at `head`, and what to run."""
    if revision is None:
        return f"{shown(url)} has no agboss schema revision recorded: {_advice(url, revision)}"
    return f"{shown(url)} is at schema revision {revision}, behind {head}: {_advice(url, revision)}"


def _advice(url: str, revision: str | None) -> str:
    """The command that brings a database not at the head there: `stamp` for agboss
    tables without a recorded revision, else `upgrade`."""
    from agboss_sql.sql import migrate

    if revision is None and migrate.agboss_tables(url):
        return (
            f"its agboss tables were made without these migrations: if they are the current "
            f"schema, run `{PROG} stamp --url {shown(url)}` (it compares them first)"
        )
    if revision is None:
        return (
            f"run `{PROG} upgrade --url {shown(url)}` (or `{PROG} stamp` to adopt tables "
            "made another way)"
        )
    return f"run `{PROG} upgrade --url {shown(url)}`"


def _revision(revision: object) -> str:
    return "base (no schema)" if revision is None else str(revision)


def _select(expression: object) -> object:
    import sqlalchemy as sa

    return sa.select(expression)  # type: ignore[call-overload]
