"""The `agboss-sql` command.

Each subcommand is one `Subcommand` in `SUBCOMMANDS`: a function that adds its
arguments to its parser and a function that runs it and answers the exit
status. Adding one is writing those two functions and one table entry; heavy
imports stay inside the run function, so `agboss-sql --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROG = "agboss-sql"


@dataclass(frozen=True, slots=True)
class Subcommand:
    """One subcommand: its help line, how it adds its arguments, how it runs."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


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
    """A URL as it may be printed: without its password."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# --- upgrade ---------------------------------------------------------------------------


def _upgrade_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument("--revision", default="head", help="revision to upgrade to (default: head)")


def _upgrade(args: argparse.Namespace) -> int:
    from agboss_sql.sql import migrate

    url = database_url(args)
    done = migrate.upgrade(url, args.revision)
    if done.changed:
        print(f"upgraded {shown(url)}: {_revision(done.before)} -> {_revision(done.after)}")
    else:
        print(f"{shown(url)} is already at {_revision(done.after)}: nothing to do")
    return 0


# --- current ---------------------------------------------------------------------------


def _current_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)


def _current(args: argparse.Namespace) -> int:
    from agboss_sql.sql import migrate

    url = database_url(args)
    revision = migrate.current(url)
    head = migrate.head()
    state = "up to date" if revision == head else f"behind head {head}: run `{PROG} upgrade`"
    print(f"{shown(url)}: {_revision(revision)} ({state})")
    return 0


# --- history ---------------------------------------------------------------------------


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def _history(args: argparse.Namespace) -> int:
    from alembic.script import ScriptDirectory

    from agboss_sql.sql import migrate

    scripts = ScriptDirectory(str(migrate.script_location()))
    for script in scripts.walk_revisions():
        mark = " (head)" if script.is_head else ""
        print(f"{_revision(script.down_revision)} -> {script.revision}{mark}: {script.doc}")
    return 0


def _revision(revision: object) -> str:
    return "base (no schema)" if revision is None else str(revision)


SUBCOMMANDS: dict[str, Subcommand] = {
    "upgrade": Subcommand(
        "create or upgrade the agboss tables (safe to run from several instances at once)",
        _upgrade_arguments,
        _upgrade,
    ),
    "current": Subcommand("show the schema revision of a database", _current_arguments, _current),
    "history": Subcommand("list the schema revisions", _history_arguments, _history),
}
"""Every subcommand, by name, in the order `--help` lists them."""


def parser() -> argparse.ArgumentParser:
    """The command line parser, with a subparser per entry of `SUBCOMMANDS`."""
    top = argparse.ArgumentParser(
        prog=PROG, description="Durable stores on SQLite, PostgreSQL and MySQL/MariaDB."
    )
    subparsers = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, subcommand in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=subcommand.help, description=subcommand.help)
        subcommand.arguments(sub)
        sub.set_defaults(run=subcommand.run)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: `sys.argv[1:]`); answer the exit status.
    An expected failure (a database that cannot be reached or migrated, a bad URL or
    revision) prints the subcommand and its cause, without a traceback, and answers 1."""
    args = parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except Exception as exc:
        if not _is_expected_failure(exc):
            raise
        print(f"{PROG} {args.command}: {_cause(exc)}", file=sys.stderr)
        return 1
    return status


def _cause(exc: Exception) -> str:
    # A driver error says it best; SQLAlchemy's wrapper adds the statement and a link.
    cause = getattr(exc, "orig", None) or exc
    return f"{type(cause).__name__}: {cause}"


def _is_expected_failure(exc: Exception) -> bool:
    """A database that cannot be reached or migrated, a bad URL or revision: reported
    without a traceback. Anything else is a bug and keeps its traceback."""
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    return isinstance(exc, (SQLAlchemyError, CommandError, OSError, ValueError))


if __name__ == "__main__":
    raise SystemExit(main())
