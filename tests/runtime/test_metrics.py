"""The worker's Prometheus metrics as an operator scrapes them: two `agboss-sql worker
--metrics-port 0` processes on the database under test run a tree and a slow step; one is
frozen (SIGSTOP) in that step until the other took its run over, then thawed. Their
`/metrics` say what happened: steps and effects with their latencies, children claimed,
trees ended, the queue's depth, the step slots, lease moves (renewals, a takeover on the
one, self-fencing on the other)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agboss_sql.runtime.metrics import METRICS, error_code, lost_reason
from agboss_sql.sql.connection import SqlConnection

prometheus_parser = pytest.importorskip("prometheus_client.parser")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

LEASE_MS = 1_500
"""The workers' lease: a frozen worker's run is taken over within about this."""

START_S = 60.0
"""A worker's start (an interpreter, SQLAlchemy, the stores opened): seconds when loaded."""

WAIT_S = 60.0
"""A run, a takeover (a lease and a sweep) or the metrics' next read of the queue (5 s)."""

Event = dict[str, Any]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Worker:
    """One `agboss-sql worker --commands --metrics-port 0` process of `metrics_app:app` in a
    process group of its own; its JSON-line events read as they come."""

    def __init__(
        self, url: str, name: str, stderr_path: Path, changed: threading.Condition
    ) -> None:
        self.name = name
        self.stderr_path = stderr_path
        self.events: list[Event] = []
        self._changed = changed  # shared by the workers of a test: see `first_event`
        command = [sys.executable, "-m", "agboss_sql.cli", "worker", "--url", url]
        command += ["--app", "metrics_app:app", "--commands", "--instance-id", name]
        command += ["--lease-ms", str(LEASE_MS), "--metrics-port", "0"]
        with open(stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                command,
                cwd=HERE,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(raw)
                if isinstance(event, dict):
                    with self._changed:
                        self.events.append(event)
                        self._changed.notify_all()
        with self._changed:
            self.events.append({"kind": "eof"})
            self._changed.notify_all()

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        self.process.stdin.flush()

    def wait_for(
        self, match: Callable[[Event], bool], what: str, timeout_s: float = WAIT_S
    ) -> Event:
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while True:
                for event in self.events[seen:]:
                    if match(event):
                        return event
                    if event.get("kind") == "eof":
                        raise AssertionError(f"{self.name} exited before {what}:\n{self.stderr()}")
                seen = len(self.events)
                left = deadline - time.monotonic()
                if left <= 0:
                    said = [e for e in self.events if e.get("kind") != "status"][-15:]
                    raise AssertionError(
                        f"{self.name}: no {what} in {timeout_s:.0f} s; its last events: "
                        f"{said}\n{self.stderr()}"
                    )
                self._changed.wait(left)

    def scrape(self) -> Samples:
        port = self.wait_for(lambda e: e.get("kind") == "metrics", "metrics port")["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert answer.status == 200
            text = answer.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in prometheus_parser.text_string_to_metric_families(text)
            for sample in family.samples
        }

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        if self.process.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()  # a --commands worker stops when its input ends
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._reader.join(timeout=5)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-3_000:]
        except OSError:
            return ""


def first_event(
    workers: list[Worker], match: Callable[[Event], bool], what: str, timeout_s: float = WAIT_S
) -> tuple[Worker, Event]:
    """The first worker to have an event that matches, and the event."""
    changed = workers[0]._changed
    deadline = time.monotonic() + timeout_s
    with changed:
        while True:
            for worker in workers:
                for event in worker.events:
                    if match(event):
                        return worker, event
            left = deadline - time.monotonic()
            if left <= 0:
                said = {
                    w.name: [e for e in w.events if e.get("kind") != "status"][-8:] for w in workers
                }
                raise AssertionError(f"no {what} in {timeout_s:.0f} s; last events: {said}")
            changed.wait(left)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(v for (found, _labels), v in samples.items() if found == name)


