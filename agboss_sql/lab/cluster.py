"""`agboss-sql cluster --workload tree|module:attr`: worker processes running a workflow
app on one database, chaos, and an audit read from the stores.

A workload is a `ClusterWorkload`: the app the workers load (`module:attr` of a
`Workflows`) and the runs to start. `tree` is the lab's demo tree (`tree_app`); any app
written on the public API can be one (`examples/order_saga` has one).

The run: the workers start (each `agboss-sql worker --app ... --commands`, an `Engine` taking
commands on standard input; on a cluster of database nodes, `ClusterConfig.nodes`, worker
`i` on node `i mod n` with the others as its failover alternates); the runs are started, handed to the workers in turn; every
pause is answered by two workers at once that are not the one that paused (one answer
wins); as the work progresses one run is cancelled from a worker that is not running it,
one worker is SIGKILLed and replaced, and another is frozen (SIGSTOP) past its leases and
thawed (it comes back a zombie). When every run has ended, the workers are stopped
(SIGTERM) and the run is audited from the database — the rules read the stores' rows, not
the workload:

- `one-holder`, `epochs-increase`, `zombie-fenced`: one holder per epoch, epochs granted
  in rising order, nothing stored by the frozen worker under a lease taken over from it;
- `effect-once`: no business row written twice, no outbound attempt sent twice;
- `child-once`: every child finished, each by one finish of its current attempt;
- `run-ends`: every run ended; a succeeded run decided to close and undid nothing; a
  cancelled run decided to cancel, unwound, and stored each undo once;
- `pause-once`: every pause of an ended run is answered or cancelled, and resolved once;
- `graceful-stop`: every worker stopped (exit 0) within the shutdown bound;
- and the workload's own rules, if it has some (the tree: every leaf of a succeeded tree
  charged once; every order of a cancelled tree refunded once).
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agboss_sql.lab.cluster_audit import Report, audit_cluster, mine
from agboss_sql.lab.cluster_view import State, live_view, render_report
from agboss_sql.lab.faults.audit import read_sql_history
from agboss_sql.lab.faults.harness import Cluster, Event, Pod, WaitTimeout
from agboss_sql.lab.workload import ClusterConfig, ClusterRun, ClusterWorkload, node_url
from agboss_sql.sql.migrate import sync_url


def load_workload(spec: str) -> ClusterWorkload:
    """`tree`, `langgraph` (`graph_app`: a LangGraph agent), or `module:attr` naming a
    `ClusterWorkload`."""
    if spec == "tree":
        from agboss_sql.lab import tree_app

        chosen: ClusterWorkload = tree_app.workload
        return chosen
    if spec == "langgraph":
        from agboss_sql.lab import graph_app

        graphs: ClusterWorkload = graph_app.workload
        return graphs
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--workload {spec!r} must be `tree` or package.module:attribute")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(
            f"--workload {spec!r}: no module {error.name!r} (run from the directory that "
            "holds it, or put it on PYTHONPATH)"
        ) from error
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueError(f"--workload {spec!r}: {module_name} has no {attribute!r}") from None
    if not isinstance(found, ClusterWorkload):
        raise ValueError(
            f"--workload {spec!r} is a {type(found).__name__}, not a ClusterWorkload "
            "(agboss_sql.lab.cluster): give the app and the runs to start"
        )
    return found


class WorkerStartError(RuntimeError):
    """A worker exited, or did not say it was ready, before the run began: the message
    names it and quotes the line it failed with."""


def run_cluster(
    config: ClusterConfig,
    workload: ClusterWorkload,
    *,
    view: Callable[[State, ClusterConfig], None] | None = None,
    out: Callable[[str], None] | None = None,
) -> Report:
    """Run the cluster on `workload` (see the module) and answer its audited report."""
    from agboss_sql.sql.migrate import upgrade

    started = time.monotonic()
    state = State()

    def show(phase: str | None = None) -> None:
        if phase is not None:
            state.phase = phase
        if view is not None:
            view(state, config)

    show("migrating the database")
    if config.migrate:
        upgrade(config.url)
    # The audit reads the lab's business table whether the workload writes it or not.
    from agboss_sql.lab.business import create_business_table

    create_business_table(config.url)
    run_id = uuid.uuid4().hex[:8]
    tenant = f"cluster-{run_id}"
    runs = workload.runs(config, run_id)
    run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix="agboss-cluster-"))
    names = iter(f"w{n}" for n in range(1, 100))

    def base() -> dict[str, Any]:
        return {
            "instance_id": next(names),
            "app": workload.app,
            "lease_ms": config.lease_ms,
            "max_concurrent_steps": config.max_concurrent_steps,
            "shutdown_ms": int(config.shutdown_s * 1000 * 0.8),
            "start_timeout": _start_bound(config.timeout_s),
        }

    nodes = config.nodes
    cluster = Cluster(
        run_dir,
        config.url,
        [base() for _ in range(config.workers)],
        command=(sys.executable, "-m", "agboss_sql.cli", "worker", "--commands", "--config"),
        url_for_pod=(lambda index, _url: node_url(nodes, index)) if len(nodes) > 1 else None,
    )
    engine = sa.create_engine(sync_url(config.url))
    slow_stops: list[str] = []
    chaos = _Chaos(config, tenant, runs)
    try:
        cluster.start()
        for pod in cluster.pods:
            state.alive[pod.instance_id] = "starting"
        show(f"starting {config.workers} workers")
        for pod in cluster.pods:
            _wait_ready(cluster, pod, config.timeout_s, tick=show)
            state.alive[pod.instance_id] = "up"
            show()
        show("running")
        for index, run in enumerate(runs):
            live = [p for p in cluster.pods if p.alive]
            cluster.send(
                live[index % len(live)],
                {
                    "cmd": "start",
                    "workflow": run.workflow,
                    "input": run.input,
                    "id": run.id,
                    "tenant": tenant,
                },
            )
        deadline = time.monotonic() + config.timeout_s
        seen = 0
        last_poll = 0.0
        while time.monotonic() < deadline:
            events = cluster.snapshot()
            for event in events[seen:]:
                _observe(state, event)
            seen = len(events)
            _answer_pauses(cluster, state, tenant)
            now = time.monotonic()
            if now - last_poll > 0.25:
                last_poll = now
                _poll(engine, tenant, state, workload, runs)
                if sum(state.statuses[s] for s in ("succeeded", "cancelled", "failed")) >= len(
                    runs
                ):
                    break
            chaos.act(cluster, state, engine)
            show()
            time.sleep(0.1)
        chaos.thaw(cluster, state)
        show("stopping the workers")
        for pod in cluster.pods:
            if pod.alive:
                state.alive[pod.instance_id] = "stopping"
                show()
                stopped = cluster.stop(pod, config.shutdown_s)
                if not stopped:
                    slow_stops.append(pod.instance_id)
                state.alive[pod.instance_id] = "stopped" if stopped else "stopped (slow)"
            elif state.alive.get(pod.instance_id, "").startswith("up"):
                state.alive[pod.instance_id] = "exited"
            state.slots.pop(pod.instance_id, None)
        for event in cluster.snapshot()[seen:]:
            _observe(state, event)
        # The counters as the report will give them: a zombie logs its lost leases as it
        # wakes, and a worker writes what it still had to log as it stops.
        _poll(engine, tenant, state, workload, runs)
        show("auditing")
    finally:
        cluster.close()
        engine.dispose()
    history = mine(read_sql_history(config.url), tenant, runs)
    (run_dir / "history.json").write_text(json.dumps(asdict(history), default=str), "utf-8")
    events = cluster.snapshot()
    with open(run_dir / "events.jsonl", "w", encoding="utf-8") as log:
        for event in events:
            log.write(json.dumps(event, default=str) + "\n")
    report = audit_cluster(
        history,
        events,
        config=config,
        workload=workload,
        tenant=tenant,
        runs=runs,
        frozen=(chaos.frozen_id, chaos.held, chaos.thawed_at),
        slow_stops=slow_stops,
        chaos=state.chaos,
        wall_s=time.monotonic() - started,
    )
    report.run_dir = str(run_dir)
    if out is not None:
        out(f"run directory: {run_dir}")
    return report


def _start_bound(timeout_s: float) -> float:
    """How long a worker may take to be ready: the run's bound, at most 60 s."""
    return min(timeout_s, 60.0)


