"""One tree read back whole for `agboss-sql show` (see `agboss_sql.sql.inspect`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from agboss_sql.sql._inspect_rows import (
    COMPENSATED_PREFIX,
    EFFECT_KINDS,
    MAX_DEPTH,
    database_now,
    from_json,
    in_values,
    lease_state,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.schema import (
    child_executions,
    execution_lease_events,
    execution_leases,
    execution_records,
    execution_tree_keys,
    fenced_effect_results,
    outbound_calls,
    paused_executions,
)

_C = child_executions
_L = execution_leases
_R = execution_records


@dataclass(frozen=True, slots=True)
class Moment:
    """One line of a tree's timeline: when, which execution, what, and its details."""

    at: int
    execution: str
    what: str
    detail: str


@dataclass
class TreeView:
    """One tree, everything the database knows of it (see `tree_view`)."""

    now: int
    tenant_id: str
    tree: str
    workflow: str
    status: str
    created_at: int
    updated_at: int
    input: Any
    outcome: Any
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    children: list[dict[str, Any]] = field(default_factory=list)
    pauses: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    compensations: list[dict[str, Any]] = field(default_factory=list)
    lease_moves: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[Moment] = field(default_factory=list)
    truncated: bool = False
    """True when the tree has children deeper than `MAX_DEPTH` levels (not shown)."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def tree_view(connection: SqlConnection, tenant_id: str, tree: str) -> TreeView | None:
    """Tree `tree` of `tenant_id` (its root's execution id), or `None` when no root record
    has that id: its record and input; every execution's lease (state, holder, epoch);
    its steps, effects and undos with their results, the epoch that stored each and how
    many later epochs of the execution answered it from the store (`replays`: each later
    holder re-ran the workflow from its start); its children; its pauses; its outbound
    calls; its compensations (the undos a cancel ran, and which are marked done); its
    lease moves; and all of it in one `timeline`, oldest first. The rows are stamped by
    the clocks of the instances that wrote them (and some by the database's), so two
    moments a few milliseconds apart may show in another order than they happened."""
    now = await database_now(connection)
    found = (
        await connection.execute(
            sa.select(
                _R.c.workflow, _R.c.status, _R.c.created_at, _R.c.updated_at, _R.c.outcome
            ).where(
                _R.c.tenant_id == tenant_id,
                _R.c.execution_id == tree,
                _R.c.root_execution_id == tree,
            )
        )
    ).first()
    if found is None:
        return None
    workflow, status, created, updated, outcome = found
    view = TreeView(
        now=now,
        tenant_id=tenant_id,
        tree=tree,
        workflow=workflow,
        status=status,
        created_at=int(created),
        updated_at=int(updated),
        input=None,
        outcome=from_json(outcome),
    )
    moments = view.timeline
    moments.append(Moment(view.created_at, tree, "created", f"{workflow} ({status} now)"))
    if status in ("succeeded", "failed", "cancelled"):
        moments.append(Moment(view.updated_at, tree, status, _brief(view.outcome)))
    await _read_children(connection, view)
    executions = [tree, *(child["id"] for child in view.children)]
    await _read_leases(connection, view, executions)
    await _read_effects(connection, view, executions)
    await _read_calls(connection, view, executions)
    await _read_pauses(connection, view)
    await _read_keys(connection, view)
    moments.sort(key=lambda moment: moment.at)  # stable: one source's order within a ms
    return view


def _brief(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _read_children(connection: SqlConnection, view: TreeView) -> None:
    parents = [view.tree]
    for _level in range(MAX_DEPTH):
        rows = (
            await connection.execute(
                sa.select(
                    _C.c.child_execution_id,
                    _C.c.parent_execution_id,
                    _C.c.depth,
                    _C.c.payload,
                    _C.c.status,
                    _C.c.attempt,
                    _C.c.claimed_by,
                    _C.c.queued_at,
                    _C.c.claimed_at,
                    _C.c.finished_at,
                    _C.c.outcome,
                )
                .where(
                    _C.c.tenant_id == view.tenant_id, in_values(_C.c.parent_execution_id, parents)
                )
                .order_by(_C.c.queued_at, _C.c.id)
            )
        ).rows
        if not rows:
            return
        for row in rows:
            child_id, parent, depth, payload, state, attempt, claimed_by = row[:7]
            queued_at, claimed_at, finished_at, outcome = row[7:]
            body = from_json(payload)
            child = {
                "id": child_id,
                "parent": parent,
                "depth": int(depth),
                "workflow": body.get("workflow") if isinstance(body, dict) else None,
                "status": state,
                "attempt": int(attempt),
                "claimed_by": claimed_by,
                "queued_at": int(queued_at),
                "claimed_at": None if claimed_at is None else int(claimed_at),
                "finished_at": None if finished_at is None else int(finished_at),
                "outcome": from_json(outcome),
            }
            view.children.append(child)
            view.timeline.append(Moment(int(queued_at), parent, "child queued", child_id))
            if claimed_at is not None:
                by = f"attempt {attempt} by {claimed_by}"
                view.timeline.append(Moment(int(claimed_at), child_id, "child claimed", by))
            if finished_at is not None:
                view.timeline.append(
                    Moment(int(finished_at), child_id, "child finished", _brief(child["outcome"]))
                )
        parents = [row[0] for row in rows]
    view.truncated = True


async def _read_leases(connection: SqlConnection, view: TreeView, executions: list[str]) -> None:
    rows = (
        await connection.execute(
            sa.select(
                _L.c.execution_id,
                _L.c.holder_instance_id,
                _L.c.lease_epoch,
                _L.c.expires_at,
                _L.c.released,
                _L.c.yielded,
                _L.c.finished,
                _L.c.closed_reason,
            ).where(_L.c.tenant_id == view.tenant_id, in_values(_L.c.execution_id, executions))
        )
    ).rows
    for execution, holder, epoch, expires_at, released, yielded, finished, closed in rows:
        view.leases[execution] = {
            "holder": holder,
            "epoch": int(epoch),
            "expires_at": int(expires_at),
            "state": lease_state(
                expires_at=int(expires_at),
                released=bool(released),
                yielded=bool(yielded),
                finished=bool(finished),
                closed=closed,
                now=view.now,
            ),
        }
    E = execution_lease_events
    events = (
        await connection.execute(
            sa.select(
                E.c.execution_id,
                E.c.instance_id,
                E.c.lease_epoch,
                E.c.kind,
                E.c.at,
                E.c.taken_over_from_instance_id,
                E.c.taken_over_from_epoch,
                E.c.reason,
            )
            .where(E.c.tenant_id == view.tenant_id, in_values(E.c.execution_id, executions))
            .order_by(E.c.at, E.c.id)
        )
    ).rows
    for execution, instance, epoch, kind, at, from_instance, from_epoch, reason in events:
        move = {
            "execution": execution,
            "instance": instance,
            "epoch": int(epoch),
            "kind": kind,
            "at": int(at),
            "taken_over_from": None if from_instance is None else f"{from_instance}@{from_epoch}",
            "reason": reason,
        }
        view.lease_moves.append(move)
        detail = f"{instance} epoch {epoch}"
        detail += f" from {move['taken_over_from']}" if from_instance is not None else ""
        detail += f" ({reason})" if reason else ""
        view.timeline.append(Moment(int(at), execution, f"lease {kind}", detail))


async def _read_effects(connection: SqlConnection, view: TreeView, executions: list[str]) -> None:
    F = fenced_effect_results
    rows = (
        await connection.execute(
            sa.select(
                F.c.step_execution_id,
                F.c.step_idempotency_key,
                F.c.step_name,
                F.c.name,
                F.c.business_key,
                F.c.token,
                F.c.result,
                F.c.stored_at,
            )
            .where(F.c.tenant_id == view.tenant_id, in_values(F.c.lease_execution_id, executions))
            .order_by(F.c.stored_at)
        )
    ).rows
    for execution, key, step_name, name, business_key, token, result, stored_at in rows:
        kind = EFFECT_KINDS.get(name, name)
        stored = from_json(result)
        value = stored.get("v") if isinstance(stored, dict) and "v" in stored else stored
        epoch = view.leases.get(execution, {}).get("epoch", int(token))
        step = {
            "execution": execution,
            "key": key,
            "name": step_name,
            "kind": kind,
            "business_key": business_key,
            "epoch": int(token),
            "replays": max(0, int(epoch) - int(token)),
            "result": value,
            "stored_at": int(stored_at),
        }
        if kind == "undo":
            view.compensations.append(
                {"execution": execution, "undo": key, "epoch": int(token), "at": int(stored_at)}
            )
        else:
            view.steps.append(step)
        detail = f"{key} at epoch {token}"
        detail += f", replayed by {step['replays']} later" if step["replays"] else ""
        view.timeline.append(Moment(int(stored_at), execution, kind, f"{detail}: {_brief(value)}"))


async def _read_calls(connection: SqlConnection, view: TreeView, executions: list[str]) -> None:
    Calls = outbound_calls
    rows = (
        await connection.execute(
            sa.select(
                Calls.c.step_execution_id,
                Calls.c.step_idempotency_key,
                Calls.c.status,
                Calls.c.attempt,
                Calls.c.attempt_owner,
                Calls.c.response,
                Calls.c.error,
                Calls.c.recorded_at,
                Calls.c.updated_at,
            )
            .where(
                Calls.c.tenant_id == view.tenant_id,
                in_values(Calls.c.lease_execution_id, executions),
            )
            .order_by(Calls.c.recorded_at)
        )
    ).rows
    for execution, key, state, attempt, owner, response, error, recorded, updated in rows:
        call = {
            "execution": execution,
            "key": key,
            "status": state,
            "attempt": int(attempt),
            "owner": owner,
            "response": from_json(response),
            "error": from_json(error),
            "recorded_at": int(recorded),
            "updated_at": int(updated),
        }
        view.calls.append(call)
        view.timeline.append(
            Moment(int(updated), execution, "call", f"{key} {state}, attempt {attempt}")
        )


async def _read_pauses(connection: SqlConnection, view: TreeView) -> None:
    P = paused_executions
    rows = (
        await connection.execute(
            sa.select(
                P.c.pause_id,
                P.c.execution_id,
                P.c.status,
                P.c.request,
                P.c.decision,
                P.c.created_at,
                P.c.resolved_at,
                P.c.taken_by,
            )
            .where(P.c.tenant_id == view.tenant_id, P.c.root_execution_id == view.tree)
            .order_by(P.c.created_at, P.c.pause_id)
        )
    ).rows
    for pause_id, execution, state, request, decision, created, resolved, taken_by in rows:
        pause = {
            "id": pause_id,
            "execution": execution,
            "status": state,
            "request": from_json(request),
            "decision": from_json(decision),
            "created_at": int(created),
            "resolved_at": None if resolved is None else int(resolved),
            "taken_by": taken_by,
        }
        view.pauses.append(pause)
        view.timeline.append(
            Moment(int(created), execution, "paused", f"{pause_id}: {_brief(pause['request'])}")
        )
        if resolved is not None:
            view.timeline.append(
                Moment(
                    int(resolved), execution, "resolved", f"{pause_id}: {_brief(pause['decision'])}"
                )
            )


async def _read_keys(connection: SqlConnection, view: TreeView) -> None:
    K = execution_tree_keys
    rows = (
        await connection.execute(
            sa.select(K.c.key, K.c.value).where(
                K.c.tenant_id == view.tenant_id, K.c.root_execution_id == view.tree
            )
        )
    ).rows
    done = set()
    for key, value in rows:
        if key == "@agboss/workflow":
            body = from_json(value)
            view.input = body.get("input") if isinstance(body, dict) else body
        elif key.startswith(COMPENSATED_PREFIX):
            done.add(key[len(COMPENSATED_PREFIX) :])
    for compensation in view.compensations:
        compensation["done"] = compensation["undo"].removeprefix("undo/") in done


__all__ = ["Moment", "TreeView", "tree_view"]
