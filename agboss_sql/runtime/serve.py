"""Running a `Workflows` app as a worker process: `agboss-sql worker --app module:attr`.

`load_workflows("shop.app:app")` imports the user's module and finds the app in it;
`serve(app, url=...)` runs an `Engine` until SIGTERM or SIGINT, then stops gracefully
(every lease still held is released, so another worker takes those runs on at once).
With `commands=True`, JSON lines on standard input start, cancel and resume runs
(`{"cmd": "start", "workflow": "order", "input": {...}, "id": "o-1"}`, `{"cmd":
"cancel", "id": "o-1"}`, `{"cmd": "resume", "id": "o-1", "decision": {...}}`,
`{"cmd": "stop"}`), and what the engine does is written to standard output as JSON lines.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from agboss_sql.contracts.errors import AgbossError
from agboss_sql.runtime.engine import DEFAULT_TENANT, Engine
from agboss_sql.runtime.workflows import Workflows


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
) -> int:
    """Run `workflows` on an `Engine` until SIGTERM/SIGINT (or, with `commands`, until
    standard input closes or says stop). The exit status: 0 after a graceful stop, 3 when
    the stop overran `shutdown_ms`."""
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
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await engine.open()
    if on_ready is not None:
        on_ready(engine)
    helpers = [loop.create_task(_commands(engine, stop))] if commands else []
    if events or commands:
        helpers.append(loop.create_task(_status(engine)))
    try:
        await stop.wait()
    finally:
        for helper in helpers:
            helper.cancel()
        try:
            await engine.close()
        except TimeoutError:
            return 3
    return 0


__all__ = ["AppLoadError", "json_lines", "load_workflows", "serve"]
