"""The harness side of the pods: start them, read their events, send them commands,
signal them, and make sure none outlives a run.

Each pod is a process in its own process group (`start_new_session`), started with
`python -m agboss_sql.lab.faults.pod`. A reader thread per pod parses its stdout
(the echo of its event log) into one shared event list; `wait_for` blocks on a condition
variable until an event matches or the bound ends. Nothing here sleeps to synchronise.

Network faults plug in through `url_for_pod(index, url) -> url`: a per-pod proxy gives
each pod its own address of the database, and the scenario drives the proxy.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

Event = dict[str, Any]
UrlForPod = Callable[[int, str], str]


class NetworkFault(Protocol):
    """A network fault between the pods and the database (a TCP proxy per pod): the
    harness asks it for each pod's URL before the pods start, and closes it after."""

    def url_for_pod(self, index: int, url: str) -> str: ...

    def close(self) -> None: ...


class WaitTimeout(AssertionError):
    """A bounded wait of the harness ended without the event it waited for."""


_TOLD = {
    "held": ("hold",),
    "hold-timeout": ("hold",),
    "tree-run": ("tree", "epoch", "taken_over_from"),
    "tree-skip": ("tree",),
    "tree-done": ("tree", "epoch"),
    "handover": ("tree", "epoch", "error"),
    "lease-lost": ("tree", "reason"),
    "op-error": ("op", "error", "message"),
    "retry": ("what", "error"),
    "eof": (),
}
"""The events a failed wait's message tells, with the fields it gives of each."""

STORY_EVENTS = 40
"""How many of those events, the last ones, a failed wait's message tells."""


def story(events: Sequence[Event]) -> str:
    """What the pods did that bears on a wait that failed, in one line: the last
    `STORY_EVENTS` events of the kinds `_TOLD` names (which pod ran, held, lost or gave
    up which tree, and its errors), oldest first. A flaky run read from CI's output alone
    is then explained by the run itself."""
    told = [e for e in events if e.get("kind") in _TOLD][-STORY_EVENTS:]
    if not told:
        return "the pods reported no tree, hold or error"
    parts = []
    for event in told:
        fields = (
            f"{name}={str(event[name])[:120]}" for name in _TOLD[event["kind"]] if name in event
        )
        parts.append(
            " ".join(
                (
                    str(event.get("pod") or f"pod index {event.get('pod_index', '?')}"),
                    event["kind"],
                    *fields,
                )
            )
        )
    return f"what the pods reported last ({len(told)}): " + " | ".join(parts)


@dataclass
class Pod:
    """One pod process and what it said."""

    index: int
    instance_id: str
    config_path: Path
    events_path: Path
    output_path: Path
    process: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = None
    exit_code: int | None = None
    stopped_in_s: float | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Freeze:
    """A pod frozen (SIGSTOP) from `start` to `end` (host ms)."""

    pod: str
    start: int
    end: int | None = None


