"""The audit after a scenario: every promise checked from the database and the pods'
event logs.

Rules (each violation names its rule):

- `one-holder`: an epoch of a lease was granted to one instance only, and no result was
  stored at an older epoch of a scope after a newer epoch had stored one (a zombie's
  write after a takeover); and no two pods reported running a tree, or a child, at one
  epoch (what the pods were granted, which a database that lost acknowledged commits,
  e.g. a standby promoted from asynchronous replication, no longer shows).
- `result-and-row`: every business row has its stored result and every stored result its
  business row (they commit together or not at all).
- `charged-once`: each business row (an order's charge) exists at most once, each
  attempt of an outbound call was sent at most once, and no effect was reported run
  (not replayed) twice: once committed, a fenced effect replays.
- `child-once`: every child is finished, by one finish only, and by its current attempt
  (a superseded worker's finish never counts).
- `no-undo-on-handover`: no tree was compensated: the workload never fails, so an undo
  can only come from a hand-over mistaken for a failure.
- `tree-ends`: every tree's record succeeded within the bound, and its outbound call is
  completed. A tree whose pod the scenario killed or stopped before its submit returned
  (no record, and no pod's event names it: `never_submitted`) was never promised, and is
  not expected; `child-once` expects no children of it either.
- `no-hang`: every pod operation ended, in a result or a typed error (an `AgbossError`:
  a raw driver error says nothing of what was applied), within its bound (time a pod was
  frozen or held by the harness not counted), and every pod stopped within the shutdown
  bound when asked.
- `graceful-stop`: a pod asked to stop (SIGTERM) released the lease of every tree it was
  running before it exited.
- `zombie-fenced`: a pod frozen past its lease fenced itself after it woke: its keeper
  logged the lease `lost`, and it stored nothing at its old epoch.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

RULES = (
    "one-holder",
    "result-and-row",
    "charged-once",
    "child-once",
    "no-undo-on-handover",
    "tree-ends",
    "no-hang",
    "graceful-stop",
    "zombie-fenced",
)
GRANTS = ("acquired", "taken-over", "reclaimed")


@dataclass(frozen=True)
class Violation:
    """One broken promise: the rule and what was found."""

    rule: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.detail}"


@dataclass
class StoreHistory:
    """The rows the audit reads, as plain dicts."""

    lease_events: list[dict[str, Any]] = field(default_factory=list)
    leases: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    business_rows: list[str] = field(default_factory=list)
    outbound: list[dict[str, Any]] = field(default_factory=list)
    children: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    tree_keys: list[dict[str, Any]] = field(default_factory=list)
    pauses: list[dict[str, Any]] = field(default_factory=list)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1, default=str), encoding="utf-8")


def read_sql_history(url: str) -> StoreHistory:
    """Read the project's tables (and the business table) on `url`."""
    from agboss_sql.lab.database import business_rows
    from agboss_sql.sql import schema
    from agboss_sql.sql.migrate import sync_url

    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as connection:

            def rows(table: sa.Table, *order: Any) -> list[dict[str, Any]]:
                query = sa.select(table)
                if order:
                    query = query.order_by(*order)
                return [dict(r._mapping) for r in connection.execute(query)]

            events = schema.execution_lease_events
            return StoreHistory(
                lease_events=rows(events, *events.primary_key.columns),
                leases=rows(schema.execution_leases),
                results=[
                    {k: v for k, v in r.items() if k not in ("identity_hash",)}
                    for r in rows(schema.fenced_effect_results)
                ],
                business_rows=[
                    r[0]
                    for r in connection.execute(
                        sa.select(business_rows.c.row).order_by(business_rows.c.id)
                    )
                ],
                outbound=[
                    {k: v for k, v in r.items() if k != "identity_hash"}
                    for r in rows(schema.outbound_calls)
                ],
                children=rows(schema.child_executions),
                records=rows(schema.execution_records),
                tree_keys=rows(schema.execution_tree_keys),
                pauses=rows(schema.paused_executions),
            )
    finally:
        engine.dispose()


@dataclass(frozen=True)
class AuditFacts:
    """What the audit needs besides the rows: the trees of the run, the freeze windows,
    the frozen pods expected to fence themselves, and what the harness saw (trees not
    ended within the bound, pods that did not stop in time)."""

    trees: Sequence[str]
    children_per_tree: int
    freezes: Sequence[tuple[str, int, int | None]] = ()
    zombies: Sequence[tuple[str, str]] = ()
    unfinished: Sequence[str] = ()
    slow_stops: Sequence[str] = ()
    terminated: Sequence[str] = ()
    op_bound_ms: int = 15_000
    unsubmitted: Sequence[str] = ()
    """Trees whose pod was killed or stopped before their submit returned
    (`never_submitted`): not expected to end, as long as the rows and the events still
    show nothing of them."""


