"""The schema subcommands of `agboss-sql`: `upgrade`, `stamp`, `current`, `history`."""

from __future__ import annotations

import argparse

from agboss_sql.cli._common import (
    MISUSED,
    PROG,
    CommandFailed,
    _behind,
    _revision,
    add_url_argument,
    database_url,
    existing_database,
    refuse_collation,
    shown,
    writable_database,
)

# --- upgrade ---------------------------------------------------------------------------


def _upgrade_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--revision",
        default="head",
        help="revision to upgrade to, as `history` lists them (default: %(default)s)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="upgrade a MySQL/MariaDB database even though its text is not collated utf8mb4_bin",
    )
    parser.add_argument(
        "--lock-ms",
        type=int,
        default=None,
        metavar="MS",
        help="how long a statement of the migration waits for a lock another session holds "
        "(an application's open transaction on a table it alters) before the upgrade stops, "
        "in milliseconds (whole seconds on MySQL/MariaDB; default: 10000)",
    )


def _upgrade(args: argparse.Namespace) -> int:
    from agboss_sql.sql import migrate

    url = writable_database(args)
    refuse_collation(url, forced=args.force)
    known_revision(args.revision)
    if args.lock_ms is not None and args.lock_ms < 1:
        raise CommandFailed(f"--lock-ms must be at least 1, not {args.lock_ms}", MISUSED)
    lock_ms = migrate.LOCK_MS if args.lock_ms is None else args.lock_ms
    done = migrate.upgrade(url, args.revision, lock_ms=lock_ms)
    if done.changed:
        print(f"upgraded {shown(url)}: {_revision(done.before)} -> {_revision(done.after)}")
    else:
        print(f"{shown(url)} is already at {_revision(done.after)}: nothing to do")
    return 0


def known_revision(revision: str) -> None:
    """Refuse (`MISUSED`) a `--revision` that names no revision of the project, pointing
    to `history`."""
    from alembic.script import ScriptDirectory

    from agboss_sql.sql import migrate

    if revision in ("head", "heads", "base") or revision[:1] in ("+", "-"):
        return  # Alembic's names and relative steps, which it checks itself
    scripts = ScriptDirectory(str(migrate.script_location()))
    try:
        found = scripts.get_revisions(revision)
    except Exception:
        found = ()
    if not found:
        raise CommandFailed(
            f"--revision {revision!r} is no revision of the agboss schema: `{PROG} history` "
            f"lists them (the newest is {migrate.head()}; give its full id, or `head`)",
            MISUSED,
        )


# --- stamp -----------------------------------------------------------------------------


def _stamp_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--revision", default="head", help="the revision the tables match (default: head)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="record the revision even when no agboss table exists or the tables differ "
        "from the head's schema",
    )


def _stamp(args: argparse.Namespace) -> int:
    from agboss_sql.sql import migrate

    url = writable_database(args)
    known_revision(args.revision)
    done = migrate.stamp(url, args.revision, force=args.force)
    if done.changed:
        print(f"stamped {shown(url)}: {_revision(done.before)} -> {_revision(done.after)}")
    else:
        print(f"{shown(url)} is already stamped {_revision(done.after)}: nothing to do")
    return 0


# --- current ---------------------------------------------------------------------------


def _current_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)


def _current(args: argparse.Namespace) -> int:
    from agboss_sql.sql import migrate

    url = existing_database(args)
    revision = migrate.current(url)
    head = migrate.head()
    if revision != head:
        raise CommandFailed(_behind(url, revision, head))
    print(f"{shown(url)}: {_revision(revision)} (up to date)")
    return 0


# --- history ---------------------------------------------------------------------------


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        metavar="URL",
        default=None,
        help="also mark the revision this database is at (without --url no database is read)",
    )


def _history(args: argparse.Namespace) -> int:
    from alembic.script import ScriptDirectory

    from agboss_sql.sql import migrate

    at: str | None = None
    if args.url is not None:
        at = migrate.current(existing_database(args))
    scripts = ScriptDirectory(str(migrate.script_location()))
    for script in scripts.walk_revisions():
        marks = [
            m for m, on in (("head", script.is_head), ("current", script.revision == at)) if on
        ]
        mark = f" ({', '.join(marks)})" if marks else ""
        print(f"{_revision(script.down_revision)} -> {script.revision}{mark}: {script.doc}")
    if args.url is not None and at is None:
        print(f"{shown(database_url(args))}: base (no schema)")
    return 0
