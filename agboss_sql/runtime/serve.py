"""Running a `Workflows` app as a worker process: `agboss-sql worker --app module:attr`.

`load_workflows("shop.app:app")` imports the user's module and finds the app in it;
`serve(app, url=...)` runs an `Engine` until SIGTERM or SIGINT, then stops gracefully
(every lease still held is released, so another worker takes those runs on at once).
With `commands=True`, JSON lines on standard input start, cancel and resume runs
(`{"cmd": "start", "workflow": "order", "input": {...}, "id": "o-1"}`, `{"cmd":
"cancel", "id": "o-1"}`, `{"cmd": "resume", "id": "o-1", "decision": {...}}`,
`{"cmd": "stop"}`), and what the engine does is written to standard output as JSON lines.

Before the engine starts, `serve` waits for the database (`wait_for_database`): until it
answers at the head schema revision the worker's readiness is DOWN, each failed try is
one line on the log (and a `readiness` event), tried again after a doubling pause, and
after `start_timeout_s` the worker gives up with `DatabaseNotReadyError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from agboss_sql.contracts.errors import AgbossError
from agboss_sql.runtime.engine import DEFAULT_TENANT, Engine
from agboss_sql.runtime.workflows import Workflows

START_TIMEOUT_S = 60.0
"""How long a worker waits for its database at start by default (`serve(start_timeout_s)`,
`agboss-sql worker --start-timeout`)."""

INTERRUPTED = 130
"""`serve`'s answer after a graceful stop asked by SIGINT (Ctrl-C): 128 + SIGINT."""

logger = logging.getLogger(__name__)


class DatabaseNotReadyError(AgbossError):
    """The worker's database did not answer at the head schema revision within the start
    bound, or (`while_running`) stopped answering for longer than the worker's bound:
    `reason` is the last failure's first line."""

    code = "workflow.database-not-ready"

    def __init__(self, message: str, reason: str, *, while_running: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.while_running = while_running


class AppLoadError(AgbossError):
    """`--app` must name a `Workflows` object as `package.module:attribute`, importable
    from the current directory or the Python path."""

    code = "workflow.app-load"


def load_workflows(spec: str) -> Workflows:
    """The `Workflows` app named by `spec` (`package.module:attribute`; the attribute may be
    dotted, and a function of no arguments that answers the app is called)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppLoadError(f"--app {spec!r} must be package.module:attribute (e.g. shop.app:app)")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` does
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise AppLoadError(
            f"--app {spec!r}: no module {error.name!r} (run from the directory that holds "
            "it, or put it on PYTHONPATH)"
        ) from error
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise AppLoadError(f"--app {spec!r}: {module_name} has no {attribute!r}") from None
    if callable(found) and not isinstance(found, Workflows):
        found = found()
    if not isinstance(found, Workflows):
        raise AppLoadError(
            f"--app {spec!r} is a {type(found).__name__}, not a Workflows app: point it at "
            "the object your @app.workflow decorators register on"
        )
    return found


def json_lines(instance_id: str) -> Callable[[dict[str, Any]], None]:
    """An `on_event` that writes each event as one JSON line on standard output."""

    def emit(event: dict[str, Any]) -> None:
        line = json.dumps(
            {"t": time.time_ns() // 1_000_000, "pod": instance_id, **event}, default=str
        )
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass

    return emit


async def _commands(engine: Engine, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[Any]] = set()
    while True:
        line = await reader.readline()
        if not line:
            stop.set()  # the process that drives this one is gone
            return
        try:
            command = json.loads(line)
            kind = command["cmd"]
            tenant = command.get("tenant", DEFAULT_TENANT)
            if kind == "stop":
                stop.set()
                continue
            call: Any
            if kind == "start":
                call = engine.start(
                    command["workflow"],
                    command.get("input"),
                    id=command.get("id"),
                    tenant_id=tenant,
                )
            elif kind == "cancel":
                call = engine.cancel(command["id"], tenant_id=tenant)
            elif kind == "resume":
                call = engine.resume(
                    command["id"],
                    command.get("decision"),
                    pause=command.get("pause"),
                    tenant_id=tenant,
                )
            else:
                engine.emit({"kind": "bad-command", "command": command})
                continue
        except Exception as error:
            engine.emit({"kind": "bad-command", "error": repr(error)})
            continue

        ident = command.get("id")

        async def run(what: str = kind, awaited: Any = call, ident: Any = ident) -> None:
            try:
                answer = await awaited
                engine.emit(
                    {"kind": "command-done", "cmd": what, "id": ident, "answer": repr(answer)[:200]}
                )
            except Exception as error:
                engine.emit(
                    {"kind": "command-failed", "cmd": what, "id": ident, "error": repr(error)[:300]}
                )

        task = loop.create_task(run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _status(engine: Engine, every_s: float = 0.5) -> None:
    while True:
        engine.emit({"kind": "status", **engine.snapshot()})
        await asyncio.sleep(every_s)


def first_line(error: BaseException) -> str:
    """An error as one line: its text's first line (its type's name when it has none)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


