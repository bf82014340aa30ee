"""The `worker` subcommand of `agboss-sql`: a worker process of a workflow app."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from agboss_sql.cli._common import (
    INTERRUPTED,
    MISUSED,
    PROG,
    CommandFailed,
    add_url_argument,
    shown,
    writable_url,
)

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
        "--start-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to wait for the database at start: until it answers at the head "
        "schema revision the worker is not ready, logs one line per try (tried again after "
        "a doubling pause), and exits 1 after this bound (default: %(default)s)",
    )
    parser.add_argument(
        "--down-timeout",
        type=float,
        default=None,
        metavar="S",
        help="once running, stop (exit 1) when the database has not answered for S "
        "seconds; the worker asks it every third of a lease (at most every 5 s) and logs "
        "one line per try while it does not answer (default: keep running, retrying)",
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
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        default=None,
        help="serve Prometheus metrics on this port (0: any free one; docs/metrics.md); "
        "needs the metrics extra",
    )


WORKER_SETTINGS = (
    "url",
    "app",
    "instance_id",
    "lease_ms",
    "max_concurrent_steps",
    "shutdown_ms",
    "start_timeout",
    "down_timeout",
)
"""The keys of a worker's `--config` file (others, such as the cluster's own, are ignored)."""


def _worker(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from agboss_sql.runtime.serve import DatabaseNotReadyError, load_workflows, serve

    settings = {name: getattr(args, name) for name in WORKER_SETTINGS}
    if args.config is not None:
        try:
            with open(args.config, encoding="utf-8") as handle:
                given = json.load(handle)
        except (OSError, ValueError) as error:
            raise CommandFailed(
                f"cannot read --config {args.config}: {error}: give a JSON file of worker "
                f"settings ({', '.join(WORKER_SETTINGS)})",
                MISUSED,
            ) from error
        if not isinstance(given, dict):
            raise CommandFailed(
                f"--config {args.config} is not a JSON object of worker settings "
                f"({', '.join(WORKER_SETTINGS)})",
                MISUSED,
            )
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
            raise CommandFailed(
                f"--{name.replace('_', '-')} must be a positive integer, got {value!r}", MISUSED
            )
    start_timeout = settings["start_timeout"]
    if isinstance(start_timeout, bool) or not isinstance(start_timeout, int | float):
        raise CommandFailed(f"--start-timeout must be a number of seconds, got {start_timeout!r}")
    if not start_timeout > 0:
        raise CommandFailed(f"--start-timeout must be above 0 s, got {start_timeout:g}", MISUSED)
    _check_metrics_port(args.metrics_port)
    down_timeout = settings["down_timeout"]
    if down_timeout is not None and (
        isinstance(down_timeout, bool)
        or not isinstance(down_timeout, int | float)
        or not down_timeout > 0
    ):
        raise CommandFailed(f"--down-timeout must be above 0 s, got {down_timeout!r}", MISUSED)
    url = writable_url(database_url_of(settings["url"]))
    workflows = load_workflows(str(settings["app"]))
    instance = settings["instance_id"]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        OneLineFormatter(
            f"%(asctime)s {instance or 'worker'} %(levelname)s %(name)s: %(message)s",
            tracebacks=bool(args.debug),
        )
    )
    handler.addFilter(_own_cancellations)
    handler.addFilter(Repeats())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    quiet = args.commands or args.events

    def ready(engine: Any) -> None:
        if not quiet:
            print(
                f"worker {engine.instance_id} on {shown(url)}: running {workflows.names} "
                f"(lease {settings['lease_ms']} ms, {settings['max_concurrent_steps']} steps "
                "at once); SIGTERM or Ctrl-C stops it",
                flush=True,
            )

    try:
        status: int = asyncio.run(
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
                start_timeout_s=float(start_timeout),
                down_timeout_s=None if down_timeout is None else float(down_timeout),
                metrics_port=args.metrics_port,
            )
        )
    except DatabaseNotReadyError as error:
        raise CommandFailed(_not_ready_line(error, args, down_timeout)) from error
    if status == INTERRUPTED:
        print(f"{PROG} worker: interrupted (Ctrl-C): stopped gracefully", file=sys.stderr)
    return status


def _not_ready_line(error: Any, args: argparse.Namespace, down_timeout: Any) -> str:
    """The line of a worker whose database did not answer: the cause as `explain` words
    it (nothing listening, no such database, a refused login, …), said to have happened
    while the worker ran when it did."""
    from agboss_sql.cli._explain import explain

    why = explain(error, args)
    if not error.while_running or why.startswith("[workflow.database-not-ready]"):
        return why
    return (
        f"the database stopped answering for {down_timeout:g} s (--down-timeout) while the "
        f"worker ran, so it stopped: {why}"
    )


def _own_cancellations(record: logging.LogRecord) -> bool:
    """False for psycopg's warning that a statement's cancellation was interrupted: the
    worker cancels its own statements as it stops (and as it cancels a run's tasks)."""
    return not (
        record.name.startswith("psycopg") and record.getMessage().startswith("query cancellation")
    )


class Repeats(logging.Filter):
    """Let a failure the engine's loops log again and again through once every `every_s`:
    a record of the same logger, message and exception type as one let through less than
    `every_s` ago is dropped, and the next one let through says how many were. The
    worker's own lines about its database (`agboss_sql.runtime.serve`) all pass: they are
    one per try already."""

    def __init__(self, every_s: float = 30.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[tuple[str, object, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "agboss_sql.runtime.serve" or not record.exc_info:
            return True
        error = record.exc_info[1]
        key = (record.name, record.msg, type(error).__name__)
        last, dropped = self._last.get(key, (float("-inf"), 0))
        if record.created - last < self.every_s:
            self._last[key] = (last, dropped + 1)
            return False
        self._last[key] = (record.created, 0)
        if dropped:
            record.msg = f"{record.msg} (and {dropped} times more in the last {self.every_s:g} s)"
        return True


class OneLineFormatter(logging.Formatter):
    """A log record on one line: an exception it carries is its type and first line, not
    its traceback (unless `tracebacks`, as `--debug` asks)."""

    def __init__(self, fmt: str, *, tracebacks: bool = False) -> None:
        super().__init__(fmt)
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if self.tracebacks or not record.exc_info or record.exc_info[1] is None:
            return super().format(record)
        error = record.exc_info[1]
        text = str(error).strip().splitlines()
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            line = super().format(record)
        finally:
            record.exc_info, record.exc_text = saved
        first = text[0] if text else ""
        return f"{line} ({type(error).__name__}: {first}; --debug shows the traceback)"


def _check_metrics_port(port: int | None) -> None:
    """Refuse (`MISUSED`) a `--metrics-port` out of range, or without the `metrics` extra."""
    if port is None:
        return
    if not 0 <= port <= 65_535:
        raise CommandFailed(f"--metrics-port must be 0 to 65535, got {port}", MISUSED)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise CommandFailed(
            "--metrics-port needs the metrics extra (prometheus_client is not installed): "
            "`pip install 'agboss-sql[metrics]'` (`pip install '.[metrics]'` in a checkout)",
            MISUSED,
        ) from None


def database_url_of(url: str | None) -> str:
    """`url`, else `AGBOSS_DATABASE_URL`, else the default SQLite file."""
    from agboss_sql.sql.migrate import resolve_url

    return resolve_url(url)
