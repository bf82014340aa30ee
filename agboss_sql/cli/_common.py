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


def existing_database(args: argparse.Namespace, *, stores: bool = False) -> str:
    """The URL a read-only subcommand works on, refused when it names a SQLite file that
    does not exist: a read never creates a database. With `stores` (the command opens the
    stores, which keep a SQLite file in WAL mode), also refused when the file's directory
    is read-only."""
    from agboss_sql.sql.migrate import missing_sqlite_file, sqlite_file_problem

    url = database_url(args)
    missing = missing_sqlite_file(url)
    if missing is not None:
        raise CommandFailed(
            f"no database at {missing} (this command never creates one): "
            f"`{PROG} upgrade --url {shown(url)}` creates and migrates it"
        )
    problem = sqlite_file_problem(url, writes=False) if stores else None
    if problem is not None:
        raise CommandFailed(problem)
    return url


def writable_database(args: argparse.Namespace) -> str:
    """The URL a subcommand that writes works on, refused when it names a SQLite file that
    cannot be written (its directory read-only, a file where a directory must be), saying
    what to do."""
    return writable_url(database_url(args))


def make_sqlite_directory(url: str) -> None:
    """Make the directory of the SQLite file `url` names, if it names one (as `upgrade`
    does)."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)


def writable_url(url: str) -> str:
    """`url`, refused as `writable_database` refuses it."""
    from agboss_sql.sql.migrate import sqlite_file_problem

    problem = sqlite_file_problem(url)
    if problem is not None:
        raise CommandFailed(problem)
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


def refuse_collation(url: str, *, forced: bool = False, force_hint: bool = True) -> None:
    """Refuse (`FAILED`) a MySQL or MariaDB database whose agboss text is not collated
    `utf8mb4_bin` (keys that differ in case would be one key), with the statement that
    fixes it; nothing on the other databases, or when `forced`."""
    from agboss_sql.sql import migrate

    if forced:
        return
    found = migrate.collation(url)
    if found is None or found.ok:
        return
    statements = found.statements()
    more = (
        f" and {len(statements) - 1} more (`{PROG} check --url {shown(url)}` lists them)"
        if len(statements) > 1
        else ""
    )
    anyway = "; or run anyway with --force" if force_hint else ""
    raise CommandFailed(
        f"{shown(url)}: {found.problem()}: fix it with `{statements[0]}`{more}{anyway}"
    )


def collation_lines(url: str) -> tuple[bool, list[str]]:
    """`check`'s verdict and lines on the collation of a MySQL or MariaDB database: the
    collation when it is `utf8mb4_bin` throughout, else the problem then each statement
    that fixes it (on the other databases: true, no line)."""
    from agboss_sql.sql import migrate

    found = migrate.collation(url)
    if found is None:
        return True, []
    if found.ok:
        return True, [f"collation: {found.default} (as required)"]
    return False, [f"collation: {found.problem()}; fix it with:"] + [
        f"  {statement};" for statement in found.statements()
    ]


class HelpFormatter(argparse.HelpFormatter):
    """`--help` that gives every option's default: an option whose help does not say it
    already gets `(default: …)` (flags and options without a default excepted)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and "(default" not in text
            and "%(default)" not in text
            and default not in (None, False, True, argparse.SUPPRESS)
        ):
            text += " (default: %(default)s)"
        return text


def version() -> str:
    """The version of agboss-sql, as `agboss-sql --version` prints it."""
    from agboss_sql import __version__

    return f"{PROG} {__version__}"
