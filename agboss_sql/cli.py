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


# --- check -----------------------------------------------------------------------------


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--strict", action="store_true", help="an opted-out fencing store is an error"
    )


def _check(args: argparse.Namespace) -> int:
    import asyncio

    return asyncio.run(_check_async(database_url(args), strict=args.strict))


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
        print(f"schema: {_revision(revision)}, head is {head}: run `{PROG} upgrade --url URL`")
    app = Application(
        "agboss-sql-check", sql_stores(), {DatabaseUrl: DatabaseUrl(url)}, strict=strict
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

    from agboss_sql.demo import run_demo

    url = database_url(args)
    print(f"demo on {shown(url)}")
    return asyncio.run(run_demo(url))


# --- worker ----------------------------------------------------------------------------


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    from agboss_sql.runtime.worker import worker_arguments

    add_url_argument(parser)
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help="a JSON file of worker settings (what `agboss-sql cluster` writes); "
        "its keys override the options",
    )
    worker_arguments(parser)


def _worker(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses
    import json
    import logging

    from agboss_sql.runtime.worker import WorkerConfig, config_of, run_worker

    config = config_of(args, database_url(args))
    if args.config is not None:
        with open(args.config, encoding="utf-8") as handle:
            given = json.load(handle)
        known = {f.name for f in dataclasses.fields(WorkerConfig)}
        config = dataclasses.replace(config, **{k: v for k, v in given.items() if k in known})
        config = dataclasses.replace(config, url=database_url_of(config.url))
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s {config.instance_id or 'worker'} %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(run_worker(config, commands=args.commands))


def database_url_of(url: str | None) -> str:
    """`url`, else `AGBOSS_DATABASE_URL`, else the default SQLite file."""
    from agboss_sql.sql.migrate import resolve_url

    return resolve_url(url)


# --- cluster ---------------------------------------------------------------------------


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--trees", type=int, default=20, help="trees submitted (default 20)")
    parser.add_argument("--fan-out", type=int, default=2, help="children per parent (default 2)")
    parser.add_argument("--depth", type=int, default=2, help="depth of the leaves (default 2)")
    parser.add_argument(
        "--pause-every", type=int, default=5, help="every Nth tree pauses for a decision (0: none)"
    )
    parser.add_argument("--lease-ms", type=int, default=3_000, help="lease length (default 3000)")
    parser.add_argument(
        "--max-concurrent-steps", type=int, default=4, help="step slots per worker (default 4)"
    )
    parser.add_argument("--step-ms", type=int, default=30, help="simulated work per step (ms)")
    parser.add_argument("--no-chaos", action="store_true", help="no kill, no freeze, no cancel")
    parser.add_argument("--timeout", type=float, default=240.0, help="bound of the run (s)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-live", action="store_true", help="no live view")


def _cluster(args: argparse.Namespace) -> int:
    import json

    from agboss_sql.cluster import ClusterConfig, live_view, render_report, run_cluster

    url = database_url(args)
    if url.startswith("sqlite") and "/.agboss/" in url:
        import os

        os.makedirs(".agboss", exist_ok=True)
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
    live = not args.json and not args.no_live and sys.stdout.isatty()
    update, close = live_view() if live else (None, None)
    try:
        report = run_cluster(config, view=update)
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
    parser.add_argument("--execution", help="the execution (tree root or child) id")
    parser.add_argument("--limit", type=int, default=20, help="recent events to show")


def _leases(args: argparse.Namespace) -> int:
    import asyncio

    return asyncio.run(_leases_async(database_url(args), args.tenant, args.execution, args.limit))


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
        if tenant and execution:
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
                        connection.ops.now_ms(),
                    ).where(leases.c.tenant_id == tenant, leases.c.execution_id == execution)
                )
            ).first()
            if row is None:
                print(f"{tenant}/{execution}: no lease")
            else:
                holder, epoch, expires_at, released, yielded, finished, closed, now = row
                state = (
                    "finished"
                    if finished
                    else f"closed ({closed})"
                    if closed
                    else "released"
                    if released
                    else "yielded"
                    if yielded
                    else f"live, {expires_at - now} ms left"
                    if expires_at > now
                    else "expired"
                )
                print(f"{tenant}/{execution}: {holder} at epoch {epoch}, {state}")
            events = list(await log.list(tenant, execution))
        else:
            events = list(await log.recent(limit))
        for event in events:
            taken = event.taken_over_from
            extra = f" from {taken.instance_id}@{taken.lease_epoch}" if taken else ""
            extra += f" ({event.reason})" if event.reason else ""
            print(
                f"{event.at} {event.tenant_id}/{event.execution_id} {event.instance_id} "
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

    from agboss_sql.bench import run_bench

    if args.scale:
        from agboss_sql.bench import run_scale

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
    from agboss_sql.testing.faults import SCENARIOS, FaultSettings, format_report, run_scenario
    from agboss_sql.testing.faults.suite import DEFAULT_STORES, dialect_of

    if args.list:
        for scenario in SCENARIOS.values():
            on = ", ".join(scenario.dialects) if scenario.dialects else "every database"
            print(f"{scenario.name:<22} ({on}) {scenario.doc}")
        return 0
    if args.repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {args.repeat}")
    url = database_url(args)
    dialect = dialect_of(url)
    names = args.scenario or [s.name for s in SCENARIOS.values() if s.runs_on(dialect)]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}: see `{PROG} faults --list`")
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
    "current": Subcommand("show the schema revision of a database", _current_arguments, _current),
    "history": Subcommand("list the schema revisions", _history_arguments, _history),
    "check": Subcommand(
        "readiness of the SQL stores, the schema revision and the database's clock skew",
        _check_arguments,
        _check,
    ),
    "cluster": Subcommand(
        "the main job: N worker processes on one database run a workload of trees through "
        "kills, a freeze and a cancel, then the run is audited from the database",
        _cluster_arguments,
        _cluster,
    ),
    "worker": Subcommand(
        "run one worker process (an application instance running trees, children, pauses "
        "and cancels on the shared database) until SIGTERM",
        _worker_arguments,
        _worker,
    ),
    "demo": Subcommand(
        "two instances keep both promises through a takeover (default: the local SQLite file)",
        _demo_arguments,
        _demo,
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
    ),
    "faults": Subcommand(
        "run the fault scenarios (real pod processes killed, frozen, stopped, cut off) "
        "and audit every promise after each",
        _faults_arguments,
        _faults,
    ),
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