def _wait_ready(
    cluster: Cluster, pod: Pod, timeout_s: float, *, tick: Callable[[], None] | None = None
) -> None:
    """Wait for the worker's `ready` (calling `tick` every half second); a worker that
    exits first, or is not ready within `_start_bound(timeout_s)`, raises
    `WorkerStartError` at once, quoting the line it failed with."""
    bound = _start_bound(timeout_s)
    deadline = time.monotonic() + bound
    while True:
        try:
            cluster.wait_for(
                lambda e: e.get("pod") == pod.instance_id and e.get("kind") == "ready",
                0.5,
                f"{pod.instance_id} ready",
            )
            return
        except WaitTimeout:
            if not pod.alive:
                raise WorkerStartError(
                    f"worker {pod.instance_id} exited before it was ready: {_failure_line(pod)}"
                ) from None
            if time.monotonic() >= deadline:
                raise WorkerStartError(
                    f"worker {pod.instance_id} was not ready within {bound:g} s (--timeout): "
                    f"{_failure_line(pod)}"
                ) from None
            if tick is not None:
                tick()


def _failure_line(pod: Pod) -> str:
    """What a worker said about its failure: its command's one-line failure if it wrote
    one, else its first line (the first retry says why it is not ready)."""
    try:
        text = pod.output_path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    lines = [line for line in text.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("agboss-sql worker: ")]
    if said:
        return said[-1].removeprefix("agboss-sql worker: ")
    return lines[0] if lines else "(nothing on its standard error)"