def never_submitted(
    trees: Iterable[str],
    owners: Mapping[str, str],
    ended: Collection[str],
    recorded: Collection[str],
    events: Iterable[dict[str, Any]],
) -> list[str]:
    """The trees an ended pod never submitted: their pod (`owners`) was killed or stopped
    (`ended`) before their record committed (not in `recorded`), and no pod's event names
    them. Nothing was promised for such a tree: its submit never returned, and no other
    pod can know of it (on SQLite, a pod held inside a store call keeps its other trees'
    records waiting for the database's one writer)."""
    return _unseen((tree for tree in trees if owners.get(tree) in ended), recorded, events)


def _unseen(
    trees: Iterable[str], recorded: Collection[str], events: Iterable[dict[str, Any]]
) -> list[str]:
    """Those of `trees` with no record that no event names."""
    named = {event.get("tree") for event in events}
    return [tree for tree in trees if tree not in recorded and tree not in named]


def _expected_trees(
    history: StoreHistory, events: list[dict[str, Any]], facts: AuditFacts
) -> list[str]:
    """`facts.trees` but those never submitted, checked again on the final rows and events
    (a tree with a record, or named by an event, is expected whatever the harness said)."""
    if not facts.unsubmitted:
        return list(facts.trees)
    recorded = {r["execution_id"] for r in history.records}
    excused = set(_unseen(facts.unsubmitted, recorded, events))
    return [tree for tree in facts.trees if tree not in excused]


def audit(
    history: StoreHistory, events: Iterable[dict[str, Any]], facts: AuditFacts
) -> list[Violation]:
    """Every violation of every rule, from the rows and the pods' events."""
    events = list(events)
    found: list[Violation] = []
    found += _one_holder(history)
    found += _one_holder_reported(events)
    found += _result_and_row(history)
    found += _charged_once(history, events)
    expected = _expected_trees(history, events, facts)
    found += _child_once(history, events, facts, expected)
    found += _no_undo(history, events)
    found += _tree_ends(history, facts, expected)
    found += _no_hang(events, facts)
    found += _graceful_stop(history, events, facts)
    found += _zombie_fenced(history, events, facts)
    return found


def _graceful_stop(
    history: StoreHistory, events: list[dict[str, Any]], facts: AuditFacts
) -> list[Violation]:
    found = []
    for pod in facts.terminated:
        running: dict[str, int] = {}
        for event in events:
            if event.get("pod") != pod:
                continue
            if event.get("kind") == "stopping":
                break
            if event.get("kind") == "tree-run":
                running[event["tree"]] = int(event["epoch"])
            elif event.get("kind") in ("tree-done", "handover"):
                running.pop(event["tree"], None)
        released = {
            (e["execution_id"], int(e["lease_epoch"]))
            for e in history.lease_events
            if e["instance_id"] == pod and e["kind"] in ("released", "finished")
        }
        for tree, epoch in sorted(running.items()):
            if (tree, epoch) not in released:
                found.append(
                    Violation(
                        "graceful-stop",
                        f"{pod} was stopped while running {tree} at epoch {epoch} and did not "
                        "release its lease: the next holder waits for it to run out",
                    )
                )
    return found


def _one_holder(history: StoreHistory) -> list[Violation]:
    found = []
    holders: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    for event in history.lease_events:
        if event["kind"] in GRANTS:
            holders[(event["tenant_id"], event["execution_id"], int(event["lease_epoch"]))].add(
                event["instance_id"]
            )
    for (tenant, execution, epoch), who in sorted(holders.items()):
        if len(who) > 1:
            found.append(
                Violation(
                    "one-holder",
                    f"epoch {epoch} of {tenant}/{execution} was granted to {sorted(who)}",
                )
            )
    by_scope: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in history.results:
        by_scope[row["scope_key"]].append(row)
    for scope, rows in by_scope.items():
        rows.sort(key=lambda r: (int(r["stored_at"]), int(r["token"])))
        highest = None
        for row in rows:
            token = int(row["token"])
            if highest is not None and token < highest[0] and int(row["stored_at"]) > highest[1]:
                found.append(
                    Violation(
                        "one-holder",
                        f"{scope}: a result was stored at epoch {token} "
                        f"({row['step_idempotency_key']}) after epoch {highest[0]} had stored one: "
                        "a holder wrote after its lease was taken over",
                    )
                )
            if highest is None or token > highest[0]:
                highest = (token, int(row["stored_at"]))
    return found


