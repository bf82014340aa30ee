"""The lab's subcommands of `agboss-sql` (`demo`, `cluster`, `bench`, `faults`): each
imports `agboss_sql.lab` inside its run function only, so building the parser never does."""

from __future__ import annotations

import argparse
import re
import sys

from agboss_sql.cli._common import (
    MISUSED,
    PROG,
    CommandFailed,
    add_url_argument,
    database_url,
    make_sqlite_directory,
    refuse_collation,
    shown,
    writable_database,
)

# --- demo ------------------------------------------------------------------------------


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)


def _demo(args: argparse.Namespace) -> int:
    import asyncio

    from agboss_sql.lab.demo import run_demo

    url = writable_database(args)
    refuse_collation(url, force_hint=False)
    print(f"demo on {shown(url)}", flush=True)
    return asyncio.run(run_demo(url))


# --- cluster ---------------------------------------------------------------------------


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        metavar="URL",
        action="append",
        default=None,
        help="database URL (default: $AGBOSS_DATABASE_URL, else "
        "sqlite:///.agboss/agboss.sqlite); for a cluster of MySQL/MariaDB nodes (Galera), "
        "each node's URL (repeat --url, or separate them by commas): the workers are spread "
        "over the nodes, each failing over to the next ones when its node is gone",
    )
    parser.add_argument(
        "--workload",
        default="tree",
        metavar="tree|langgraph|MODULE:ATTR",
        help="what the workers run: the demo tree, the LangGraph agent (needs langgraph), "
        "or a ClusterWorkload of your own app (default: %(default)s)",
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
        default=100,
        help="tree: simulated work per step, ms (default: %(default)s)",
    )
    parser.add_argument("--no-chaos", action="store_true", help="no kill, no freeze, no cancel")
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="bound of the run, s (default: %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-live", action="store_true", help="no live view")


def _check_cluster_options(args: argparse.Namespace) -> None:
    """Refuse (`MISUSED`) the options a cluster run cannot use, naming the option."""
    least = {
        "--workers": (args.workers, 1),
        "--trees": (args.trees, 1),
        "--fan-out": (args.fan_out, 1),
        "--depth": (args.depth, 1),
        "--pause-every": (args.pause_every, 0),
        "--lease-ms": (args.lease_ms, 1),
        "--max-concurrent-steps": (args.max_concurrent_steps, 1),
        "--step-ms": (args.step_ms, 0),
    }
    for option, (value, bound) in least.items():
        if value < bound:
            raise CommandFailed(f"{option} must be at least {bound}, got {value}", MISUSED)
    if not args.timeout > 0:
        raise CommandFailed(f"--timeout must be above 0 s, got {args.timeout:g}", MISUSED)
    if not args.no_chaos and args.workers < 3:
        raise CommandFailed(
            f"--workers {args.workers} is too few for the chaos (one worker killed, one "
            "frozen, one left sane): give --workers 3 or more, or add --no-chaos",
            MISUSED,
        )


def _cluster_nodes(given: list[str] | None) -> list[str]:
    """The URLs `--url` gave (each may list several, comma-separated); a list of several is
    refused (`MISUSED`) when it cannot be one cluster's nodes (`nodes_problem`)."""
    from agboss_sql.lab.workload import nodes_problem

    # Split only before a scheme: a URL's own query may hold commas (failover=a:1,b:2).
    nodes = [
        part.strip()
        for item in given or ()
        for part in re.split(r",(?=\s*[A-Za-z][A-Za-z0-9+]*://)", item)
        if part.strip()
    ]
    if len(nodes) > 1:
        try:
            problem = nodes_problem(nodes)
        except Exception as exc:  # an unparsable URL: sqlalchemy.exc.ArgumentError
            raise CommandFailed(f"--url: {exc}", MISUSED) from exc
        if problem is not None:
            raise CommandFailed(f"--url: {problem}", MISUSED)
    return nodes


def _cluster(args: argparse.Namespace) -> int:
    import json

    from agboss_sql.lab.cluster import (
        ClusterConfig,
        WorkerStartError,
        live_view,
        load_workload,
        render_report,
        run_cluster,
    )

    _check_cluster_options(args)
    nodes = _cluster_nodes(args.url)
    args.url = nodes[0] if nodes else None
    url = writable_database(args)
    refuse_collation(url, force_hint=False)
    if url.startswith("sqlite") and url.rstrip("/").endswith(":memory:"):
        raise CommandFailed(
            f"{shown(url)} is a database of one process: the workers are processes of "
            "their own and must share one database: give a file (--url "
            "sqlite:///.agboss/cluster.sqlite) or a server",
            MISUSED,
        )
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
            nodes=tuple(nodes) if len(nodes) > 1 else (),
        )
    except (ValueError, ImportError) as exc:
        raise CommandFailed(str(exc), MISUSED) from exc
    make_sqlite_directory(url)
    live = not args.json and not args.no_live and sys.stdout.isatty()
    update, close = live_view() if live else (None, None)
    try:
        report = run_cluster(config, workload, view=update)
    except WorkerStartError as exc:
        raise CommandFailed(str(exc)) from exc
    finally:
        if close is not None:
            close()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(render_report(report))
    return 0 if report.ok else 1


