"""`agboss-sql cluster`: N worker processes on one database, a workload of trees, chaos,
a live view, and a final report audited from the database.

    agboss-sql cluster [--url URL] [--workers 3] [--trees 20] [--lease-ms 3000] [--json]

What it does:

1. migrates the database and creates the business table;
2. starts the workers (`agboss-sql worker`, each a process of its own);
3. submits the trees (each fanning out `fan_out` children per level down to `depth`, each
   leaf charging an order in a fenced effect and recording an outbound call; every
   `pause_every`-th tree pauses for a decision that another worker resolves) and hands
   them to the workers in turn;
4. injects chaos as the leaves get charged: one tree is cancelled from a worker that is not
   running it, one worker is SIGKILLed and a replacement started, another is frozen
   (SIGSTOP) for two leases and thawed (SIGCONT): it comes back as a zombie whose lease
   is gone;
5. waits for every tree to end, stops the workers (SIGTERM), and audits the run from the
   database: every rule below, each violation named. The exit status is 0 only when every
   rule held.

The audit rules (the fault suite's rules where they apply, read from the same rows):
`one-holder`, `result-and-row`, `charged-once`, `child-once` (see
`agboss_sql.lab.faults.audit`), and:

- `tree-ends`: every tree ended (`succeeded`, `cancelled`, or `failed` with a reason);
  a succeeded tree decided to close (`END_DECISION_KEY`), charged every order of its
  leaves and undid nothing; a cancelled tree decided to cancel, unwound
  (`UNWINDING_KEY`), undid its reserve and refunded each order it charged, each once;
- `epochs-increase`: per lease, the epochs granted rise strictly in the log's order (a
  holder frozen between its take and its log entry logs an older epoch late: allowed
  only when it logs that epoch `lost` after it), and the lease's current epoch has its
  grant in the log (every takeover is visible);
- `zombie-fenced`: nothing was stored under a lease the frozen worker held at the freeze
  after a later epoch of that lease was granted (a write fenced before the freeze may
  commit after the thaw: its transaction holds the lease row, so no takeover can come
  between), and it logged at least one of those leases `lost` after it woke;
- `graceful-stop`: every worker stopped (exit 0) within the shutdown bound.
"""

from __future__ import annotations

import json
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agboss_sql.lab.faults.audit import (
    AuditFacts,
    StoreHistory,
    Violation,
    _charged_once,
    _child_once,
    _one_holder,
    _result_and_row,
    read_sql_history,
)
from agboss_sql.lab.faults.harness import Cluster, Event, Pod, WaitTimeout
from agboss_sql.lab.tree_worker import (
    BUSINESS_EFFECT,
    END_DECISION_KEY,
    STEP_EFFECT,
    TreeSpec,
    WorkerConfig,
    descendants_of,
    end_decision,
    leaves_of,
)
from agboss_sql.sql.migrate import sync_url

GRANTS = ("acquired", "taken-over", "reclaimed")


@dataclass(frozen=True)
class ClusterConfig:
    """One cluster run. `chaos` turns the cancel, the kill and the freeze on (the cancel
    alone with `cancel=True, chaos=False`)."""

    url: str
    workers: int = 3
    trees: int = 20
    fan_out: int = 2
    depth: int = 2
    pause_every: int = 5
    lease_ms: int = 3_000
    max_concurrent_steps: int = 4
    step_ms: int = 30
    chaos: bool = True
    cancel: bool = True
    timeout_s: float = 240.0
    shutdown_s: float = 15.0
    run_dir: Path | None = None
    migrate: bool = True
    """Migrate the database first (off for a test database made from the schema)."""

    def __post_init__(self) -> None:
        for what in ("workers", "trees", "fan_out", "lease_ms", "max_concurrent_steps"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{what} must be a positive int, got {value!r}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth!r}")
        if self.chaos and self.workers < 3:
            raise ValueError("chaos needs at least 3 workers: one killed, one frozen, one sane")