def _one_holder_reported(events: list[dict[str, Any]]) -> list[Violation]:
    """No two pods reported a grant of one epoch (a tree run, a child run): the pods' own
    record, kept outside the database."""
    holders: dict[tuple[str, int], set[str]] = defaultdict(set)
    for event in events:
        kind = event.get("kind")
        if kind in ("tree-run", "child-run") and event.get("epoch") is not None:
            what = event["tree"] if kind == "tree-run" else event["child"]
            holders[(str(what), int(event["epoch"]))].add(str(event.get("pod")))
    return [
        Violation(
            "one-holder",
            f"epoch {epoch} of {what} was reported granted to {sorted(who)}: one fencing "
            "token granted twice",
        )
        for (what, epoch), who in sorted(holders.items())
        if len(who) > 1
    ]


def _result_and_row(history: StoreHistory) -> list[Violation]:
    from agboss_sql.lab.faults.workload import EFFECT

    results = {
        f"{r['step_execution_id']}|{r['step_idempotency_key']}"
        for r in history.results
        if r["name"] == EFFECT
    }
    rows = set(history.business_rows)
    found = []
    for row in sorted(rows - results):
        found.append(Violation("result-and-row", f"business row {row!r} has no stored result"))
    for row in sorted(results - rows):
        found.append(Violation("result-and-row", f"stored result {row!r} has no business row"))
    for r in history.results:
        if r["result"] is None:
            found.append(
                Violation("result-and-row", f"result row {r['identity']!r:.120} has no result")
            )
    return found


def _charged_once(history: StoreHistory, events: list[dict[str, Any]]) -> list[Violation]:
    found = []
    for row, count in sorted(Counter(history.business_rows).items()):
        if count > 1:
            found.append(
                Violation("charged-once", f"business row {row!r} was written {count} times")
            )
    ran = Counter(
        (e["execution"], e["step"])
        for e in events
        if e.get("kind") == "effect" and not e.get("replayed")
    )
    for (execution, step), count in sorted(ran.items()):
        if count > 1:
            found.append(
                Violation(
                    "charged-once",
                    f"the effect of {execution} {step} was reported run {count} times (not "
                    "replayed): a commit acknowledged to one holder was lost",
                )
            )
    sends = Counter((e["call"], e["attempt"]) for e in events if e.get("kind") == "sent")
    for (call, attempt), count in sorted(sends.items()):
        if count > 1:
            found.append(
                Violation(
                    "charged-once", f"outbound call {call} attempt {attempt} was sent {count} times"
                )
            )
    return found


def _child_once(
    history: StoreHistory,
    events: list[dict[str, Any]],
    facts: AuditFacts,
    trees: list[str],
) -> list[Violation]:
    found = []
    rows = {r["child_execution_id"]: r for r in history.children}
    expected = {f"{tree}.c{i}" for tree in trees for i in range(facts.children_per_tree)}
    for child in sorted(expected - set(rows)):
        found.append(Violation("child-once", f"child {child} was never queued"))
    finishes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event.get("kind") == "child-finish" and event.get("finished"):
            finishes[event["child"]].append(event)
    for child, row in sorted(rows.items()):
        if row["status"] != "finished":
            found.append(Violation("child-once", f"child {child} is {row['status']}, not finished"))
        counted = finishes.get(child, [])
        if len(counted) > 1:
            found.append(
                Violation(
                    "child-once",
                    f"child {child} was finished {len(counted)} times "
                    f"(attempts {[e['attempt'] for e in counted]})",
                )
            )
        for event in counted:
            if event["attempt"] is not None and int(event["attempt"]) != int(row["attempt"]):
                found.append(
                    Violation(
                        "child-once",
                        f"child {child} was finished by attempt {event['attempt']} on "
                        f"{event['pod']}, but attempt {row['attempt']} is its current one: a "
                        "superseded worker's finish counted",
                    )
                )
    return found


def _no_undo(history: StoreHistory, events: list[dict[str, Any]]) -> list[Violation]:
    from agboss_sql.contracts.stores import COMPENSATED_PREFIX, UNWINDING_KEY

    found = []
    for row in history.tree_keys:
        if row["key"] == UNWINDING_KEY or str(row["key"]).startswith(COMPENSATED_PREFIX):
            found.append(
                Violation(
                    "no-undo-on-handover",
                    f"tree {row['root_execution_id']} has {row['key']!r}: an undo ran though the "
                    "workload never fails (a hand-over was taken for a failure)",
                )
            )
    for event in events:
        if event.get("kind") == "compensate":
            found.append(
                Violation(
                    "no-undo-on-handover",
                    f"{event['pod']} compensated tree {event['tree']} at epoch {event['epoch']} "
                    "after losing it",
                )
            )
    return found