# --- bench -----------------------------------------------------------------------------


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--ops", type=int, default=500, help="operations per run (default: %(default)s)"
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="runs, the median reported (default: %(default)s)"
    )
    parser.add_argument("--only", help="comma-separated operations, e.g. lease.acquire")
    parser.add_argument(
        "--scale",
        metavar="ROWS",
        help="instead: lease take and child claim p50 with ROWS rows already in the table "
        "(comma-separated powers of ten, e.g. 1000,100000,1000000)",
    )


def _bench(args: argparse.Namespace) -> int:
    import asyncio

    from agboss_sql.lab.bench import Bench, run_bench

    for option, value in (("--ops", args.ops), ("--runs", args.runs)):
        if value < 1:
            raise CommandFailed(f"{option} must be at least 1, got {value}", MISUSED)
    if args.scale:
        from agboss_sql.lab.bench import run_scale

        sizes = [_scale_size(size) for size in args.scale.split(",")]
        print(asyncio.run(run_scale(writable_database(args), sizes, ops=args.ops)))
        return 0
    only = set(args.only.split(",")) if args.only else None
    known = [name for name, _ in Bench(database_url(args)).cases()]
    unknown = sorted((only or set()) - set(known))
    if unknown:
        raise CommandFailed(
            f"--only {','.join(unknown)}: no such operation; the operations are {', '.join(known)}",
            MISUSED,
        )
    print(asyncio.run(run_bench(writable_database(args), ops=args.ops, runs=args.runs, only=only)))
    return 0


def _check_stores(spec: str) -> None:
    """Refuse (`MISUSED`) a `--stores` that names no function the pods could call."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name) if module_name and attribute else None
    except ImportError as error:
        raise CommandFailed(
            f"--stores {spec!r}: cannot import {module_name!r} ({error}): run from the "
            "directory that holds it, or put it on PYTHONPATH",
            MISUSED,
        ) from error
    if module is None or not callable(getattr(module, attribute, None)):
        raise CommandFailed(
            f"--stores {spec!r} must name a function as package.module:function, called as "
            "factory(url, pod)",
            MISUSED,
        )


def _scale_size(given: str) -> int:
    """One size of `--scale`: a power of ten of at least 10."""
    try:
        size = int(given)
    except ValueError:
        size = 0
    if size < 10 or str(size).rstrip("0") != "1":
        raise CommandFailed(
            f"--scale {given!r}: each size must be a power of ten of at least 10 "
            "(e.g. --scale 1000,100000)",
            MISUSED,
        )
    return size


# --- faults ----------------------------------------------------------------------------


def _faults_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="run only this scenario (repeatable; default: every scenario of the dialect)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="runs per scenario (default: 1)"
    )
    parser.add_argument("--pods", type=int, default=3, help="pod processes (default: 3)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=10.0,
        help="how much faster the pods' clocks run than the host's (default: %(default)s)",
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
    for option, value, least in (
        ("--repeat", args.repeat, 1),
        ("--pods", args.pods, 2),
        ("--time-scale", args.time_scale, 1),
    ):
        if value < least:
            raise CommandFailed(f"{option} must be at least {least}, got {value:g}", MISUSED)
    if args.stores is not None:
        _check_stores(args.stores)
    url = writable_database(args)
    dialect = dialect_of(url)
    names = args.scenario or [s.name for s in SCENARIOS.values() if s.runs_on(dialect)]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise CommandFailed(
            f"unknown scenario(s) {', '.join(unknown)}: see `{PROG} faults --list`", MISUSED
        )
    elsewhere = [n for n in names if not SCENARIOS[n].runs_on(dialect)]
    if elsewhere:
        on = ", ".join(SCENARIOS[elsewhere[0]].dialects or ())
        raise CommandFailed(
            f"{', '.join(elsewhere)} cut(s) the network between a pod and its database "
            f"server: it runs on {on}, not on {dialect}, whose database is a file (see "
            f"`{PROG} faults --list`)",
            MISUSED,
        )
    make_sqlite_directory(url)
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