@dataclass
class Report:
    """The audited outcome of a run (`ok` only when no rule was violated)."""

    ok: bool
    url: str
    tenant: str
    workers: int
    trees: dict[str, int]
    orders_charged: int
    orders_refunded: int
    children_finished: int
    takeovers: int
    leases_lost: int
    zombie_writes_refused: int
    chaos: list[str]
    step_ms_p50: float | None
    step_ms_p99: float | None
    steps_stored: int
    wall_s: float
    violations: list[str] = field(default_factory=list)
    frozen_leases_taken_over: int = 0
    """Of the leases the frozen worker held at the freeze, how many another instance took
    over while it was frozen (a freeze that lands as the worker's last steps end leaves
    nothing to take over, and the zombie then has nothing to lose)."""
    run_dir: str = ""
    """Where the workers' configs, stderr, events and the audited rows were written."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- the run -----------------------------------------------------------------------------


@dataclass
class _State:
    """What the orchestrator knows while the run goes on (from the workers' events and
    the database)."""

    alive: dict[str, str] = field(default_factory=dict)
    slots: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    chaos: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    charged: int = 0
    takeovers: int = 0
    refused: int = 0
    lost: int = 0


def run_cluster(
    config: ClusterConfig,
    *,
    view: Callable[[_State, ClusterConfig], None] | None = None,
    out: Callable[[str], None] | None = None,
) -> Report:
    """Run the cluster (see the module) and answer its audited report."""
    from agboss_sql.lab.business import create_business_table
    from agboss_sql.sql.migrate import upgrade

    started = time.monotonic()
    if config.migrate:
        upgrade(config.url)
    create_business_table(config.url)
    run_id = uuid.uuid4().hex[:8]
    tenant = f"cluster-{run_id}"
    trees = [f"r{run_id}-t{i:02d}" for i in range(config.trees)]
    spec_of = {
        tree: TreeSpec(
            fan_out=config.fan_out,
            depth=config.depth,
            pause=config.pause_every > 0 and i % config.pause_every == config.pause_every - 1,
        )
        for i, tree in enumerate(trees)
    }
    run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix="agboss-cluster-"))
    worker_config = WorkerConfig(
        lease_ms=config.lease_ms,
        max_concurrent_steps=config.max_concurrent_steps,
        step_ms=config.step_ms,
        shutdown_ms=int(config.shutdown_s * 1000 * 0.8),
    )
    names = iter(f"w{n}" for n in range(1, 100))

    def base() -> dict[str, Any]:
        return {**asdict(worker_config), "instance_id": next(names)}

    cluster = Cluster(
        run_dir,
        config.url,
        [base() for _ in range(config.workers)],
        command=(sys.executable, "-m", "agboss_sql.cli", "worker", "--commands", "--config"),
    )
    state = _State()
    engine = sa.create_engine(sync_url(config.url))
    slow_stops: list[str] = []
    frozen_held: list[tuple[str, str, int]] = []
    frozen_pod: str | None = None
    try:
        cluster.start()
        for pod in cluster.pods:
            cluster.wait_for(_ready(pod.instance_id), 60, f"{pod.instance_id} ready")
            state.alive[pod.instance_id] = "up"
        _submit(config.url, tenant, spec_of)
        for index, tree in enumerate(trees):
            live = [p for p in cluster.pods if p.alive]
            cluster.send(live[index % len(live)], {"cmd": "start", "tenant": tenant, "tree": tree})
        leaves_total = sum(len(leaves_of(t, s)) for t, s in spec_of.items())
        plan = _Chaos(config, tenant, trees, spec_of, leaves_total)
        deadline = time.monotonic() + config.timeout_s
        seen = 0
        last_poll = 0.0
        while time.monotonic() < deadline:
            events = cluster.snapshot()
            for event in events[seen:]:
                _observe(state, event)
            seen = len(events)
            now = time.monotonic()
            if now - last_poll > 0.2:
                last_poll = now
                _poll(engine, tenant, f"r{run_id}-", state)
                if sum(state.statuses[s] for s in ("succeeded", "cancelled", "failed")) >= len(
                    trees
                ):
                    break
            held = plan.act(cluster, state, events, engine)
            if held is not None:
                frozen_pod, frozen_held = held
            if view is not None:
                view(state, config)
            time.sleep(0.1)
        plan.thaw(cluster, state)
        for pod in cluster.pods:
            if pod.alive and not cluster.stop(pod, config.shutdown_s):
                slow_stops.append(pod.instance_id)
        for event in cluster.snapshot()[seen:]:
            _observe(state, event)
        if view is not None:
            view(state, config)
    finally:
        cluster.close()
        engine.dispose()
    history = _tenant_history(read_sql_history(config.url), tenant, f"r{run_id}-")
    (run_dir / "history.json").write_text(
        json.dumps(asdict(history), default=str), encoding="utf-8"
    )
    with open(run_dir / "events.jsonl", "w", encoding="utf-8") as log:
        for event in cluster.snapshot():
            log.write(json.dumps(event, default=str) + "\n")
    report = audit_cluster(
        history,
        cluster.snapshot(),
        config=config,
        tenant=tenant,
        spec_of=spec_of,
        frozen=(frozen_pod, frozen_held, plan.thawed_at),
        slow_stops=slow_stops,
        chaos=state.chaos,
        wall_s=time.monotonic() - started,
    )
    report.run_dir = str(run_dir)
    if out is not None:
        out(f"run directory: {run_dir}")
    return report


def _said(instance_id: str, kind: str, tree: str) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return (
            event.get("pod") == instance_id
            and event.get("kind") == kind
            and event.get("tree") == tree
        )

    return match


def _said_any(instance_id: str, kinds: tuple[str, ...], tree: str) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return (
            event.get("pod") == instance_id
            and event.get("kind") in kinds
            and event.get("tree") == tree
        )

    return match


def _ready(instance_id: str) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return event.get("pod") == instance_id and event.get("kind") == "ready"

    return match


def _submit(url: str, tenant: str, spec_of: dict[str, TreeSpec]) -> None:
    """Record every tree (spec, execution id, `running` record) through the stores."""
    import asyncio

    from agboss_sql.application import Application, DatabaseUrl
    from agboss_sql.contracts.clocks import SystemClock
    from agboss_sql.contracts.stores import (
        ExecutionLeaseRepository,
        ExecutionRecordRepository,
        ExecutionTreeRepository,
    )
    from agboss_sql.lab.tree_worker import submit_tree
    from agboss_sql.sql import sql_stores

    async def submit() -> None:
        async with Application(
            "agboss-cluster", sql_stores(), {DatabaseUrl: DatabaseUrl(url)}
        ) as app:
            for tree, spec in spec_of.items():
                await submit_tree(
                    app.store(ExecutionTreeRepository),
                    app.store(ExecutionRecordRepository),
                    app.store(ExecutionLeaseRepository),
                    tenant,
                    tree,
                    spec,
                    SystemClock(),
                )

    asyncio.run(submit())


def _poll(engine: sa.Engine, tenant: str, prefix: str, state: _State) -> None:
    """The run's figures as the database has them now: tree statuses, orders charged,
    takeovers, leases lost and zombie writes refused."""
    from agboss_sql.lab.business import business_rows
    from agboss_sql.sql.schema import execution_lease_events as events
    from agboss_sql.sql.schema import execution_records as records

    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(records.c.status, sa.func.count())
            .where(records.c.tenant_id == tenant)
            .group_by(records.c.status)
        )
        state.statuses = Counter({str(status): int(count) for status, count in rows})
        state.charged = int(
            connection.execute(
                sa.select(sa.func.count()).where(business_rows.c.row.like(f"{prefix}%|charge"))
            ).scalar_one()
        )
        kinds = connection.execute(
            sa.select(events.c.kind, events.c.reason).where(
                events.c.tenant_id == tenant, events.c.kind.in_(("taken-over", "lost"))
            )
        ).all()
    state.takeovers = sum(1 for kind, _ in kinds if kind == "taken-over")
    state.lost = sum(1 for kind, _ in kinds if kind == "lost")
    state.refused = sum(
        1 for kind, why in kinds if kind == "lost" and str(why or "").startswith("refused by")
    )


def _observe(state: _State, event: Event) -> None:
    kind, pod = event.get("kind"), event.get("pod")
    if kind == "status" and isinstance(pod, str):
        state.slots[pod] = (int(event["busy"]), int(event["max"]), int(event["waiting"]))
    elif kind == "stopped" and isinstance(pod, str):
        state.alive[pod] = "stopped"
    elif kind == "ready" and isinstance(pod, str):
        state.alive.setdefault(pod, "up")


class _Chaos:
    """The chaos schedule, driven by how many orders were charged (so a fast and a slow
    machine see the same story): cancel at 15%, kill at 30%, freeze at 45%."""

    def __init__(
        self,
        config: ClusterConfig,
        tenant: str,
        trees: list[str],
        spec_of: dict[str, TreeSpec],
        leaves_total: int,
    ) -> None:
        self.config = config
        self.tenant = tenant
        self.trees = trees
        self.spec_of = spec_of
        self.leaves_total = leaves_total
        self.cancelled = not config.cancel
        self.killed = not config.chaos
        self.frozen: Pod | None = None
        self.freeze_done = not config.chaos
        self.thaw_at: float | None = None
        self.thawed_at: int | None = None
        """When the frozen worker was thawed (ms since the epoch)."""

    def act(
        self, cluster: Cluster, state: _State, events: list[Event], engine: sa.Engine
    ) -> tuple[str, list[tuple[str, str, int]]] | None:
        share = state.charged / max(1, self.leaves_total)
        answer = None
        if not self.cancelled and share >= 0.15:
            self.cancelled = True
            self._cancel(cluster, state, events, engine)
        if not self.killed and share >= 0.30:
            self.killed = True
            # The live worker holding the most leases: its death has the most to recover.
            alive = [p for p in cluster.pods if p.alive]
            victim = max(alive, key=lambda p: len(_held_by(engine, self.tenant, p.instance_id)))
            cluster.kill(victim)
            state.alive[victim.instance_id] = "killed"
            state.slots.pop(victim.instance_id, None)
            replacement = cluster.add(
                {
                    **json.loads(cluster.pods[1].config_path.read_text()),
                    "instance_id": f"w{len(cluster.pods) + 1}",
                }
            )
            state.alive[replacement.instance_id] = "up"
            state.chaos.append(
                f"SIGKILL {victim.instance_id} at {share:.0%} of the orders; "
                f"{replacement.instance_id} started"
            )
        if not self.freeze_done and self.frozen is None and share >= 0.45:
            # The live worker holding the most leases: its freeze has the most to lose.
            alive = [p for p in cluster.pods if p.alive]
            holding = {p.instance_id: _held_by(engine, self.tenant, p.instance_id) for p in alive}
            pod = max(alive, key=lambda p: len(holding[p.instance_id]))
            held = holding[pod.instance_id]
            if not held and share < 0.9:
                # Parents waiting on children hold no lease, so at a given moment no worker
                # may hold one: a freeze then loses nothing. Look again at the next tick.
                return answer
            cluster.signal(pod, signal.SIGSTOP)
            self.frozen = pod
            self.thaw_at = time.monotonic() + 2 * self.config.lease_ms / 1000
            state.alive[pod.instance_id] = "frozen"
            state.chaos.append(
                f"SIGSTOP {pod.instance_id} at {share:.0%} of the orders, holding "
                f"{len(held)} leases, for {2 * self.config.lease_ms} ms"
            )
            answer = (pod.instance_id, held)
        if (
            self.frozen is not None
            and self.thaw_at is not None
            and time.monotonic() >= self.thaw_at
        ):
            self.thaw(cluster, state)
        return answer

    def thaw(self, cluster: Cluster, state: _State) -> None:
        if self.frozen is None or self.freeze_done:
            return
        # Read before the signal: the worker may run (and log) before this thread reads
        # the time again.
        self.thawed_at = time.time_ns() // 1_000_000
        cluster.signal(self.frozen, signal.SIGCONT)
        state.alive[self.frozen.instance_id] = "up (thawed)"
        state.chaos.append(f"SIGCONT {self.frozen.instance_id}")
        self.freeze_done = True

    def _cancel(
        self, cluster: Cluster, state: _State, events: list[Event], engine: sa.Engine
    ) -> None:
        # A tree without a pause, seen running on some worker and with the fewest orders
        # charged (the most left to undo and to stop): cancelled from another worker.
        from agboss_sql.lab.business import business_rows

        running: dict[str, str] = {}
        for event in events:
            if event.get("kind") == "tree-run":
                running[event["tree"]] = event["pod"]
            elif event.get("kind") == "tree-end":
                running.pop(event["tree"], None)
        candidates = [t for t in self.trees if t in running and not self.spec_of[t].pause]
        with engine.connect() as connection:
            charged = {
                t: int(
                    connection.execute(
                        sa.select(sa.func.count()).where(business_rows.c.row.like(f"{t}.%|charge"))
                    ).scalar_one()
                )
                for t in candidates
            }
        # Fewest charged first; a tree that already decided to close refuses the cancel
        # (`cancel-too-late`), and the next one is tried.
        order = sorted(candidates, key=lambda t: charged[t]) or [self.trees[0]]
        for tree in order:
            holder = running.get(tree)
            if self._cancel_one(cluster, state, tree, holder) is not False:
                return  # won, or no worker answered (another tree would fare no better)
        state.chaos.append(f"cancel: every tree tried ({len(order)}) had decided to close")

    def _cancel_one(
        self, cluster: Cluster, state: _State, tree: str, holder: str | None
    ) -> bool | None:
        """Ask a worker other than the holder to cancel `tree`, until one answers. True
        when the cancel won, False when it came too late; None when no worker answered."""
        others = [p for p in cluster.pods if p.alive and p.instance_id != holder]
        # Sent until a worker answers (a worker may be busy or die first).
        for pod in [*reversed(others), *(p for p in cluster.pods if p.alive)]:
            since = cluster.mark()
            cluster.send(pod, {"cmd": "cancel", "tenant": self.tenant, "tree": tree})
            try:
                answer = cluster.wait_for(
                    _said_any(pod.instance_id, ("cancel-requested", "cancel-too-late"), tree),
                    10,
                    "cancel",
                    since=since,
                )
            except WaitTimeout:
                continue
            won = answer.get("kind") == "cancel-requested"
            state.chaos.append(
                f"cancel {tree} from {pod.instance_id} (last run on {holder})"
                if won
                else f"cancel {tree} from {pod.instance_id}: too late, it had decided to close"
            )
            return won
        state.chaos.append(f"cancel {tree}: no worker answered")
        return None


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


def _tenant_history(history: StoreHistory, tenant: str, prefix: str) -> StoreHistory:
    """The rows of this run only (the database may hold other runs)."""

    def mine(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r.get("tenant_id") == tenant]

    return StoreHistory(
        lease_events=mine(history.lease_events),
        leases=mine(history.leases),
        results=mine(history.results),
        business_rows=[r for r in history.business_rows if r.startswith(prefix)],
        outbound=mine(history.outbound),
        children=mine(history.children),
        records=mine(history.records),
        tree_keys=mine(history.tree_keys),
        pauses=mine(history.pauses),
    )


# -- the audit ---------------------------------------------------------------------------


def audit_cluster(
    history: StoreHistory,
    events: list[Event],
    *,
    config: ClusterConfig,
    tenant: str,
    spec_of: dict[str, TreeSpec],
    frozen: tuple[str | None, list[tuple[str, str, int]], int | None],
    slow_stops: list[str],
    chaos: list[str],
    wall_s: float,
) -> Report:
    """The report of a run, every rule checked from the rows (see the module)."""
    from agboss_sql.contracts.stores import COMPENSATED_PREFIX, UNWINDING_KEY

    trees = list(spec_of)
    violations: list[Violation] = []
    violations += _one_holder(history)
    violations += _result_and_row(history)
    violations += _charged_once(history, events)
    facts = AuditFacts(trees=trees, children_per_tree=config.fan_out)
    violations += _child_once(history, events, facts)
    children = {r["child_execution_id"] for r in history.children}
    rows = set(history.business_rows)
    records = {r["execution_id"]: r for r in history.records}
    keys: dict[str, set[str]] = defaultdict(set)
    decided: dict[str, str | None] = {}
    for row in history.tree_keys:
        keys[row["root_execution_id"]].add(str(row["key"]))
        if row["key"] == END_DECISION_KEY:
            value = row["value"]  # the column's JSON text, as the table stores it
            decided[row["root_execution_id"]] = end_decision(
                json.loads(value) if isinstance(value, str) else value
            )
    statuses: Counter[str] = Counter()
    refunded = 0
    for tree in trees:
        record = records.get(tree)
        status = None if record is None else str(record["status"])
        statuses[status or "missing"] += 1
        spec = spec_of[tree]
        leaves = leaves_of(tree, spec)
        if status in ("succeeded", "cancelled"):
            want = "close" if status == "succeeded" else "cancel"
            if decided.get(tree) != want:
                violations.append(
                    Violation(
                        "tree-ends",
                        f"{tree} {status}, but its end decision is {decided.get(tree)!r}",
                    )
                )
        if status == "succeeded":
            for leaf in leaves:
                if f"{leaf}|charge" not in rows:
                    violations.append(
                        Violation("tree-ends", f"{tree} succeeded but {leaf} charged nothing")
                    )
            undone = [r for r in rows if r.startswith(f"{tree}|undo:")]
            if undone:
                violations.append(Violation("tree-ends", f"{tree} succeeded but undid {undone}"))
            for child, _depth in descendants_of(tree, spec):
                if child not in children:
                    violations.append(
                        Violation("tree-ends", f"{tree} succeeded but {child} never ran")
                    )
        elif status == "cancelled":
            if UNWINDING_KEY not in keys[tree]:
                violations.append(Violation("tree-ends", f"{tree} cancelled without unwinding"))
            if f"{tree}|undo:reserve" not in rows:
                violations.append(Violation("tree-ends", f"{tree} cancelled; reserve not undone"))
            for leaf in leaves:
                charged = f"{leaf}|charge" in rows
                refund = f"{tree}|undo:charge:{leaf}" in rows
                if charged != refund:
                    violations.append(
                        Violation(
                            "tree-ends",
                            f"{tree} cancelled: {leaf} charged {charged}, refunded {refund}",
                        )
                    )
                refunded += refund
            marked = {k for k in keys[tree] if k.startswith(COMPENSATED_PREFIX)}
            if f"{COMPENSATED_PREFIX}reserve" not in marked:
                violations.append(
                    Violation("tree-ends", f"{tree} cancelled; its undo of reserve is unmarked")
                )
        elif status == "failed":
            outcome = record.get("outcome") if record else None
            reason = outcome.get("reason") if isinstance(outcome, dict) else None
            if not reason:
                violations.append(Violation("tree-ends", f"{tree} failed without a reason"))
        else:
            violations.append(Violation("tree-ends", f"tree {tree} did not end (status {status})"))
    violations += _epochs_increase(history)
    frozen_pod, held, thawed_at = frozen
    if frozen_pod is not None:
        violations += _zombie_fenced(history, frozen_pod, held, thawed_at)
    frozen_taken_over = len(_taken_over(history, held)) if frozen_pod is not None else 0
    for pod in slow_stops:
        violations.append(
            Violation("graceful-stop", f"{pod} did not stop (exit 0) within the shutdown bound")
        )
    latencies = sorted(
        float(output["ms"])
        for r in history.results
        if r["name"] in (STEP_EFFECT, BUSINESS_EFFECT)
        and not str(r["step_idempotency_key"]).startswith("undo:")
        and isinstance(output := _json(r["result"]), dict)
        and isinstance(output.get("ms"), int | float)
    )
    lost = [e for e in history.lease_events if e["kind"] == "lost"]
    return Report(
        ok=not violations,
        url=_shown(config.url),
        tenant=tenant,
        workers=config.workers,
        trees=dict(statuses),
        orders_charged=sum(1 for r in rows if r.endswith("|charge")),
        orders_refunded=refunded,
        children_finished=sum(1 for r in history.children if r["status"] == "finished"),
        takeovers=sum(1 for e in history.lease_events if e["kind"] == "taken-over"),
        leases_lost=len(lost),
        zombie_writes_refused=sum(
            1 for e in lost if str(e.get("reason") or "").startswith("refused by the store")
        ),
        chaos=chaos,
        step_ms_p50=_percentile(latencies, 50),
        step_ms_p99=_percentile(latencies, 99),
        steps_stored=len(latencies),
        wall_s=round(wall_s, 1),
        violations=[str(v) for v in violations],
        frozen_leases_taken_over=frozen_taken_over,
    )


def _taken_over(
    history: StoreHistory, held: list[tuple[str, str, int]]
) -> list[tuple[str, int, list[int]]]:
    """Of `held` (`(instance, execution, epoch)`), the leases granted again at a later
    epoch: `(execution, epoch, times of the later grants)`."""
    found = []
    for _, execution, epoch in held:
        later = [
            int(e["at"])
            for e in history.lease_events
            if e["execution_id"] == execution
            and e["kind"] in GRANTS
            and int(e["lease_epoch"]) > epoch
        ]
        if later:
            found.append((execution, epoch, later))
    return found


def _epochs_increase(history: StoreHistory) -> list[Violation]:
    """Per lease, the epochs granted rise in the log's order. A holder logs its take after
    the move, so a holder frozen between the two logs an older epoch late: allowed only
    when that holder logs the same epoch `lost` after it (it learned it was superseded)."""
    found = []
    grants: dict[tuple[str, str], list[int]] = defaultdict(list)
    by_lease: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for event in history.lease_events:
        by_lease[(event["tenant_id"], event["execution_id"])].append(event)
        if event["kind"] in GRANTS:
            grants[(event["tenant_id"], event["execution_id"])].append(int(event["lease_epoch"]))
    for (tenant, execution), log in sorted(by_lease.items()):
        highest = 0
        for index, event in enumerate(log):
            if event["kind"] not in GRANTS:
                continue
            epoch = int(event["lease_epoch"])
            if epoch > highest:
                highest = epoch
                continue
            fenced = any(
                later["kind"] == "lost"
                and later["instance_id"] == event["instance_id"]
                and int(later["lease_epoch"]) == epoch
                for later in log[index + 1 :]
            )
            if not fenced:
                found.append(
                    Violation(
                        "epochs-increase",
                        f"{tenant}/{execution}: epoch {epoch} granted to "
                        f"{event['instance_id']} after epoch {highest}, and never lost by it",
                    )
                )
    for lease in history.leases:
        key = (lease["tenant_id"], lease["execution_id"])
        if int(lease["lease_epoch"]) not in grants.get(key, []):
            found.append(
                Violation(
                    "epochs-increase",
                    f"{key[0]}/{key[1]} is at epoch {lease['lease_epoch']} (held by "
                    f"{lease['holder_instance_id']}) but the log has no grant of it",
                )
            )
    return found


def _zombie_fenced(
    history: StoreHistory, pod: str, held: list[tuple[str, str, int]], thawed_at: int | None
) -> list[Violation]:
    """The frozen worker came back a zombie: nothing was stored under a lease it held at
    the freeze after a later epoch of that lease was granted (its writes were refused), and
    it logged at least one of those leases lost after it woke (it fenced itself).

    A write whose fence passed before the freeze may commit after the thaw: its
    transaction held the lease row, so no later epoch could be granted before it ended;
    the grant's log entry (written after the move) dates the later epoch."""
    found = []
    taken_over = _taken_over(history, held)
    for execution, epoch, later in taken_over:
        for row in history.results:
            if (
                row["lease_execution_id"] == execution
                and int(row["token"]) == epoch
                and int(row["stored_at"]) > min(later)
            ):
                found.append(
                    Violation(
                        "zombie-fenced",
                        f"{pod} stored {row['step_execution_id']}|{row['step_idempotency_key']} "
                        f"at its old epoch {epoch} of {execution} after a later epoch was "
                        "granted",
                    )
                )
    if taken_over and thawed_at is not None:
        fenced = [
            e
            for e in history.lease_events
            if e["instance_id"] == pod and e["kind"] == "lost" and int(e["at"]) >= thawed_at
        ]
        if not fenced:
            found.append(
                Violation(
                    "zombie-fenced",
                    f"{pod} was frozen past its leases ({len(taken_over)} taken over) but "
                    "logged none lost after it woke",
                )
            )
    return found


