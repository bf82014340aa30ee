"""The named fault scenarios: what is armed at start, and what the harness does.

Each scenario's `act(run)` drives the fault; `run_scenario` then lets every tree end,
stops the pods gracefully and audits. Pods are `pod-1`..`pod-N`; `pod-K` submits the
trees `tree-K-0` and `tree-K-1` (`tree-K-0` has a pause).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agboss_sql.lab.faults.holds import (
    AFTER_COMMIT,
    AFTER_WORK,
    BEFORE_FENCE,
    BEFORE_WORK,
    StoreHoldPoint,
)

if TYPE_CHECKING:
    from agboss_sql.lab.faults.harness import NetworkFault
    from agboss_sql.lab.faults.run import ScenarioRun

Act = Callable[["ScenarioRun"], None]


@dataclass(frozen=True)
class Hold:
    """A hold armed in a pod before it starts (`pod` None: in every pod; the first pod to
    reach it is the one the scenario acts on)."""

    hold_id: str
    point: StoreHoldPoint
    contains: str | None = None
    pod: int | None = None
    count: int = 1

    def command(self) -> dict[str, Any]:
        return {
            "hold": self.hold_id,
            "point": self.point.name,
            "contains": self.contains,
            "count": self.count,
        }


@dataclass(frozen=True)
class Scenario:
    """A named fault: its holds armed at start, and what the harness does to the pods."""

    name: str
    doc: str
    act: Act
    holds: tuple[Hold, ...] = ()
    dialects: tuple[str, ...] | None = None
    """The dialects it runs on (`None`: all)."""
    tags: tuple[str, ...] = field(default=())
    network: Callable[[str], NetworkFault] | None = None
    """Builds the scenario's network fault for the database URL (a TCP proxy per pod):
    each pod then connects through `network.url_for_pod(index, url)`, and `act` drives it
    through `run.network`. Closed after the run."""
    probe: Callable[[str], list[str]] | None = None
    """A scenario that runs its own processes instead of the pods' trees (`probes`): called
    with the database URL, it answers the violations it found; no pod is started."""

    def runs_on(self, dialect: str) -> bool:
        return self.dialects is None or dialect in self.dialects


FIRST_TREE = "tree-1-0"


def _kill_when_held(hold_id: str) -> Act:
    def act(run: ScenarioRun) -> None:
        held = run.held(hold_id)
        run.cluster.kill(run.cluster.pods[held["pod_index"]])
        run.release_everywhere(hold_id)

    return act


def _kill_at(name: str, point: StoreHoldPoint, doc: str) -> Scenario:
    return Scenario(
        name=name,
        doc=doc,
        act=_kill_when_held(name),
        holds=(Hold(name, point, f"{FIRST_TREE}/s1/"),),
        tags=("kill",),
    )


def _zombie(run: ScenarioRun) -> None:
    held = run.held("zombie")
    pod = run.cluster.pods[held["pod_index"]]
    run.freeze(pod)
    # Frozen past its lease: another pod takes the tree over and ends it.
    run.wait(
        lambda e: e.get("kind") == "tree-done" and e.get("tree") == FIRST_TREE,
        f"another pod to take {FIRST_TREE} over and end it while {pod.instance_id} is frozen",
    )
    mark = run.cluster.mark()
    run.thaw(pod)
    run.cluster.send(pod, {"cmd": "release", "hold": "zombie"})
    run.expect_zombie(pod.instance_id, FIRST_TREE)
    for kind, what in (
        ("lease-lost", "keeper to fence itself"),
        ("handover", f"runner to give {FIRST_TREE} up"),
    ):
        run.wait(
            _tree_event(pod.instance_id, kind, FIRST_TREE),
            f"{pod.instance_id}'s {what} after it woke",
            since=mark,
        )


def _tree_event(pod: str, kind: str, tree: str) -> Callable[[dict[str, Any]], bool]:
    def match(event: dict[str, Any]) -> bool:
        return event.get("pod") == pod and event.get("kind") == kind and event.get("tree") == tree

    return match


def _zombie_child(run: ScenarioRun) -> None:
    child = f"{FIRST_TREE}.c0"
    first = run.held("zombie-child", exclusive=False)
    frozen = run.cluster.pods[first["pod_index"]]
    run.freeze(frozen)
    # Another pod rescues the child at the next attempt and reaches its own finish.
    second = run.wait(
        lambda e: (
            e.get("kind") == "held"
            and e.get("hold") == "zombie-child"
            and e["pod_index"] != frozen.index
        ),
        f"another pod to rescue {child} while {frozen.instance_id} is frozen",
    )
    rescuer = run.cluster.pods[second["pod_index"]]
    mark = run.cluster.mark()
    run.thaw(frozen)
    run.cluster.send(frozen, {"cmd": "release", "hold": "zombie-child"})
    run.wait(
        lambda e: (
            e.get("pod") == frozen.instance_id
            and e.get("kind") in ("child-finish", "op-error")
            and child in (str(e.get("child", "")) + str(e.get("message", "")))
        ),
        f"the superseded finish of {child} by {frozen.instance_id}",
        since=mark,
    )
    run.cluster.send(rescuer, {"cmd": "release", "hold": "zombie-child"})
    run.release_everywhere("zombie-child")


def _sigterm(run: ScenarioRun) -> None:
    # Stopped while it surely works: held right after its first step committed, inside the
    # tree whose lease it holds (an effect event seen late, on a loaded machine, may come
    # after the tree ended and the pod held nothing left to release).
    held = run.held("sigterm")
    pod = run.cluster.pods[held["pod_index"]]
    run.terminated.append(pod.instance_id)
    if not run.cluster.stop(pod, run.shutdown_s):
        run.slow_stops.append(pod.instance_id)
    run.release_everywhere("sigterm")


def _outage(run: ScenarioRun) -> None:
    first = run.wait(lambda e: e.get("kind") == "tree-run", "a pod to run a tree")
    pod = run.cluster.pods[first["pod_index"]]
    mark = run.cluster.mark()
    run.cluster.send(pod, {"cmd": "outage", "on": True})
    # The pod learns of the outage from its own calls and gives its trees up.
    run.wait(
        lambda e: e.get("pod_index") == pod.index and e.get("kind") == "handover",
        f"{pod.instance_id} to give a tree up during the outage",
        since=mark,
    )
    run.cluster.send(pod, {"cmd": "outage", "on": False})


def _zombie_in_transaction(run: ScenarioRun) -> None:
    held = run.held("zombie-in-transaction")
    pod = run.cluster.pods[held["pod_index"]]
    mark = run.cluster.mark()
    run.cluster.signal(pod, signal.SIGSTOP)
    # The frozen pod holds the tree's lease row locked (on SQLite: the write lock). Every
    # other pod's call that needs it must end in a typed error within its bound — unless
    # the server ended the frozen transaction first (its idle-transaction bound), and
    # another pod took the tree over without waiting long enough to fail.
    try:
        run.wait(
            lambda e: (
                e.get("pod") != pod.instance_id
                and (
                    e.get("kind") == "op-hung"
                    or (
                        e.get("kind") == "op-error"
                        and (not e.get("typed") or str(e.get("code")).startswith("store."))
                    )
                    or (e.get("kind") == "tree-run" and e.get("tree") == FIRST_TREE)
                )
            ),
            f"another pod's call to end (or be reported hung), or another pod to take "
            f"{FIRST_TREE} over, while {pod.instance_id} is frozen inside a transaction",
            since=mark,
        )
    finally:
        run.cluster.signal(pod, signal.SIGCONT)
        run.release_everywhere("zombie-in-transaction")


def _kill_in_pause(run: ScenarioRun) -> None:
    paused = run.wait(lambda e: e.get("kind") == "paused", "a pod to pause a tree")
    run.cluster.kill(run.cluster.pods[paused["pod_index"]])


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _kill_at(
            "kill-before-fence",
            BEFORE_FENCE,
            "SIGKILL a pod inside a fenced effect before its transaction began; another pod "
            "takes the tree over and runs the step once",
        ),
        _kill_at(
            "kill-before-work",
            BEFORE_WORK,
            "SIGKILL a pod between the fence and the work (the lease row locked, nothing "
            "written); the transaction dies with it",
        ),
        _kill_at(
            "kill-after-work",
            AFTER_WORK,
            "SIGKILL a pod after the work wrote its business row, before COMMIT: the row "
            "never commits, and the next holder writes it once",
        ),
        _kill_at(
            "kill-after-commit",
            AFTER_COMMIT,
            "SIGKILL a pod after COMMIT, before it read the answer: the next holder replays "
            "the stored result",
        ),
        Scenario(
            name="zombie",
            doc="SIGSTOP a pod past its lease, SIGCONT it after another pod ended its tree: "
            "every write it attempts is refused and its keeper fences itself",
            act=_zombie,
            holds=(Hold("zombie", BEFORE_FENCE, f"{FIRST_TREE}/s5/"),),
            tags=("freeze",),
        ),
        Scenario(
            name="zombie-child",
            doc="SIGSTOP a pod about to finish a child, let another pod rescue the child at "
            "the next attempt, then wake the first: its late finish must not count",
            act=_zombie_child,
            holds=(
                Hold(
                    "zombie-child",
                    StoreHoldPoint("child_queue.finish", "before"),
                    f"{FIRST_TREE}.c0",
                    pod=None,
                ),
            ),
            tags=("freeze",),
        ),
        Scenario(
            name="kill-child-finish",
            doc="SIGKILL a pod about to finish a child: another pod rescues the child at the "
            "next attempt, it is finished once, and its parent woken once",
            act=_kill_when_held("kill-child-finish"),
            holds=(
                Hold(
                    "kill-child-finish",
                    StoreHoldPoint("child_queue.finish", "before"),
                    f"{FIRST_TREE}.c0",
                    pod=None,
                ),
            ),
            tags=("kill",),
        ),
        Scenario(
            name="sigterm",
            doc="SIGTERM a pod while it works (its first step of a tree just committed): it "
            "stops within the shutdown bound, releasing its leases, and the others finish its "
            "trees",
            act=_sigterm,
            holds=(Hold("sigterm", AFTER_COMMIT, f"{FIRST_TREE}/s1/"),),
        ),
        Scenario(
            name="store-outage",
            doc="the store becomes unreachable from inside one pod: its calls fail with a "
            "typed error, its keeper fences itself, and the others take its trees over",
            act=_outage,
        ),
        Scenario(
            name="kill-in-transaction",
            doc="SIGKILL a pod holding a child's effect transaction open (on SQLite: the "
            "BEGIN IMMEDIATE write lock): the others go on and rescue the child",
            act=_kill_when_held("kill-in-transaction"),
            holds=(Hold("kill-in-transaction", AFTER_WORK, ".c0/work/", pod=None),),
            tags=("kill",),
        ),
        Scenario(
            name="zombie-in-transaction",
            doc="SIGSTOP a pod between the fence and the work (its transaction open, the "
            "lease row locked): every other pod's call waiting on it ends in a typed error "
            "within its bound, and all goes on after SIGCONT",
            act=_zombie_in_transaction,
            holds=(Hold("zombie-in-transaction", BEFORE_WORK, f"{FIRST_TREE}/s1/"),),
            tags=("freeze",),
        ),
        Scenario(
            name="kill-after-complete",
            doc="SIGKILL a pod right after the COMMIT that completed its tree, before it "
            "reported the end or finished the lease: the tree has ended (the database says "
            "so), no pod resumes it, and its lease runs out",
            act=_kill_when_held("kill-after-complete"),
            holds=(
                Hold(
                    "kill-after-complete",
                    StoreHoldPoint("execution_record.complete", "after"),
                    FIRST_TREE,
                ),
            ),
            tags=("kill",),
        ),
        Scenario(
            name="kill-during-pause",
            doc="SIGKILL a pod while its tree waits on a pause: another pod resolves the "
            "pause and the tree's next holder takes the decision",
            act=_kill_in_pause,
            tags=("kill",),
        ),
    )
}
"""Every scenario by name."""

SHORT_SET = tuple(s.name for s in SCENARIOS.values() if "long" not in s.tags)
"""The scenarios of the default test run (those tagged `long` run only on demand)."""


def register(scenario: Scenario) -> Scenario:
    """Add a scenario to `SCENARIOS` (a network scenario from another module, say); its
    name must be new."""
    if scenario.name in SCENARIOS:
        raise ValueError(f"a scenario named {scenario.name!r} exists already")
    SCENARIOS[scenario.name] = scenario
    return scenario


__all__ = ["SCENARIOS", "SHORT_SET", "Hold", "Scenario", "register"]