def _observe(state: State, event: Event) -> None:
    kind, pod = event.get("kind"), event.get("pod")
    if not isinstance(pod, str):
        return
    if kind == "status":
        state.slots[pod] = (int(event["busy"]), int(event["max"]), int(event["waiting"]))
    elif kind == "stopped":
        state.alive[pod] = "stopped"
    elif kind == "tree-run":
        state.running[str(event["tree"])] = pod
    elif kind == "tree-end":
        state.running.pop(str(event["tree"]), None)


def _answer_pauses(cluster: Cluster, state: State, tenant: str) -> None:
    """Each pause is answered by two live workers that did not pause it, at once: one
    answer resolves it, the other is refused (`NotPausedError`). A pause is seen in the
    workers' events, or in the database (`State.paused`, from `_poll`): a worker killed
    right after it paused a run never says so, and its run must be answered all the same."""
    now = time.monotonic()
    waiting = {
        (str(event["tree"]), str(event.get("pod")))
        for event in cluster.snapshot()
        if event.get("kind") == "paused" and str(event["tree"]) not in state.answered
    }
    waiting |= {
        (run_id, "") for run_id in state.paused if now - state.answered.get(run_id, -10.0) >= 2.0
    }
    sent: set[str] = set()
    for tree, paused_by in sorted(waiting, key=lambda w: (w[0], w[1] == "")):
        others = [p for p in cluster.pods if p.alive and p.instance_id != paused_by]
        if tree in sent or not others:
            continue
        sent.add(tree)
        state.answered[tree] = now
        for pod in others[:2]:
            cluster.send(
                pod,
                {
                    "cmd": "resume",
                    "id": tree,
                    "tenant": tenant,
                    "decision": {"approved": True, "by": pod.instance_id},
                },
            )


def _poll(
    engine: sa.Engine, tenant: str, state: State, workload: ClusterWorkload, runs: list[ClusterRun]
) -> None:
    from agboss_sql.sql.schema import execution_lease_events as events
    from agboss_sql.sql.schema import execution_records as records
    from agboss_sql.sql.schema import fenced_effect_results as results

    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(records.c.status, sa.func.count())
            .where(records.c.tenant_id == tenant)
            .group_by(records.c.status)
        )
        state.statuses = Counter({str(status): int(count) for status, count in rows})
        state.paused = {
            str(run_id)
            for (run_id,) in connection.execute(
                sa.select(records.c.execution_id).where(
                    records.c.tenant_id == tenant, records.c.status == "paused"
                )
            )
        }
        kinds = connection.execute(
            sa.select(events.c.kind, events.c.reason).where(
                events.c.tenant_id == tenant, events.c.kind.in_(("taken-over", "lost"))
            )
        ).all()
        stored = int(
            connection.execute(
                sa.select(sa.func.count()).where(results.c.tenant_id == tenant)
            ).scalar_one()
        )
        progress = None if workload.progress is None else workload.progress(connection, runs)
    state.takeovers = sum(1 for kind, _ in kinds if kind == "taken-over")
    state.lost = sum(1 for kind, _ in kinds if kind == "lost")
    state.refused = sum(
        1 for kind, why in kinds if kind == "lost" and str(why or "").startswith("refused by")
    )
    ended = sum(state.statuses[s] for s in ("succeeded", "cancelled", "failed"))
    if progress is not None:
        state.progress = progress
    else:
        state.progress = max(ended / max(1, len(runs)), min(1.0, stored / (6 * len(runs))))