def _json(value: Any) -> Any:
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _percentile(values: list[float], pct: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 1)
    return round(statistics.quantiles(values, n=100, method="inclusive")[pct - 1], 1)


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# -- output ------------------------------------------------------------------------------


def render_report(report: Report) -> str:
    """The report as text."""
    lines = [
        f"cluster on {report.url}: {report.workers} workers, tenant {report.tenant}",
        "trees: " + ", ".join(f"{k} {v}" for k, v in sorted(report.trees.items())),
        f"orders charged: {report.orders_charged}, refunded: {report.orders_refunded}",
        f"children finished: {report.children_finished}",
        f"takeovers: {report.takeovers}, leases lost: {report.leases_lost}, "
        f"zombie writes refused by the store: {report.zombie_writes_refused}",
        f"steps stored: {report.steps_stored}, latency p50 {report.step_ms_p50} ms, "
        f"p99 {report.step_ms_p99} ms",
        f"wall time: {report.wall_s} s (workers' output, events and rows: {report.run_dir})",
        "chaos:",
        *(f"  {c}" for c in report.chaos or ["(none)"]),
    ]
    if report.violations:
        lines.append(f"BROKEN: {len(report.violations)} violations")
        lines += [f"  {v}" for v in report.violations]
    else:
        lines.append("every invariant held")
    return "\n".join(lines)


