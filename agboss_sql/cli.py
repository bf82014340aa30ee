"""The `agboss-sql` command.

Each subcommand is one `Subcommand` in `SUBCOMMANDS`: a function that adds its
arguments to its parser and a function that runs it and answers the exit
status. Adding one is writing those two functions and one table entry; heavy
imports stay inside the run function, so `agboss-sql --help` stays fast.

A failure prints one line on stderr, `agboss-sql COMMAND: what is wrong: what to
do`, and exits 1 (2 for a misuse of the options, 130 when interrupted);
`--debug` prints the traceback instead. The read-only commands (`current`,
`history`, `check`, `leases`) never create a database.

The library's commands import nothing from `agboss_sql.lab`. The lab's (`cluster`,
`demo`, `bench`, `faults`: `lab=True` in the table) import it when they run,
and exit 2 naming the `lab` extra when a module it needs is not installed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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

    url = database_url(args)
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


def _revision(revision: object) -> str:
    return "base (no schema)" if revision is None else str(revision)


# --- check -----------------------------------------------------------------------------


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--strict", action="store_true", help="an opted-out fencing store is an error"
    )


def _check(args: argparse.Namespace) -> int:
    import asyncio

    return asyncio.run(_check_async(existing_database(args), strict=args.strict))


async def _check_async(url: str, *, strict: bool) -> int:
    import time

    from agboss_sql.application import Application, DatabaseUrl, HealthStatus, sql_stores
    from agboss_sql.sql import migrate
    from agboss_sql.sql.connection import SqlConnection

    print(f"database: {shown(url)}")
    healthy = True
    revision, head = migrate.current(url), migrate.head()
    if revision == head:
        print(f"schema: {revision} (head)")
    else:
        healthy = False
        print(f"schema: {_revision(revision)}, head is {head}: {_advice(url, revision)}")
    # The report says what is wrong with the schema; start() would refuse it instead.
    app = Application(
        "agboss-sql-check",
        sql_stores(),
        {DatabaseUrl: DatabaseUrl(url)},
        strict=strict,
        require_schema=False,
    )
    await app.start()
    try:
        report = await app.check_readiness()
        print(report)
        healthy = healthy and report.status is HealthStatus.UP
        connection = SqlConnection(url)
        try:
            now = connection.ops.now_ms()
            sent = time.time_ns() / 1e6
            database_now = (await connection.execute(_select(now))).scalar()
            received = time.time_ns() / 1e6
        finally:
            await connection.close()
        skew = float(database_now or 0) - (sent + received) / 2
        print(
            f"clock skew: the database's clock is {skew:+.0f} ms from this host's "
            f"(round trip {received - sent:.1f} ms); leases are decided by the database's clock"
        )
    finally:
        await app.close()
    print("ready" if healthy else "NOT ready")
    return 0 if healthy else 1


def _select(expression: object) -> object:
    import sqlalchemy as sa

    return sa.select(expression)  # type: ignore[call-overload]


# --- demo ------------------------------------------------------------------------------


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)


def _demo(args: argparse.Namespace) -> int:
    import asyncio

    from agboss_sql.lab.demo import run_demo

    url = database_url(args)
    print(f"demo on {shown(url)}", flush=True)
    return asyncio.run(run_demo(url))


# --- worker ----------------------------------------------------------------------------


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        default=None,
        help="the Workflows app to run, e.g. shop.app:app (importable from the current "
        "directory or PYTHONPATH)",
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help="a JSON file of worker settings (url, app, instance_id, lease_ms, "
        "max_concurrent_steps, shutdown_ms: what `agboss-sql cluster` writes); its keys "
        "override the options",
    )
    parser.add_argument("--instance-id", default=None, help="this instance's id")
    parser.add_argument(
        "--lease-ms", type=int, default=30_000, help="lease length (default: %(default)s)"
    )
    parser.add_argument(
        "--max-concurrent-steps",
        type=int,
        default=8,
        help="steps at once in this process (default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-ms",
        type=int,
        default=10_000,
        help="graceful stop bound on SIGTERM (default: %(default)s)",
    )
    parser.add_argument(
        "--commands",
        action="store_true",
        help="read commands (JSON lines: start, cancel, resume, stop) from standard input "
        "and write events as JSON lines; standard input closing stops the worker (what "
        "`agboss-sql cluster` uses)",
    )
    parser.add_argument(
        "--events", action="store_true", help="write what the engine does as JSON lines"
    )


WORKER_SETTINGS = ("url", "app", "instance_id", "lease_ms", "max_concurrent_steps", "shutdown_ms")
"""The keys of a worker's `--config` file (others, such as the cluster's own, are ignored)."""


def _worker(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import logging

    from agboss_sql.runtime.serve import load_workflows, serve

    settings = {name: getattr(args, name) for name in WORKER_SETTINGS}
    if args.config is not None:
        with open(args.config, encoding="utf-8") as handle:
            given = json.load(handle)
        settings.update({k: v for k, v in given.items() if k in WORKER_SETTINGS})
    if not settings["app"]:
        raise CommandFailed(
            "no app to run: name the Workflows app with --app module:attr (e.g. "
            "--app shop.app:app; examples/order_saga has one)",
            MISUSED,
        )
    for name in ("lease_ms", "max_concurrent_steps", "shutdown_ms"):
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CommandFailed(f"--{name.replace('_', '-')} must be a positive integer", MISUSED)
    url = database_url_of(settings["url"])
    workflows = load_workflows(str(settings["app"]))
    instance = settings["instance_id"]
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s {instance or 'worker'} %(levelname)s %(name)s: %(message)s",
    )
    quiet = args.commands or args.events

    def ready(engine: Any) -> None:
        if not quiet:
            print(
                f"worker {engine.instance_id} on {shown(url)}: running {workflows.names} "
                f"(lease {settings['lease_ms']} ms, {settings['max_concurrent_steps']} steps "
                "at once); SIGTERM or Ctrl-C stops it",
                flush=True,
            )

    return asyncio.run(
        serve(
            workflows,
            url=url,
            instance_id=instance,
            lease_ms=int(settings["lease_ms"]),
            max_concurrent_steps=int(settings["max_concurrent_steps"]),
            shutdown_ms=int(settings["shutdown_ms"]),
            commands=args.commands,
            events=args.events,
            on_ready=ready,
        )
    )


def database_url_of(url: str | None) -> str:
    """`url`, else `AGBOSS_DATABASE_URL`, else the default SQLite file."""
    from agboss_sql.sql.migrate import resolve_url

    return resolve_url(url)


# --- cluster ---------------------------------------------------------------------------


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--workload",
        default="tree",
        metavar="tree|MODULE:ATTR",
        help="what the workers run: the demo tree, or a ClusterWorkload of your own app "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--workers", type=int, default=3, help="worker processes (default: %(default)s)"
    )
    parser.add_argument("--trees", type=int, default=20, help="runs started (default: %(default)s)")
    parser.add_argument(
        "--fan-out", type=int, default=2, help="tree: children per parent (default: %(default)s)"
    )
    parser.add_argument(
        "--depth", type=int, default=2, help="tree: depth of the leaves (default: %(default)s)"
    )
    parser.add_argument(
        "--pause-every",
        type=int,
        default=5,
        help="tree: every Nth tree pauses for a decision, 0 for none (default: %(default)s)",
    )
    parser.add_argument(
        "--lease-ms", type=int, default=3_000, help="lease length (default: %(default)s)"
    )
    parser.add_argument(
        "--max-concurrent-steps",
        type=int,
        default=4,
        help="step slots per worker (default: %(default)s)",
    )
    parser.add_argument(
        "--step-ms",
        type=int,
        default=30,
        help="tree: simulated work per step, ms (default: %(default)s)",
    )
    parser.add_argument("--no-chaos", action="store_true", help="no kill, no freeze, no cancel")
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="bound of the run, s (default: %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-live", action="store_true", help="no live view")


def _cluster(args: argparse.Namespace) -> int:
    import json

    from agboss_sql.lab.cluster import (
        ClusterConfig,
        live_view,
        load_workload,
        render_report,
        run_cluster,
    )

    url = database_url(args)
    if url.startswith("sqlite") and "/.agboss/" in url:
        import os

        os.makedirs(".agboss", exist_ok=True)
    try:
        workload = load_workload(args.workload)
        config = ClusterConfig(
            url=url,
            workers=args.workers,
            trees=args.trees,
            fan_out=args.fan_out,
            depth=args.depth,
            pause_every=args.pause_every,
            lease_ms=args.lease_ms,
            max_concurrent_steps=args.max_concurrent_steps,
            step_ms=args.step_ms,
            chaos=not args.no_chaos,
            cancel=not args.no_chaos,
            timeout_s=args.timeout,
        )
    except (ValueError, ImportError) as exc:
        raise CommandFailed(str(exc), MISUSED) from exc
    live = not args.json and not args.no_live and sys.stdout.isatty()
    update, close = live_view() if live else (None, None)
    try:
        report = run_cluster(config, workload, view=update)
    finally:
        if close is not None:
            close()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(render_report(report))
    return 0 if report.ok else 1


# --- leases ----------------------------------------------------------------------------


def _leases_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument("--tenant", help="with --execution: one lease and its whole log")
    parser.add_argument("--execution", help="with --tenant: the execution (tree root or child) id")
    parser.add_argument("--limit", type=int, default=20, help="recent events to show")


def _leases(args: argparse.Namespace) -> int:
    import asyncio

    if (args.tenant is None) != (args.execution is None):
        given, missing = ("--tenant", "--execution") if args.tenant else ("--execution", "--tenant")
        raise CommandFailed(
            f"{given} needs {missing}: a lease is named by both (without either, the recent "
            "moves of every lease are shown)",
            MISUSED,
        )
    if args.limit < 1:
        raise CommandFailed(f"--limit must be at least 1, got {args.limit}", MISUSED)
    url = existing_database(args)
    require_head(url)
    return asyncio.run(_leases_async(url, args.tenant, args.execution, args.limit))


def iso_ms(epoch_ms: int) -> str:
    """An epoch-millisecond time as ISO 8601 in UTC, to the millisecond."""
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def span_ms(ms: int) -> str:
    """A duration for a person: `850 ms`, `12.5 s`, `7 min`, `3.0 h`, `2.0 d`."""
    ms = abs(ms)
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{ms // 60_000} min"
    if ms < 86_400_000:
        return f"{ms / 3_600_000:.1f} h"
    return f"{ms / 86_400_000:.1f} d"


async def _leases_async(url: str, tenant: str | None, execution: str | None, limit: int) -> int:
    import sqlalchemy as sa

    from agboss_sql.contracts import ApplicationContext, StoreClock
    from agboss_sql.sql.connection import SqlConnection
    from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
    from agboss_sql.sql.schema import execution_leases as leases

    connection = SqlConnection(url)
    try:
        log = SqlExecutionLeaseEventRepository(
            connection, StoreClock(), ApplicationContext("agboss-sql-leases")
        )
        # Ages are measured on the database's clock, the one that decides the leases.
        now = int((await connection.execute(_select(connection.ops.now_ms()))).scalar() or 0)
        print(f"database time: {iso_ms(now)}")
        if tenant is not None and execution is not None:
            row = (
                await connection.execute(
                    sa.select(
                        leases.c.holder_instance_id,
                        leases.c.lease_epoch,
                        leases.c.expires_at,
                        leases.c.released,
                        leases.c.yielded,
                        leases.c.finished,
                        leases.c.closed_reason,
                    ).where(leases.c.tenant_id == tenant, leases.c.execution_id == execution)
                )
            ).first()
            if row is None:
                print(f"{tenant}/{execution}: no lease")
            else:
                holder, epoch, expires_at, released, yielded, finished, closed = row
                if finished:
                    state = "finished"
                elif closed:
                    state = f"closed ({closed})"
                elif released:
                    state = "released"
                elif yielded:
                    state = "yielded"
                elif expires_at > now:
                    state = f"live, expires {iso_ms(expires_at)} (in {span_ms(expires_at - now)})"
                else:
                    state = f"expired {iso_ms(expires_at)} ({span_ms(now - expires_at)} ago)"
                print(f"{tenant}/{execution}: {holder} at epoch {epoch}, {state}")
            events = list(await log.list(tenant, execution))
        else:
            events = list(await log.recent(limit))
            if not events:
                print("no lease moves recorded yet")
        for event in events:
            taken = event.taken_over_from
            extra = f" from {taken.instance_id}@{taken.lease_epoch}" if taken else ""
            extra += f" ({event.reason})" if event.reason else ""
            print(
                f"{iso_ms(event.at)} ({span_ms(now - event.at)} ago) "
                f"{event.tenant_id}/{event.execution_id} {event.instance_id} "
                f"epoch {event.lease_epoch} {event.kind}{extra}"
            )
        # A zombie is an instance acting at an epoch below the lease's current one.
        return 0
    finally:
        await connection.close()


# --- bench -----------------------------------------------------------------------------


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument("--ops", type=int, default=500, help="operations per run")
    parser.add_argument("--runs", type=int, default=3, help="runs (the median is reported)")
    parser.add_argument("--only", help="comma-separated operations, e.g. lease.acquire")
    parser.add_argument(
        "--scale",
        metavar="ROWS",
        help="instead: lease take and child claim p50 with ROWS rows already in the table "
        "(comma-separated powers of ten, e.g. 1000,100000,1000000)",
    )


def _bench(args: argparse.Namespace) -> int:
    import asyncio

    from agboss_sql.lab.bench import run_bench

    if args.scale:
        from agboss_sql.lab.bench import run_scale

        sizes = [int(size) for size in args.scale.split(",")]
        print(asyncio.run(run_scale(database_url(args), sizes, ops=args.ops)))
        return 0
    only = set(args.only.split(",")) if args.only else None
    print(asyncio.run(run_bench(database_url(args), ops=args.ops, runs=args.runs, only=only)))
    return 0


# --- faults ----------------------------------------------------------------------------


def _faults_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="run only this scenario (repeatable; default: every scenario of the dialect)",
    )
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per scenario")
    parser.add_argument("--pods", type=int, default=3, help="pod processes (default: 3)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=10.0,
        help="how much faster the pods' clocks run than the host's (default: 10)",
    )
    parser.add_argument(
        "--stores",
        default=None,
        metavar="MODULE:FUNCTION",
        help="the store set factory each pod calls as factory(url, pod) "
        "(default: the project's SQL stores)",
    )
    parser.add_argument(
        "--dump-dir",
        default=None,
        help="where a failed run's events, store history and pod output go "
        "(default: $AGBOSS_FAULT_DUMP_DIR)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")


def _faults(args: argparse.Namespace) -> int:
    from agboss_sql.lab.faults import SCENARIOS, FaultSettings, format_report, run_scenario
    from agboss_sql.lab.faults.suite import DEFAULT_STORES, dialect_of

    if args.list:
        for scenario in SCENARIOS.values():
            on = ", ".join(scenario.dialects) if scenario.dialects else "every database"
            print(f"{scenario.name:<22} ({on}) {scenario.doc}")
        return 0
    if args.repeat < 1:
        raise CommandFailed(f"--repeat must be at least 1, got {args.repeat}", MISUSED)
    url = database_url(args)
    dialect = dialect_of(url)
    names = args.scenario or [s.name for s in SCENARIOS.values() if s.runs_on(dialect)]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise CommandFailed(
            f"unknown scenario(s) {', '.join(unknown)}: see `{PROG} faults --list`", MISUSED
        )
    settings = FaultSettings(pods=args.pods, time_scale=args.time_scale)
    results = []
    width = 20
    print(f"fault suite on {shown(url)}: {len(names)} scenario(s) x {args.repeat} run(s)")
    for name in names:
        failed = 0
        for run in range(1, args.repeat + 1):
            result = run_scenario(
                url,
                name,
                stores=args.stores or DEFAULT_STORES,
                settings=settings,
                dump_dir=args.dump_dir,
            )
            results.append(result)
            failed += not result.passed
            done = width * run // args.repeat
            print(
                f"{name:<22} [{'#' * done}{'.' * (width - done)}] {run}/{args.repeat} "
                f"{'passed' if result.passed else 'FAILED'} in {result.seconds:.1f} s"
                + (f" ({failed} failed so far)" if failed else ""),
                flush=True,
            )
    print()
    print(format_report(results, title=f"fault suite on {shown(url)} ({dialect})"))
    return 0 if all(r.passed for r in results) else 1


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
        prog=PROG, description="Durable stores on SQLite, PostgreSQL and MySQL/MariaDB."
    )
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
            name, help=subcommand.help, description=subcommand.help, parents=[common]
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


if __name__ == "__main__":
    raise SystemExit(main())