@pytest.fixture
def workers(sql: SqlConnection, sql_url: str, tmp_path: Path) -> Iterator[list[Worker]]:
    changed = threading.Condition()
    started = [Worker(sql_url, name, tmp_path / f"{name}.err", changed) for name in ("w-a", "w-b")]
    try:
        for worker in started:
            worker.wait_for(lambda e: e.get("kind") == "metrics", "metrics port", START_S)
            worker.wait_for(lambda e: e.get("kind") == "ready", "ready", START_S)
        yield started
    finally:
        for worker in started:
            worker.stop()


def ended(tree: str) -> Callable[[Event], bool]:
    return lambda e: e.get("kind") == "tree-end" and e.get("tree") == tree


def test_workers_metrics_say_what_they_did(workers: list[Worker]) -> None:
    a, b = workers
    a.send({"cmd": "start", "workflow": "tree", "input": 2, "id": "m-tree"})
    # Its children run on either worker, and the finisher of the last one ends the tree.
    _ender, end = first_event(workers, ended("m-tree"), "m-tree's end")
    assert end["status"] == "succeeded"

    def summed(name: str, **labels: str) -> float:
        return sum(value(s, name, **labels) for s in both)

    # The queue is read every few seconds, and the root's lease is finished just after
    # its end is told: wait for the read after the tree, and the finish.
    deadline = time.monotonic() + WAIT_S
    while True:
        both = [a.scrape(), b.scrape()]
        samples = both[0]
        if (
            value(samples, "agboss_queue_depth", state="finished") == 2
            and value(samples, "agboss_trees", status="succeeded") == 1
            and summed("agboss_lease_moves_total", kind="finished") >= 3
        ):
            break
        assert time.monotonic() < deadline, f"the tree's metrics never all came: {both}"
        time.sleep(0.2)

    # The root's step and effect, the two leaves' steps. The root ran again once woken
    # (its step replayed), unless its children had all finished by the time it went to
    # wait: then it won its run back and went on in it (`reclaimed`), replaying nothing.
    assert summed("agboss_steps_total", kind="step", replayed="false") == 3
    assert summed("agboss_steps_total", kind="effect", replayed="false") == 1
    went_on = any(
        e.get("kind") == "reclaimed" and e.get("tree") == "m-tree"
        for worker in workers
        for e in list(worker.events)
    )
    replayed = summed("agboss_steps_total", kind="step", replayed="true")
    assert replayed == 0 if went_on else replayed >= 1, (went_on, replayed)
    steps = summed("agboss_steps_total", kind="step", replayed="false") + summed(
        "agboss_steps_total", kind="step", replayed="true"
    )
    assert summed("agboss_step_seconds_count", kind="step") == steps
    assert summed("agboss_step_seconds_sum", kind="step") > 0
    assert summed("agboss_child_claims_total") == 2
    assert summed("agboss_tree_ends_total", status="succeeded") == 1
    assert value(samples, "agboss_tree_runs_total") >= 1
    assert summed("agboss_lease_moves_total", kind="acquired") >= 3  # the root, two leaves
    assert summed("agboss_lease_moves_total", kind="yielded") >= 1  # the root, for its leaves
    assert summed("agboss_lease_moves_total", kind="finished") >= 3
    assert value(samples, "agboss_step_slots", state="max") == 8
    assert value(samples, "agboss_trees", status="succeeded") == 1
    assert value(samples, "agboss_wakes_owed") == 0
    assert summed("agboss_refused_writes_total") == summed("agboss_lease_takeovers_total") == 0

    # A slow step on a: frozen in it, b takes the run over and finishes it; thawed, a
    # finds it no longer holds the lease and stops the run (fencing itself).
    a.send({"cmd": "start", "workflow": "slow", "input": 2.5, "id": "m-slow"})
    a.wait_for(lambda e: e.get("kind") == "tree-run" and e.get("tree") == "m-slow", "m-slow run")
    a.signal(signal.SIGSTOP)
    assert b.wait_for(ended("m-slow"), "m-slow's end on b")["status"] == "succeeded"
    a.signal(signal.SIGCONT)
    a.wait_for(lambda e: e.get("kind") == "handover" and e.get("tree") == "m-slow", "handover")

    on_b = b.scrape()
    assert value(on_b, "agboss_lease_takeovers_total") == 1
    assert value(on_b, "agboss_lease_moves_total", kind="taken-over") == 1
    assert value(on_b, "agboss_lease_moves_total", kind="renewed") >= 1  # 2.5 s of a 1.5 s lease
    # The loss is logged (and counted) by a task of its own, maybe after the handover.
    deadline = time.monotonic() + WAIT_S
    while total(on_a := a.scrape(), "agboss_self_fenced_total") < 1:
        assert time.monotonic() < deadline, f"a never counted its lease lost: {on_a}"
        time.sleep(0.1)
    assert value(on_a, "agboss_lease_moves_total", kind="lost") == total(
        on_a, "agboss_self_fenced_total"
    )
    assert value(on_a, "agboss_lease_takeovers_total") == 0
    assert total(on_a, "agboss_handovers_total") >= 1