def live_view() -> tuple[Callable[[_State, ClusterConfig], None], Callable[[], None]]:
    """A `rich` live view of the run: `(update, close)`."""
    from rich.console import Group
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    live = Live(refresh_per_second=4, transient=False)
    live.start()

    def update(state: _State, config: ClusterConfig) -> None:
        table = Table(title="workers", expand=False)
        for column in ("worker", "state", "slots busy", "waiting"):
            table.add_column(column)
        for pod, alive in sorted(state.alive.items()):
            busy, most, waiting = state.slots.get(pod, (0, config.max_concurrent_steps, 0))
            table.add_row(pod, alive, f"{busy}/{most}", str(waiting))
        trees = Table(title="trees", expand=False)
        for column in ("running", "waiting", "paused", "succeeded", "cancelled", "failed"):
            trees.add_column(column)
        s = state.statuses
        trees.add_row(
            *(
                str(s[k])
                for k in ("running", "queued", "paused", "succeeded", "cancelled", "failed")
            )
        )
        summary = Text(
            f"orders charged {state.charged}   takeovers {state.takeovers}   "
            f"leases lost {state.lost}   zombie writes refused by the store {state.refused}"
        )
        chaos = Text("\n".join(state.chaos[-4:]), style="yellow")
        live.update(Group(table, trees, summary, chaos))

    return update, live.stop


__all__ = ["ClusterConfig", "Report", "audit_cluster", "live_view", "render_report", "run_cluster"]
