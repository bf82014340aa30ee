"""The order saga example (examples/order_saga) run as its README says: worker processes
(`agboss-sql worker --app order_saga.app:app`), the client's command line, and the shop's
tables read back from the database."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agboss_sql.sql.migrate import sync_url
from agboss_sql.sql.schema import execution_lease_events

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "order_saga"
"""The example's directory: the README runs every command from there."""

LEASE_MS = 2_000
"""The workers' lease: a killed worker's runs are taken over within about this."""

START_S = 60.0
"""A worker's start: Python, SQLAlchemy and the app imported, the stores opened and the
app's names registered; seconds, many more on a loaded machine or a slow server."""

CLIENT_S = 90.0
"""One client command: a fresh interpreter and engine (seconds), plus `result`'s own wait."""

Event = dict[str, Any]


class Worker:
    """One `agboss-sql worker` process of the example's app, in its own process group,
    its `--events` JSON lines read as they come (`events`, `wait_for`). `on_event` is
    called from the reader thread with each event, to act the instant one comes."""

    def __init__(self, url: str, stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        self.events_path = stderr_path.with_suffix(".events.jsonl")
        self.events: list[Event] = []
        self.on_event: Callable[[Worker, Event], None] | None = None
        self._changed = threading.Condition()
        command = [sys.executable, "-m", "agboss_sql.cli", "worker", "--url", url]
        command += ["--app", "order_saga.app:app", "--lease-ms", str(LEASE_MS), "--events"]
        with open(stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                command,
                cwd=EXAMPLE,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with open(self.events_path, "wb") as log:
            for raw in self.process.stdout:
                self._take(raw)
                log.write(raw)
                log.flush()
        with self._changed:
            self.events.append({"kind": "eof"})
            self._changed.notify_all()

    def _take(self, raw: bytes) -> None:
        try:
            event = json.loads(raw)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()
        hook = self.on_event
        if hook is not None:
            hook(self, event)

    @property
    def instance_id(self) -> str:
        ready = [e for e in self.snapshot() if e.get("kind") == "ready"]
        assert ready, f"worker {self.process.pid} is not ready yet"
        return str(ready[0]["instance"])

    def snapshot(self) -> list[Event]:
        with self._changed:
            return list(self.events)

    def wait_for(self, match: Callable[[Event], bool], timeout_s: float, what: str) -> Event:
        """The first event that matches, else an AssertionError naming `what` (and the
        worker's standard error) once `timeout_s` passed or the worker's output ended."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while True:
                while seen < len(self.events):
                    event = self.events[seen]
                    seen += 1
                    if match(event):
                        return event
                    if event.get("kind") == "eof":
                        raise AssertionError(f"worker exited before {what}:\n{self.stderr()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} within {timeout_s:.0f} s:\n{self.stderr()}")
                self._changed.wait(left)

    def kill(self) -> None:
        """SIGKILL the worker's process group (does not wait: the reader thread may call it)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM (a graceful stop releases its leases), SIGKILL past the bound; reaped."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.kill()  # whatever of its group is left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-3_000:]
        except OSError:
            return ""


def first_event(
    workers: list[Worker], match: Callable[[Event], bool], timeout_s: float, what: str
) -> Event:
    """The first event of any worker that matches (their outputs polled), else an
    AssertionError naming `what` once `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        for worker in workers:
            found = [event for event in worker.snapshot() if match(event)]
            if found:
                return found[0]
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.05)


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m <args> ...` from the example's directory, as the README runs it."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=CLIENT_S,
        check=False,
    )


def client(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m order_saga.client --url URL <args>`."""
    return run_example("order_saga.client", "--url", url, *args)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    """The command's output, once it exited 0."""
    assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Shop:
    """The shop's own tables, every row (duplicates would show)."""

    payments: list[tuple[str, int, str]]
    refunds: list[tuple[str, int]]
    shipments: list[tuple[str, str, str]]

    def paid(self, order_id: str) -> list[tuple[str, int, str]]:
        return [row for row in self.payments if row[0] == order_id]

    def refunded(self, order_id: str) -> list[tuple[str, int]]:
        return [row for row in self.refunds if row[0] == order_id]

    def shipped(self, order_id: str) -> list[tuple[str, str]]:
        """`(item, shipped_by)` of the order's shipments, by item."""
        return sorted((item, by) for order, item, by in self.shipments if order == order_id)


def read_shop(url: str) -> Shop:
    from order_saga.schema import payments, refunds, shipments

    engine = sa.create_engine(sync_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            return Shop(
                payments=[
                    (str(o), int(c), str(b))
                    for o, c, b in connection.execute(
                        sa.select(payments.c.order_id, payments.c.cents, payments.c.charged_by)
                    )
                ],
                refunds=[
                    (str(o), int(c))
                    for o, c in connection.execute(sa.select(refunds.c.order_id, refunds.c.cents))
                ],
                shipments=[
                    (str(o), str(i), str(b))
                    for o, i, b in connection.execute(
                        sa.select(shipments.c.order_id, shipments.c.item, shipments.c.shipped_by)
                    )
                ],
            )
    finally:
        engine.dispose()


def drop_shop_tables(url: str) -> None:
    from order_saga.schema import metadata

    engine = sa.create_engine(sync_url(url), poolclass=sa.NullPool)
    try:
        metadata.drop_all(engine)
    finally:
        engine.dispose()


def takeovers(url: str) -> list[tuple[str, str, str]]:
    """`(execution, taken by, taken from)` of every lease taken over from a holder."""
    events = execution_lease_events
    engine = sa.create_engine(sync_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(
                    events.c.execution_id,
                    events.c.instance_id,
                    events.c.taken_over_from_instance_id,
                ).where(events.c.kind == "taken-over")
            )
            return [(str(e), str(by), str(old)) for e, by, old in rows]
    finally:
        engine.dispose()
