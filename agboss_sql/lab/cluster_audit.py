"""The cluster's audit: every rule read from the stores' rows and the workers' events
(see `agboss_sql.lab.cluster`)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from agboss_sql.lab.faults.audit import StoreHistory, Violation, _one_holder
from agboss_sql.lab.faults.harness import Event

if TYPE_CHECKING:
    from agboss_sql.lab.workload import ClusterConfig, ClusterRun, ClusterWorkload

GRANTS = ("acquired", "taken-over", "reclaimed")
END_KEY = "@agboss/end"
UNDO_EFFECT = "wf.undo"


@dataclass
class Report:
    """The audited outcome of a run (`ok` only when no rule was violated)."""

    ok: bool
    url: str
    workload: str
    tenant: str
    workers: int
    runs: dict[str, int]
    effects_stored: int
    undos: int
    children_finished: int
    pauses_answered: int
    takeovers: int
    leases_lost: int
    zombie_writes_refused: int
    chaos: list[str]
    wall_s: float
    violations: list[str] = field(default_factory=list)
    frozen_leases_taken_over: int = 0
    run_dir: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def mine(history: StoreHistory, tenant: str, runs: list[ClusterRun]) -> StoreHistory:
    prefixes = tuple(r.id for r in runs)

    def mine(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r.get("tenant_id") == tenant]

    return StoreHistory(
        lease_events=mine(history.lease_events),
        leases=mine(history.leases),
        results=mine(history.results),
        business_rows=[r for r in history.business_rows if r.startswith(prefixes)],
        outbound=mine(history.outbound),
        children=mine(history.children),
        records=mine(history.records),
        tree_keys=mine(history.tree_keys),
        pauses=mine(history.pauses),
    )


# -- the audit ---------------------------------------------------------------------------


def _value(value: Any) -> Any:
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def audit_cluster(
    history: StoreHistory,
    events: list[Event],
    *,
    config: ClusterConfig,
    workload: ClusterWorkload,
    tenant: str,
    runs: list[ClusterRun],
    frozen: tuple[str | None, list[tuple[str, str, int]], int | None],
    slow_stops: list[str],
    chaos: list[str],
    wall_s: float,
) -> Report:
    """The report of a run, every rule checked from the rows (see the module)."""
    from agboss_sql.contracts.stores import COMPENSATED_PREFIX, UNWINDING_KEY

    violations: list[Violation] = []
    violations += _one_holder(history)
    violations += _epochs_increase(history)
    frozen_pod, held, thawed_at = frozen
    if frozen_pod is not None:
        violations += _zombie_fenced(history, frozen_pod, held, thawed_at)
    violations += _effect_once(history, events)
    violations += _child_once(history, events)
    keys: dict[str, dict[str, Any]] = defaultdict(dict)
    for row in history.tree_keys:
        keys[str(row["root_execution_id"])][str(row["key"])] = _value(row["value"])
    records = {str(r["execution_id"]): r for r in history.records}
    undos: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in history.results:
        if row["name"] == UNDO_EFFECT:
            undos[str(row["step_execution_id"])].append(row)
    statuses: Counter[str] = Counter()
    for run in runs:
        record = records.get(run.id)
        status = None if record is None else str(record["status"])
        statuses[status or "missing"] += 1
        decided = keys[run.id].get(END_KEY)
        decision = decided.get("decision") if isinstance(decided, dict) else None
        if status == "succeeded":
            if decision != "close":
                violations.append(
                    Violation("run-ends", f"{run.id} succeeded, decided {decision!r}")
                )
            if undos.get(run.id) or UNWINDING_KEY in keys[run.id]:
                violations.append(Violation("run-ends", f"{run.id} succeeded but undid steps"))
        elif status == "cancelled":
            if decision != "cancel":
                violations.append(
                    Violation("run-ends", f"{run.id} cancelled, decided {decision!r}")
                )
            if UNWINDING_KEY not in keys[run.id]:
                violations.append(Violation("run-ends", f"{run.id} cancelled without unwinding"))
            marked = {
                k[len(COMPENSATED_PREFIX) :]
                for k in keys[run.id]
                if k.startswith(COMPENSATED_PREFIX)
            }
            stored = Counter(str(r["step_idempotency_key"]) for r in undos.get(run.id, []))
            for key in sorted(marked):
                if stored[f"undo/{key}"] != 1:
                    violations.append(
                        Violation("run-ends", f"{run.id}: undo {key} marked done but not stored")
                    )
        elif status == "failed":
            outcome = _value(record.get("outcome")) if record else None
            if not (isinstance(outcome, dict) and outcome.get("error")):
                violations.append(Violation("run-ends", f"{run.id} failed without an error"))
        else:
            violations.append(Violation("run-ends", f"run {run.id} did not end (status {status})"))
    violations += _pause_once(history, events, records)
    for pod in slow_stops:
        violations.append(
            Violation("graceful-stop", f"{pod} did not stop (exit 0) within the shutdown bound")
        )
    if workload.audit is not None:
        violations += workload.audit(history, runs)
    lost = [e for e in history.lease_events if e["kind"] == "lost"]
    return Report(
        ok=not violations,
        url=_shown(config.url),
        workload=workload.name,
        tenant=tenant,
        workers=config.workers,
        runs=dict(statuses),
        effects_stored=sum(1 for r in history.results if r["name"] != UNDO_EFFECT),
        undos=sum(len(rows) for rows in undos.values()),
        children_finished=sum(1 for r in history.children if r["status"] == "finished"),
        pauses_answered=sum(1 for p in history.pauses if p["status"] in ("resolved", "taken")),
        takeovers=sum(1 for e in history.lease_events if e["kind"] == "taken-over"),
        leases_lost=len(lost),
        zombie_writes_refused=sum(
            1 for e in lost if str(e.get("reason") or "").startswith("refused by the store")
        ),
        chaos=chaos,
        wall_s=round(wall_s, 1),
        violations=[str(v) for v in violations],
        frozen_leases_taken_over=len(_taken_over(history, held)) if frozen_pod else 0,
    )


def _effect_once(history: StoreHistory, events: list[Event]) -> list[Violation]:
    found = []
    for row, count in sorted(Counter(history.business_rows).items()):
        if count > 1:
            found.append(Violation("effect-once", f"business row {row!r} written {count} times"))
    sends = Counter((e["call"], e["attempt"]) for e in events if e.get("kind") == "sent")
    for (call, attempt), count in sorted(sends.items()):
        if count > 1:
            found.append(
                Violation(
                    "effect-once", f"outbound call {call} attempt {attempt} sent {count} times"
                )
            )
    return found


def _child_once(history: StoreHistory, events: list[Event]) -> list[Violation]:
    found = []
    finishes: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if event.get("kind") == "child-finish" and event.get("finished"):
            finishes[str(event["child"])].append(event)
    for row in history.children:
        child = str(row["child_execution_id"])
        if row["status"] != "finished":
            found.append(Violation("child-once", f"child {child} is {row['status']}, not finished"))
        counted = finishes.get(child, [])
        if len(counted) > 1:
            found.append(Violation("child-once", f"child {child} finished {len(counted)} times"))
        for event in counted:
            if event.get("attempt") is not None and int(event["attempt"]) != int(row["attempt"]):
                found.append(
                    Violation(
                        "child-once",
                        f"child {child} finished by attempt {event['attempt']}, but attempt "
                        f"{row['attempt']} is its current one",
                    )
                )
    return found


def _pause_once(
    history: StoreHistory, events: list[Event], records: dict[str, dict[str, Any]]
) -> list[Violation]:
    found = []
    resolved = Counter(str(e["tree"]) for e in events if e.get("kind") == "resolved")
    pauses_of: Counter[str] = Counter()
    for pause in history.pauses:
        root = str(pause["root_execution_id"])
        pauses_of[root] += 1
        record = records.get(root)
        status = None if record is None else str(record["status"])
        # A succeeded run took every pause; an ended one left none waiting (a cancel may
        # come after an answer: that pause stays resolved, never taken).
        if (status == "succeeded" and pause["status"] != "taken") or (
            status in ("cancelled", "failed") and pause["status"] == "pending"
        ):
            found.append(
                Violation(
                    "pause-once",
                    f"{root} {status} with pause {pause['pause_id']} {pause['status']}",
                )
            )
    for root, count in sorted(resolved.items()):
        if count > pauses_of[root]:
            found.append(
                Violation(
                    "pause-once", f"{root}: {count} answers resolved {pauses_of[root]} pauses"
                )
            )
    return found


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


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


__all__ = ["Report", "audit_cluster", "mine"]