@dataclass
class Cluster:
    """Up to a few pods on one database, and everything they reported."""

    run_dir: Path
    url: str
    configs: list[dict[str, Any]]
    url_for_pod: UrlForPod | None = None
    env: Mapping[str, str] | None = None
    command: Sequence[str] | None = None
    """The argv a pod is started with, its config file's path appended (default: the fault
    suite's pod, `python -m agboss_sql.lab.faults.pod`)."""
    pods: list[Pod] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    freezes: list[Freeze] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    """The pods SIGKILLed by `kill`, in order."""
    notes: list[str] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> None:
        """Write each pod's config and start the pods."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        started = [self._prepare(base) for base in self.configs]
        for pod in started:
            self._launch(pod)

    def add(self, base: dict[str, Any]) -> Pod:
        """Start one more pod (a replacement) with config `base`, after `start()`."""
        self.configs.append(base)
        pod = self._prepare(base)
        self._launch(pod)
        return pod

    def _prepare(self, base: dict[str, Any]) -> Pod:
        index = len(self.pods)
        instance_id = base["instance_id"]
        pod = Pod(
            index=index,
            instance_id=instance_id,
            config_path=self.run_dir / f"{instance_id}.json",
            events_path=self.run_dir / f"{instance_id}.events.jsonl",
            output_path=self.run_dir / f"{instance_id}.out",
        )
        url = self.url if self.url_for_pod is None else self.url_for_pod(index, self.url)
        config = {**base, "url": url, "events_path": str(pod.events_path)}
        pod.config_path.write_text(json.dumps(config, indent=1), encoding="utf-8")
        self.pods.append(pod)
        return pod

    def _launch(self, pod: Pod) -> None:
        env = dict(os.environ if self.env is None else self.env)
        # A pod imports what this process imports (the store set may live in a test tree).
        paths = [p for p in sys.path if p]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        command = list(
            self.command
            if self.command is not None
            else (sys.executable, "-m", "agboss_sql.lab.faults.pod")
        )
        with open(pod.output_path, "wb") as output:
            pod.process = subprocess.Popen(
                [*command, str(pod.config_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=output,
                env=env,
                start_new_session=True,
            )
        pod.reader = threading.Thread(target=self._read, args=(pod,), daemon=True)
        pod.reader.start()

    def _read(self, pod: Pod) -> None:
        assert pod.process is not None and pod.process.stdout is not None
        for raw in pod.process.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            event["pod_index"] = pod.index
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()
        with self._changed:
            self.events.append(
                {"kind": "eof", "pod": pod.instance_id, "pod_index": pod.index, "t": _now()}
            )
            self._changed.notify_all()

    # -- waiting ------------------------------------------------------------------------

    def wait_for(
        self, match: Callable[[Event], bool], timeout_s: float, what: str, *, since: int = 0
    ) -> Event:
        """The first event (from index `since`) that matches; `WaitTimeout` naming `what`
        when none came within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        seen = since
        with self._changed:
            while True:
                while seen < len(self.events):
                    event = self.events[seen]
                    seen += 1
                    if match(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(
                        f"waited {timeout_s:.0f} s for {what}: it did not happen; "
                        + story(self.events)
                    )
                self._changed.wait(left)

    def wait_all(
        self,
        match: Callable[[Event], str | None],
        wanted: Iterable[str],
        timeout_s: float,
        what: str,
    ) -> set[str]:
        """Wait until `match` has named every item of `wanted` (over all events); the items
        still missing when the bound ended (empty when all came)."""
        missing = set(wanted)
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while missing:
                while seen < len(self.events):
                    name = match(self.events[seen])
                    seen += 1
                    if name is not None:
                        missing.discard(name)
                if not missing:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        return missing

    def mark(self) -> int:
        """The index of the next event (to wait only for what comes after now)."""
        with self._changed:
            return len(self.events)

    def snapshot(self) -> list[Event]:
        with self._changed:
            return list(self.events)

    # -- acting -------------------------------------------------------------------------

    def send(self, pod: Pod, command: Mapping[str, Any]) -> None:
        """Write one command line to the pod's stdin (never blocks on a dead pod)."""
        if not pod.alive or pod.process is None or pod.process.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            pod.process.stdin.write((json.dumps(dict(command)) + "\n").encode())
            pod.process.stdin.flush()

    def signal(self, pod: Pod, sig: signal.Signals) -> None:
        """Send `sig` to the pod's process group; SIGSTOP/SIGCONT are recorded as a
        freeze window (the audit does not count a frozen pod's time as a hang)."""
        if pod.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pod.process.pid, sig)
        if sig == signal.SIGSTOP:
            self.freezes.append(Freeze(pod.instance_id, _now()))
        elif sig == signal.SIGCONT:
            for freeze in self.freezes:
                if freeze.pod == pod.instance_id and freeze.end is None:
                    freeze.end = _now()

    def kill(self, pod: Pod) -> None:
        """SIGKILL the pod and reap it."""
        self.killed.append(pod.instance_id)
        self.signal(pod, signal.SIGKILL)
        if pod.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.exit_code = pod.process.wait(timeout=10)

    def stop(self, pod: Pod, shutdown_s: float) -> bool:
        """SIGTERM the pod and wait for it to exit; True when it exited 0 within
        `shutdown_s` (it is killed otherwise)."""
        if pod.process is None or not pod.alive:
            return True
        began = time.monotonic()
        self.signal(pod, signal.SIGCONT)
        self.signal(pod, signal.SIGTERM)
        try:
            pod.exit_code = pod.process.wait(timeout=shutdown_s)
        except subprocess.TimeoutExpired:
            self.kill(pod)
            return False
        pod.stopped_in_s = time.monotonic() - began
        return pod.exit_code == 0

    def close(self) -> None:
        """Kill every pod's process group, whatever state it is in, and reap them."""
        for pod in self.pods:
            if pod.process is None:
                continue
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pod.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.process.wait(timeout=10)
            for stream in (pod.process.stdin, pod.process.stdout):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.close()
            if pod.reader is not None:
                pod.reader.join(timeout=5)

    def pod(self, instance_id: str) -> Pod:
        return next(p for p in self.pods if p.instance_id == instance_id)


def _now() -> int:
    return time.time_ns() // 1_000_000


__all__ = ["Cluster", "Event", "Freeze", "NetworkFault", "Pod", "UrlForPod", "WaitTimeout"]
