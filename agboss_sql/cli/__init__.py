"""The `agboss-sql` command.

Each subcommand is one `Subcommand` in `SUBCOMMANDS`: a function that adds its
arguments to its parser and a function that runs it and answers the exit
status. Adding one is writing those two functions (in the module of its group:
`_schema`, `_inspect`, `_views`, `_worker`, `_lab`) and one table entry; heavy imports stay
inside the run function, so `agboss-sql --help` stays fast.

A failure prints one line on stderr, `agboss-sql COMMAND: what is wrong: what to
do`, and exits 1 (2 for a misuse of the options, 130 when interrupted);
`--debug` prints the traceback instead (`_explain`). The read-only commands
(`current`, `history`, `check`, `leases`, `trees`, `show`, `queue`) never create a
database.

The library's commands import nothing from `agboss_sql.lab`. The lab's (`cluster`,
`demo`, `bench`, `faults`: `lab=True` in the table) import it when they run,
and exit 2 naming the `lab` extra when a module it needs is not installed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agboss_sql.cli._checkpoints import _import, _import_arguments
from agboss_sql.cli._common import (
    FAILED,
    INTERRUPTED,
    MISUSED,
    PROG,
    CommandFailed,
    HelpFormatter,
    Subcommand,
    add_url_argument,
    database_url,
    existing_database,
    require_head,
    require_lab,
    shown,
    version,
)
from agboss_sql.cli._explain import explain, shown_or
from agboss_sql.cli._inspect import (
    _check,
    _check_arguments,
    _leases,
    _leases_arguments,
    iso_ms,
    span_ms,
)
from agboss_sql.cli._lab import (
    _bench,
    _bench_arguments,
    _cluster,
    _cluster_arguments,
    _demo,
    _demo_arguments,
    _faults,
    _faults_arguments,
)
from agboss_sql.cli._schema import (
    _current,
    _current_arguments,
    _history,
    _history_arguments,
    _stamp,
    _stamp_arguments,
    _upgrade,
    _upgrade_arguments,
)
from agboss_sql.cli._views import (
    _queue,
    _queue_arguments,
    _show,
    _show_arguments,
    _trees,
    _trees_arguments,
)
from agboss_sql.cli._worker import WORKER_SETTINGS, _worker, _worker_arguments, database_url_of

SUBCOMMANDS: dict[str, Subcommand] = {
    "upgrade": Subcommand(
        "create or upgrade the agboss tables (safe to run from several instances at once)",
        _upgrade_arguments,
        _upgrade,
    ),
    "stamp": Subcommand(
        "record the revision of agboss tables made without these migrations (adopt a "
        "database that has the tables but no agboss_alembic_version), running nothing",
        _stamp_arguments,
        _stamp,
    ),
    "current": Subcommand(
        "show the schema revision of a database (exit 1 unless it is the head)",
        _current_arguments,
        _current,
    ),
    "history": Subcommand(
        "list the schema revisions (with --url: and the one a database is at)",
        _history_arguments,
        _history,
    ),
    "check": Subcommand(
        "readiness of the SQL stores, the schema revision and the database's clock skew",
        _check_arguments,
        _check,
    ),
    "cluster": Subcommand(
        "the main job: N worker processes on one database run a workload (the demo tree, "
        "or your app's) through kills, a freeze and a cancel, then the run is audited from "
        "the database",
        _cluster_arguments,
        _cluster,
        lab=True,
    ),
    "worker": Subcommand(
        "run a worker process of your workflow app (--app module:attr) on the shared "
        "database until SIGTERM: it runs, resumes and takes over the app's workflows",
        _worker_arguments,
        _worker,
    ),
    "demo": Subcommand(
        "two instances keep both promises through a takeover (default: the local SQLite file)",
        _demo_arguments,
        _demo,
        lab=True,
    ),
    "leases": Subcommand(
        "the lease log: recent moves, or one lease and its history (tell a zombie from a takeover)",
        _leases_arguments,
        _leases,
    ),
    "trees": Subcommand(
        "the trees: status, holder, epoch, age, children pending, pauses (read-only)",
        _trees_arguments,
        _trees,
    ),
    "show": Subcommand(
        "one tree: its steps, children, pauses, compensations and lease moves in one "
        "timeline (read-only)",
        _show_arguments,
        _show,
    ),
    "queue": Subcommand(
        "the child queue: depth by state, oldest waiting, claims per instance (read-only)",
        _queue_arguments,
        _queue,
    ),
    "import-threads": Subcommand(
        "bring LangGraph threads over from the saver that wrote them (SqliteSaver, "
        "PostgresSaver, PyMySQLSaver, or agboss-sql on another database) into the "
        "checkpoint saver on --url, every checkpoint and pending write, checked",
        _import_arguments,
        _import,
    ),
    "bench": Subcommand(
        "benchmark the hot operations beside the raw driver on the same database (it is "
        "migrated and its agboss tables emptied: use a database of its own)",
        _bench_arguments,
        _bench,
        lab=True,
    ),
    "faults": Subcommand(
        "run the fault scenarios (real pod processes killed, frozen, stopped, cut off) "
        "and audit every promise after each",
        _faults_arguments,
        _faults,
        lab=True,
    ),
}
"""Every subcommand, by name, in the order `--help` lists them."""


def parser() -> argparse.ArgumentParser:
    """The command line parser, with a subparser per entry of `SUBCOMMANDS`."""
    top = argparse.ArgumentParser(
        prog=PROG,
        description="Durable stores on SQLite, PostgreSQL and MySQL/MariaDB.",
        formatter_class=HelpFormatter,
    )
    top.add_argument("--version", action="version", version=version())
    top.add_argument("--debug", action="store_true", help="on a failure, print the traceback")
    # Accepted after the subcommand too; SUPPRESS keeps a top-level --debug from being reset.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on a failure, print the traceback",
    )
    subparsers = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, subcommand in SUBCOMMANDS.items():
        sub = subparsers.add_parser(
            name,
            help=subcommand.help,
            description=subcommand.help,
            parents=[common],
            formatter_class=HelpFormatter,
        )
        subcommand.arguments(sub)
        sub.set_defaults(run=subcommand.run, lab_command=subcommand.lab)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: `sys.argv[1:]`); answer the exit status.

    Every failure prints one line on stderr, `agboss-sql COMMAND: what is wrong: what to
    do`, and answers `FAILED` (`MISUSED` for options that do not go together,
    `INTERRUPTED` for Ctrl-C); with `--debug` the traceback follows the line."""
    args = parser().parse_args(argv)
    try:
        if args.lab_command:
            require_lab()
        status: int = args.run(args)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        status = exc.status if isinstance(exc, CommandFailed) else FAILED
        line = str(exc) if isinstance(exc, CommandFailed) else explain(exc, args)
        print(f"{PROG} {args.command}: {line}", file=sys.stderr)
        if args.debug:
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        return status
    return status


__all__ = [
    "FAILED",
    "INTERRUPTED",
    "MISUSED",
    "PROG",
    "SUBCOMMANDS",
    "WORKER_SETTINGS",
    "CommandFailed",
    "Subcommand",
    "add_url_argument",
    "database_url",
    "database_url_of",
    "existing_database",
    "explain",
    "iso_ms",
    "main",
    "parser",
    "require_head",
    "require_lab",
    "shown",
    "shown_or",
    "span_ms",
]