class _Chaos:
    """Cancel at 15% of the work, SIGKILL at 30%, SIGSTOP for two leases at 45%."""

    def __init__(self, config: ClusterConfig, tenant: str, runs: list[ClusterRun]) -> None:
        self.config = config
        self.tenant = tenant
        self.runs = runs
        self.cancelled = not config.cancel
        self.killed = not config.chaos
        self.frozen: Pod | None = None
        self.frozen_id: str | None = None
        self.held: list[tuple[str, str, int]] = []
        self.freeze_done = not config.chaos
        self.thaw_at: float | None = None
        self.thawed_at: int | None = None

    def act(self, cluster: Cluster, state: State, engine: sa.Engine) -> None:
        share = state.progress
        if not self.cancelled and share >= 0.15:
            self.cancelled = self._cancel(cluster, state)
        if not self.killed and share >= 0.30:
            self.killed = True
            alive = [p for p in cluster.pods if p.alive]
            victim = max(alive, key=lambda p: len(_held_by(engine, self.tenant, p.instance_id)))
            cluster.kill(victim)
            state.alive[victim.instance_id] = "killed"
            state.slots.pop(victim.instance_id, None)
            replacement = cluster.add(
                {
                    **json.loads(cluster.pods[0].config_path.read_text()),
                    "instance_id": f"w{len(cluster.pods) + 1}",
                }
            )
            state.alive[replacement.instance_id] = "up"
            state.chaos.append(
                f"SIGKILL {victim.instance_id} at {share:.0%} of the work; "
                f"{replacement.instance_id} started"
            )
        if not self.freeze_done and self.frozen is None and share >= 0.45:
            alive = [p for p in cluster.pods if p.alive]
            holding = {p.instance_id: _held_by(engine, self.tenant, p.instance_id) for p in alive}
            pod = max(alive, key=lambda p: len(holding[p.instance_id]))
            held = holding[pod.instance_id]
            if not held and share < 0.9:
                return  # nobody holds a lease this instant: a freeze would lose nothing
            cluster.signal(pod, signal.SIGSTOP)
            self.frozen, self.frozen_id, self.held = pod, pod.instance_id, held
            self.thaw_at = time.monotonic() + 2 * self.config.lease_ms / 1000
            state.alive[pod.instance_id] = "frozen"
            state.chaos.append(
                f"SIGSTOP {pod.instance_id} at {share:.0%} of the work, holding "
                f"{len(held)} leases, for {2 * self.config.lease_ms} ms"
            )
        if (
            self.frozen is not None
            and self.thaw_at is not None
            and time.monotonic() >= self.thaw_at
        ):
            self.thaw(cluster, state)

    def thaw(self, cluster: Cluster, state: State) -> None:
        if self.frozen is None or self.freeze_done:
            return
        self.thawed_at = time.time_ns() // 1_000_000
        cluster.signal(self.frozen, signal.SIGCONT)
        state.alive[self.frozen.instance_id] = "up (thawed)"
        state.chaos.append(f"SIGCONT {self.frozen.instance_id}")
        self.freeze_done = True

    def _cancel(self, cluster: Cluster, state: State) -> bool:
        """Cancel a running run from a worker that is not running it. False when no run
        is seen running yet (tried again at the next tick)."""
        candidates = [r.id for r in self.runs if r.id in state.running]
        if not candidates:
            return False
        for run_id in candidates:
            holder = state.running.get(run_id)
            others = [p for p in cluster.pods if p.alive and p.instance_id != holder]
            for pod in others:
                since = cluster.mark()
                cluster.send(pod, {"cmd": "cancel", "id": run_id, "tenant": self.tenant})
                try:
                    answer = cluster.wait_for(
                        _cancel_answer(pod.instance_id, run_id), 10, "cancel", since=since
                    )
                except WaitTimeout:
                    continue
                if answer.get("kind") == "cancel-requested":
                    state.chaos.append(f"cancel {run_id} from {pod.instance_id} (run on {holder})")
                    return True
                state.chaos.append(f"cancel {run_id} from {pod.instance_id}: too late")
                break
        return True


def _cancel_answer(instance_id: str, run_id: str) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return (
            event.get("pod") == instance_id
            and event.get("kind") in ("cancel-requested", "cancel-too-late")
            and event.get("tree") == run_id
        )

    return match


def _held_by(engine: sa.Engine, tenant: str, instance_id: str) -> list[tuple[str, str, int]]:
    """The live leases `instance_id` holds now: `(instance, execution, epoch)`."""
    from agboss_sql.sql.schema import execution_leases as leases

    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(leases.c.execution_id, leases.c.lease_epoch).where(
                leases.c.tenant_id == tenant,
                leases.c.holder_instance_id == instance_id,
                leases.c.released == sa.false(),
                leases.c.finished == sa.false(),
                leases.c.yielded == sa.false(),
            )
        )
        return [(instance_id, str(e), int(n)) for e, n in rows]


__all__ = [
    "WorkerStartError",
    "ClusterConfig",
    "ClusterRun",
    "ClusterWorkload",
    "Report",
    "State",
    "live_view",
    "load_workload",
    "render_report",
    "run_cluster",
]