def test_every_metric_is_documented() -> None:
    text = (HERE.parents[1] / "docs" / "metrics.md").read_text()
    for name in METRICS:
        assert f"`{name}`" in text, name


def test_error_codes_and_loss_reasons_become_bounded_labels() -> None:
    assert error_code("StoreUnavailableError('[store.unavailable] the server went away')") == (
        "store.unavailable"
    )
    assert error_code("OSError('boom')") == "other"
    assert error_code(None) == "other"
    assert lost_reason("refused by the store: superseded") == "refused-write"
    assert lost_reason("the renewal was refused: the lease is over") == "renewal-refused"
    assert lost_reason("the lease was not confirmed before its trust window ended") == (
        "trust-window"
    )
    assert lost_reason("the store refused the release: the lease was no longer held") == (
        "move-refused"
    )
    assert lost_reason(None) == "other"


def test_metrics_without_the_extra_exit_2_naming_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'none.sqlite'}"
    code = (
        "import sys; sys.modules['prometheus_client'] = None; from agboss_sql.cli import main; "
        f"sys.exit(main(['worker', '--app', 'metrics_app:app', '--url', {url!r}, "
        "'--metrics-port', '0']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, timeout=START_S
    )
    assert done.returncode == 2, done
    assert done.stderr.startswith("agboss-sql worker: --metrics-port needs the metrics extra")
    assert "pip install 'agboss-sql[metrics]'" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_refused_writes_and_store_retries_are_counted_from_the_engine_s_events() -> None:
    from metrics_app import app

    from agboss_sql.runtime import Engine
    from agboss_sql.runtime.metrics import WorkerMetrics

    engine = Engine(app, url="sqlite:///never-opened.sqlite")  # its events alone, no database
    told: list[Event] = []
    engine.emit = told.append
    metrics = WorkerMetrics(engine)
    try:
        # As the engine emits them (runtime/_execution.py): a zombie's write the store
        # refused, and a store call retried after an outage.
        refused = {"kind": "refused", "execution": "t", "step": "a#1", "epoch": 1, "reason": "x"}
        engine.emit(refused)
        error = "StoreUnavailableError('[store.unavailable] the server went away')"
        engine.emit({"kind": "retry", "what": "store step a#1", "error": error})
        samples: Samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in prometheus_parser.text_string_to_metric_families(
                metrics.exposition().decode()
            )
            for sample in family.samples
        }
    finally:
        asyncio.run(metrics.stop())
    assert value(samples, "agboss_refused_writes_total") == 1
    assert value(samples, "agboss_store_errors_total", code="store.unavailable") == 1
    assert value(samples, "agboss_events_total", kind="refused") == 1
    assert told[0] is refused  # and the events still reach the engine's own consumer
