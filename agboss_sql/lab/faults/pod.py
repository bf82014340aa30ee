"""A pod: one real process running the fixture workload on a store set.

    python -m agboss_sql.lab.faults.pod CONFIG.json

The config (written by the harness) names the database URL, the store set factory
(`module:function`, called as `factory(url, pod_identity)`), the pod's instance id, its
event log, its trees, the clock's scale and origin, and the hold points armed at start.

Events are JSON lines appended to the event log (flushed per line) and echoed on stdout,
which the harness reads. Commands arrive as JSON lines on stdin: `arm`, `release`,
`disarm`, `outage`, `ping` (which server port answers: a MySQL/MariaDB node). SIGTERM stops the pod gracefully within `shutdown_s`; stdin closing
(the harness died) stops it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any, TextIO

from agboss_sql.contracts.clocks import StoreClock
from agboss_sql.contracts.types import ApplicationContext
from agboss_sql.lab.faults import holds
from agboss_sql.lab.faults._clock import ScaledClock
from agboss_sql.lab.faults.fixture import PodIdentity, PodStores
from agboss_sql.lab.faults.workload import Workload, WorkloadConfig
from agboss_sql.runtime import LeaseKeeper


def load(path: str) -> Any:
    """The object at `module:attribute`."""
    module, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"give a factory as 'module:attribute', got {path!r}")
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


class EventLog:
    """Append-only JSON lines, flushed per line, echoed on stdout."""

    def __init__(self, path: str, pod: str) -> None:
        self._file: TextIO = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self.pod = pod

    def emit(self, event: dict[str, Any]) -> None:
        event = {"t": time.time_ns() // 1_000_000, "pod": self.pod, **event}
        line = json.dumps(event, default=str)
        self._file.write(line + "\n")
        self._file.flush()
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass

    def close(self) -> None:
        self._file.close()


async def _commands(
    control: holds.HoldController, stores: PodStores, stop: asyncio.Event, log: EventLog
) -> None:
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            stop.set()  # the harness is gone
            return
        try:
            command = json.loads(line)
            kind = command["cmd"]
            if kind == "arm":
                control.arm(
                    command["hold"],
                    command["point"],
                    command.get("contains"),
                    command.get("count", 1),
                )
            elif kind == "quiesce":
                quiet = asyncio.get_running_loop().create_task(
                    control.quiesce(command["hold"], float(command.get("timeout_s", 30)))
                )
                pending.add(quiet)
                quiet.add_done_callback(pending.discard)
            elif kind == "release":
                control.release(command["hold"])
            elif kind == "disarm":
                control.disarm(command["hold"])
            elif kind == "ping":
                probe = asyncio.get_running_loop().create_task(_ping(stores, log))
                pending.add(probe)
                probe.add_done_callback(pending.discard)
            elif kind == "outage":
                if stores.outage is None:
                    log.emit({"kind": "outage-unsupported"})
                else:
                    stores.outage(bool(command["on"]))
                    log.emit({"kind": "outage", "on": bool(command["on"])})
            else:
                log.emit({"kind": "bad-command", "command": command})
        except Exception as error:
            log.emit({"kind": "bad-command", "error": repr(error)})


async def _ping(stores: PodStores, log: EventLog) -> None:
    """Ask the pod's database which server port answers (`pong`, with `port` or `error`):
    which node of a cluster serves the pod now. A store set without a `connection` in its
    `extra` answers `ping-unsupported`."""
    connection = stores.extra.get("connection")
    if connection is None:
        log.emit({"kind": "ping-unsupported"})
        return
    began = time.monotonic()
    try:
        result = await connection.execute("SELECT @@port")
        port = int(result.rows[0][0])
    except Exception as error:
        log.emit({"kind": "pong", "error": f"{type(error).__name__}: {error}"[:300]})
        return
    log.emit({"kind": "pong", "port": port, "ms": round((time.monotonic() - began) * 1000, 1)})


async def _watch_hung(control: holds.HoldController, log: EventLog) -> None:
    while True:
        await asyncio.sleep(0.5)
        for event in control.hung():
            log.emit(event)


async def run(config: dict[str, Any]) -> int:
    """Run the pod until SIGTERM (or stdin closes); the exit status."""
    log = EventLog(config["events_path"], config["instance_id"])
    control = holds.HoldController(
        log.emit,
        hold_timeout_s=float(config.get("hold_timeout_s", 120)),
        op_bound_ms=int(config.get("op_bound_ms", 15_000)),
    )
    holds.install(control)
    for armed in config.get("holds", []):
        control.arm(armed["hold"], armed["point"], armed.get("contains"), armed.get("count", 1))
    scale = float(config.get("time_scale", 1))
    clock = ScaledClock(scale, int(config["origin_ms"]))
    store_clock = StoreClock() if scale == 1 else StoreClock(clock)
    pod = PodIdentity(
        instance_id=config["instance_id"],
        clock=clock,
        store_clock=store_clock,
        application=ApplicationContext(instance_id=config["instance_id"], name="fault-suite"),
    )
    factory = load(config["stores"])
    stores = factory(config["url"], pod)
    if asyncio.iscoroutine(stores):
        stores = await stores
    pieces = config.get("pieces", {})
    keeper_class: type[LeaseKeeper] = (
        load(pieces["keeper"]) if pieces.get("keeper") else LeaseKeeper
    )
    workload_config = WorkloadConfig(
        tenant_id=config.get("tenant_id", "fault-tenant"),
        trees=tuple(config.get("trees", ())),
        all_trees=tuple(config.get("all_trees", ())),
        children=int(config.get("children", 2)),
        pause_trees=tuple(config.get("pause_trees", ())),
        lease_ms=int(config.get("lease_ms", 30_000)),
        poll_ms=int(config.get("poll_ms", 1_000)),
        compensate_on_handover=bool(pieces.get("compensate_on_handover", False)),
        recovery=bool(pieces.get("recovery", True)),
        release_on_stop=bool(pieces.get("release_on_stop", True)),
    )
    workload = Workload(stores, pod, workload_config, log.emit, keeper_class)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    helpers = [
        loop.create_task(_commands(control, stores, stop, log)),
        loop.create_task(_watch_hung(control, log)),
    ]
    log.emit({"kind": "ready", "pid": os.getpid()})
    workload.start()
    await stop.wait()
    began = time.monotonic()
    log.emit({"kind": "stopping"})
    control.release_all()
    status = 0
    shutdown_s = float(config.get("shutdown_s", 10))
    # Just before the bound, what every task (this one too) still waits on: a stop that
    # runs out of time names where it was stuck.
    late = loop.call_later(
        shutdown_s * 0.9, lambda: log.emit({"kind": "stop-slow", "waiting": _waiting_tasks()})
    )
    try:
        async with asyncio.timeout(shutdown_s):
            await workload.stop()
            await stores.close()
    except TimeoutError:
        log.emit({"kind": "stop-timeout"})
        status = 3
    finally:
        late.cancel()
    for task in helpers:
        task.cancel()
    log.emit(control.stats())
    log.emit({"kind": "stopped", "ms": round((time.monotonic() - began) * 1000, 1)})
    log.close()
    return status


def _waiting_tasks() -> list[str]:
    """Where each task of the pod waits: its innermost frames (called from a timer
    callback, so no task is running)."""
    found = []
    for task in asyncio.all_tasks():
        # The chain of awaits from the task's coroutine down (`get_stack` shows only the
        # outermost frame of a suspended coroutine).
        where: list[str] = []
        awaited: Any = task.get_coro()
        depth = 0
        while awaited is not None and depth < 12:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                where.append(type(awaited).__name__)
                break
            code = frame.f_code
            where.append(f"{code.co_name}@{os.path.basename(code.co_filename)}:{frame.f_lineno}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
            depth += 1
        found.append(f"{task.get_name()}: {' > '.join(where)}")
    return found


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m agboss_sql.lab.faults.pod CONFIG.json`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m agboss_sql.lab.faults.pod CONFIG.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as handle:
        config = json.load(handle)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s {config['instance_id']} %(levelname)s %(name)s: %(message)s",
    )
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(config))
    return 1


if __name__ == "__main__":
    sys.exit(main())
