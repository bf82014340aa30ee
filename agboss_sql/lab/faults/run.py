"""What a scenario's `act` works with (`ScenarioRun`: the cluster, bounded waits, the holds,
the facts it records for the audit) and how a scenario runs (`FaultSettings`).

Below both the scenarios (which act on a `ScenarioRun`) and the suite (which makes one per
run), so neither imports the other's module to name it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.lab.faults.harness import Cluster, Event, NetworkFault, Pod


@dataclass(frozen=True)
class FaultSettings:
    """How a scenario runs: the pods' workload, clocks and bounds (seconds are the host's,
    milliseconds the pods' scaled clock)."""

    pods: int = 3
    trees_per_pod: int = 2
    children: int = 2
    time_scale: float = 10.0
    lease_ms: int = 30_000
    poll_ms: int = 1_000
    op_bound_ms: int = 15_000
    wait_s: float = 60.0
    tree_bound_s: float = 120.0
    shutdown_s: float = 15.0
    hold_timeout_s: float = 120.0
    pieces: dict[str, Any] = field(default_factory=dict)


class ScenarioRun:
    """What a scenario's `act` works with: the cluster, bounded waits, the holds, and the
    facts it records for the audit."""

    def __init__(
        self, cluster: Cluster, settings: FaultSettings, network: NetworkFault | None = None
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.network = network
        self.zombies: list[tuple[str, str]] = []
        self.slow_stops: list[str] = []
        self.terminated: list[str] = []

    @property
    def shutdown_s(self) -> float:
        return self.settings.shutdown_s

    def wait(self, match: Callable[[Event], bool], what: str, *, since: int = 0) -> Event:
        """The first event matching (bounded by `wait_s`)."""
        return self.cluster.wait_for(match, self.settings.wait_s, what, since=since)

    def held(self, hold_id: str, *, exclusive: bool = True) -> Event:
        """Wait until a pod reports it holds a call at `hold_id`. With `exclusive`, the
        first pod to hold wins: the hold is disarmed in every other pod (a pod that takes
        the work over later must not stop there too)."""
        event = self.wait(
            lambda e: e.get("kind") == "held" and e.get("hold") == hold_id,
            f"a pod to reach hold {hold_id}",
        )
        if exclusive:
            for pod in self.cluster.pods:
                if pod.index != event["pod_index"]:
                    self.cluster.send(pod, {"cmd": "disarm", "hold": hold_id})
                    self.cluster.send(pod, {"cmd": "release", "hold": hold_id})
        return event

    def release_everywhere(self, hold_id: str) -> None:
        """Disarm `hold_id` and release any call held for it, in every live pod."""
        for pod in self.cluster.pods:
            self.cluster.send(pod, {"cmd": "disarm", "hold": hold_id})
            self.cluster.send(pod, {"cmd": "release", "hold": hold_id})

    def freeze(self, pod: Pod) -> None:
        """SIGSTOP `pod` at a quiet moment: every new call of it held, every call in flight
        ended (so it holds no transaction open), then frozen. `thaw` undoes it."""
        mark = self.cluster.mark()
        self.cluster.send(
            pod, {"cmd": "quiesce", "hold": "quiet", "timeout_s": self.settings.wait_s / 2}
        )
        self.wait(
            lambda e: e.get("pod") == pod.instance_id and e.get("kind") == "quiet",
            f"{pod.instance_id} to have no call in flight",
            since=mark,
        )
        self.cluster.signal(pod, signal.SIGSTOP)

    def thaw(self, pod: Pod) -> None:
        """SIGCONT `pod` and let the calls held since `freeze` go on."""
        self.cluster.signal(pod, signal.SIGCONT)
        self.cluster.send(pod, {"cmd": "release", "hold": "quiet"})

    def expect_zombie(self, pod: str, execution: str) -> None:
        """`pod` was frozen past its lease of `execution`: the audit checks it fenced
        itself after it woke."""
        self.zombies.append((pod, execution))


__all__ = ["FaultSettings", "ScenarioRun"]