def _tree_ends(history: StoreHistory, facts: AuditFacts, expected: list[str]) -> list[Violation]:
    found = []
    records = {r["execution_id"]: r for r in history.records}
    for tree in expected:
        row = records.get(tree)
        if row is None or row["status"] != "succeeded":
            status = None if row is None else row["status"]
            found.append(Violation("tree-ends", f"tree {tree} did not end (status {status})"))
    for tree in facts.unfinished:
        if tree in records and records[tree]["status"] == "succeeded":
            found.append(Violation("tree-ends", f"tree {tree} ended only after the bound"))
    for row in history.outbound:
        if row["status"] != "completed" and row["step_execution_id"] in facts.trees:
            found.append(
                Violation(
                    "tree-ends",
                    f"outbound call of {row['step_execution_id']} is {row['status']} at attempt "
                    f"{row['attempt']}",
                )
            )
    return found


def _frozen(facts: AuditFacts, pod: str, start: int, end: int) -> bool:
    for who, began, ended in facts.freezes:
        if who == pod and start <= (ended if ended is not None else end) and end >= began:
            return True
    return False


def _no_hang(events: list[dict[str, Any]], facts: AuditFacts) -> list[Violation]:
    found = []
    stopping: set[str] = set()
    for event in events:
        kind = event.get("kind")
        if kind == "stopping":
            # A call cancelled by the pod's own shutdown may end in the driver's error.
            stopping.add(event["pod"])
        if kind in ("op-slow", "op-hung"):
            start = int(event.get("start", 0))
            end = int(event.get("end", event.get("t", start)))
            if _frozen(facts, event["pod"], start, end):
                continue
            found.append(
                Violation(
                    "no-hang",
                    f"{event['pod']}: {event['op']} {'took' if kind == 'op-slow' else 'was still open after'} "
                    f"{event['ms']:.0f} ms (bound {facts.op_bound_ms} ms)",
                )
            )
        elif kind == "op-error" and not event.get("typed") and event["pod"] not in stopping:
            found.append(
                Violation(
                    "no-hang",
                    f"{event['pod']}: {event['op']} ended in an untyped error after "
                    f"{event['ms']:.0f} ms: {event['error']}: {str(event.get('message'))[:160]}",
                )
            )
        elif kind == "hold-timeout":
            found.append(
                Violation("no-hang", f"{event['pod']}: hold {event['hold']} was never acted on")
            )
    for pod in facts.slow_stops:
        found.append(
            Violation("no-hang", f"{pod} did not stop cleanly (exit 0) within the shutdown bound")
        )
    return found


def _zombie_fenced(
    history: StoreHistory, events: list[dict[str, Any]], facts: AuditFacts
) -> list[Violation]:
    found = []
    for pod, execution in facts.zombies:
        lost = [
            e
            for e in events
            if e.get("pod") == pod and e.get("tree") == execution and e.get("kind") == "lease-lost"
        ]
        if not lost:
            found.append(
                Violation(
                    "zombie-fenced",
                    f"{pod} was frozen past its lease of {execution} but its keeper never logged "
                    "the lease lost after it woke",
                )
            )
        epochs = {
            int(e["lease_epoch"])
            for e in history.lease_events
            if e["instance_id"] == pod and e["execution_id"] == execution and e["kind"] in GRANTS
        }
        newer = {
            int(e["lease_epoch"])
            for e in history.lease_events
            if e["instance_id"] != pod and e["execution_id"] == execution and e["kind"] in GRANTS
        }
        if epochs and newer:
            old = max(epochs)
            for event in events:
                if (
                    event.get("kind") == "effect"
                    and event["pod"] == pod
                    and event.get("execution") == execution
                    and event.get("epoch") == old
                    and not event.get("replayed")
                    and old < max(newer)
                    and _after_thaw(facts, pod, int(event["t"]))
                ):
                    found.append(
                        Violation(
                            "zombie-fenced",
                            f"{pod} stored {execution} {event['step']} at its old epoch {old} "
                            "after it woke",
                        )
                    )
    return found


def _after_thaw(facts: AuditFacts, pod: str, at: int) -> bool:
    return any(who == pod and ended is not None and at >= ended for who, _, ended in facts.freezes)


__all__ = ["RULES", "AuditFacts", "StoreHistory", "Violation", "audit", "read_sql_history"]