async def database_problem(url: str | None) -> str | None:
    """Why the database at `url` cannot run workflows now, in one line (`None`: it answers
    at the head schema revision). One connection, one read; a SQLite file's directory must
    be writable (the worker writes the file and its journal beside it)."""
    from agboss_sql.sql.connection import SqlConnection
    from agboss_sql.sql.migrate import require_head, resolve_url

    connection = SqlConnection(resolve_url(url))
    try:
        await require_head(connection)
    except Exception as error:
        return first_line(error)
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    return None


async def wait_for_database(
    url: str | None,
    *,
    timeout_s: float = START_TIMEOUT_S,
    first_pause_s: float = 0.5,
    longest_pause_s: float = 10.0,
    on_down: Callable[[str, float], None] | None = None,
) -> None:
    """Return once the database at `url` answers at the head schema revision
    (`database_problem`). Until then each try that fails calls `on_down(reason,
    pause_s)` (default: one warning line on the log), then waits `pause_s`, doubled after
    each try up to `longest_pause_s`; past `timeout_s` raise `DatabaseNotReadyError`
    with the last reason."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pause = first_pause_s
    while True:
        reason = await database_problem(url)
        if reason is None:
            return
        left = deadline - loop.time()
        if left <= 0:
            raise DatabaseNotReadyError(
                f"the database did not become ready within {timeout_s:g} s: {reason}", reason
            )
        pause = min(pause, left)
        if on_down is not None:
            on_down(reason, pause)
        else:
            logger.warning(
                "database not ready (readiness DOWN): %s; trying again in %.1f s "
                "(giving up %.0f s after start)",
                reason,
                pause,
                timeout_s,
            )
        await asyncio.sleep(pause)
        pause = min(pause * 2, longest_pause_s)


async def watch_database(
    url: str | None,
    *,
    every_s: float,
    down_timeout_s: float | None,
    emit: Callable[[dict[str, Any]], None],
) -> str:
    """While the worker runs, ask the database every `every_s` (`database_problem`). When
    it stops answering: a `readiness` event DOWN and one warning line per try, tried again
    after a doubling pause (at most `every_s`); when it answers again, a `readiness` event
    UP and one line. Return the reason once it has not answered for `down_timeout_s`
    (`None`: never return)."""
    loop = asyncio.get_running_loop()
    down_since: float | None = None
    pause = every_s
    while True:
        await asyncio.sleep(pause)
        reason = await database_problem(url)
        now = loop.time()
        if reason is None:
            if down_since is not None:
                emit({"kind": "readiness", "status": "UP"})
                logger.warning(
                    "database answers again (readiness UP) after %.1f s", now - down_since
                )
            down_since, pause = None, every_s
            continue
        if down_since is None:
            down_since, pause = now, min(0.5, every_s)
        down_s = now - down_since
        if down_timeout_s is not None and down_s >= down_timeout_s:
            return reason
        emit({"kind": "readiness", "status": "DOWN", "error": reason, "retry_s": pause})
        logger.warning(
            "database not answering (readiness DOWN) for %.1f s: %s; trying again in %.1f s%s",
            down_s,
            reason,
            pause,
            "" if down_timeout_s is None else f" (giving up after {down_timeout_s:g} s)",
        )
        pause = min(pause * 2, every_s)


async def serve(
    workflows: Workflows,
    *,
    url: str | None = None,
    instance_id: str | None = None,
    lease_ms: int = 30_000,
    max_concurrent_steps: int = 8,
    shutdown_ms: int = 10_000,
    commands: bool = False,
    events: bool = False,
    on_ready: Callable[[Engine], None] | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    metrics_port: int | None = None,
    down_timeout_s: float | None = None,
) -> int:
    """Run `workflows` on an `Engine` until SIGTERM/SIGINT (or, with `commands`, until
    standard input closes or says stop). First wait up to `start_timeout_s` for the
    database (`wait_for_database`; with `events` or `commands` each failed try is also a
    `readiness` event, status `DOWN`), else raise `DatabaseNotReadyError`. The exit
    status: 0 after a graceful stop, `INTERRUPTED` (130) after one asked by SIGINT, 3 when
    the stop overran `shutdown_ms`. With `metrics_port`, Prometheus metrics are served on
    that port (0: any free one, told in a `metrics` event) once the engine is open
    (`agboss_sql.runtime.metrics`, the `metrics` extra). Once running, the database is
    watched (`watch_database`, every third of a lease, at most 5 s); with
    `down_timeout_s`, one that does not answer for that long stops the worker gracefully
    and raises `DatabaseNotReadyError`."""
    engine = Engine(
        workflows,
        url=url,
        instance_id=instance_id,
        lease_ms=lease_ms,
        max_concurrent_steps=max_concurrent_steps,
        shutdown_ms=shutdown_ms,
    )
    if events or commands:
        engine.emit = json_lines(engine.instance_id)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    interrupted: list[int] = []

    def stop_on(sig: int) -> None:
        interrupted.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_on, sig)

    def down(reason: str, pause_s: float) -> None:
        engine.emit({"kind": "readiness", "status": "DOWN", "error": reason, "retry_s": pause_s})
        logger.warning(
            "database not ready (readiness DOWN): %s; trying again in %.1f s "
            "(giving up %.0f s after start)",
            reason,
            pause_s,
            start_timeout_s,
        )

    waiting = loop.create_task(
        wait_for_database(
            url, timeout_s=start_timeout_s, on_down=down if events or commands else None
        )
    )
    stopped = loop.create_task(stop.wait())
    await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not waiting.done():
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        return INTERRUPTED if signal.SIGINT in interrupted else 0
    stopped.cancel()
    waiting.result()
    metrics = None
    if metrics_port is not None:  # chained to the engine's emit before the engine opens
        from agboss_sql.runtime.metrics import WorkerMetrics

        metrics = WorkerMetrics(engine, url=url)
    await engine.open()
    if metrics is not None:
        await metrics.start(metrics_port)
    if on_ready is not None:
        on_ready(engine)
    helpers: list[asyncio.Task[Any]] = (
        [loop.create_task(_commands(engine, stop))] if commands else []
    )
    if events or commands:
        helpers.append(loop.create_task(_status(engine)))
    watch = loop.create_task(
        watch_database(
            url,
            every_s=min(5.0, lease_ms / 3000),
            down_timeout_s=down_timeout_s,
            emit=engine.emit,
        )
    )
    helpers.append(watch)
    watch.add_done_callback(lambda _: stop.set())
    lost: str | None = None
    try:
        await stop.wait()
        if watch.done() and not watch.cancelled():
            lost = watch.result()
    finally:
        for helper in helpers:
            helper.cancel()
        if metrics is not None:
            await metrics.stop()
        try:
            await engine.close()
        except TimeoutError:
            if lost is None:
                return 3
    if lost is not None:
        raise DatabaseNotReadyError(
            f"the database did not answer for {down_timeout_s:g} s while the worker ran "
            f"(it stopped; its leases expire for others to take over): {lost}",
            lost,
            while_running=True,
        )
    return INTERRUPTED if signal.SIGINT in interrupted else 0


__all__ = [
    "INTERRUPTED",
    "START_TIMEOUT_S",
    "AppLoadError",
    "DatabaseNotReadyError",
    "database_problem",
    "first_line",
    "json_lines",
    "load_workflows",
    "serve",
    "wait_for_database",
    "watch_database",
]
