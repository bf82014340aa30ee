"""The cluster's demo tree, written only against the public workflow API
(`agboss_sql.runtime`): what `agboss-sql cluster --workload tree` runs.

    agboss-sql worker --url URL --app agboss_sql.lab.tree_app:app

`tree(spec)` plans, reserves (a business row, undone on cancel), pauses for an approval
when `spec["pause"]`, fans out `fan_out` `branch` children on any worker and closes. A
`branch` above the deepest level fans out again and merges; a leaf thinks, charges its
order (a business row under the order's business key, refunded on cancel) and notifies
the order's owner (an outbound call, sent at most once per attempt). Every business row
is `<execution>|<what>` in the suites' business table, so the audit reads from the
database what was charged, refunded and undone, and how often.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agboss_sql.contracts.types import JsonValue
from agboss_sql.lab.business import insert_business_row
from agboss_sql.runtime import Child, WorkflowContext, Workflows

app = Workflows("tree")


def spec_of(value: Any) -> dict[str, Any]:
    """A tree's spec with its defaults: `fan_out` children per parent down to `depth`
    (the leaves), a `pause` before the children, `step_ms` of simulated work a step."""
    value = value if isinstance(value, dict) else {}
    return {
        "fan_out": int(value.get("fan_out", 2)),
        "depth": int(value.get("depth", 2)),
        "pause": bool(value.get("pause", False)),
        "step_ms": int(value.get("step_ms", 50)),
    }


def order_key(leaf: str) -> str:
    """The business key of the order a leaf charges."""
    return f"order:{leaf}"


async def _work(ms: int, value: JsonValue) -> JsonValue:
    if ms:
        await asyncio.sleep(ms / 1000)
    return value


def _row(execution: str, what: str) -> Any:
    async def write(tx: Any) -> JsonValue:
        await insert_business_row(tx, f"{execution}|{what}")
        return {"row": what}

    return write


def _children(ctx: WorkflowContext, spec: dict[str, Any], level: int) -> list[Child]:
    return [Child("branch", {**spec, "level": level}) for _ in range(spec["fan_out"])]


@app.workflow
async def tree(ctx: WorkflowContext, value: Any) -> JsonValue:
    """The root of a demo tree (see the module)."""
    spec = spec_of(value)
    here = ctx.execution_id
    await ctx.step("plan", _work, spec["step_ms"], {"fan_out": spec["fan_out"]})
    await ctx.effect("reserve", _row(here, "reserve"), undo=_undo(here, "reserve"))
    if spec["pause"]:
        await ctx.pause("approval", {"question": "approve the orders?"})
    if spec["depth"] > 0:
        await ctx.children("split", _children(ctx, spec, 1))
    await ctx.step("close", _work, spec["step_ms"], {"closed": here})
    return {"closed": here}


@app.workflow
async def branch(ctx: WorkflowContext, value: Any) -> JsonValue:
    """A child of the demo tree: a branch above the deepest level, else a leaf."""
    spec = spec_of(value)
    level = int(value.get("level", 1)) if isinstance(value, dict) else 1
    here = ctx.execution_id
    if level < spec["depth"]:
        await ctx.step("split", _work, spec["step_ms"], None)
        await ctx.children("split", _children(ctx, spec, level + 1))
        await ctx.step("merge", _work, spec["step_ms"], {"merged": True})
        return {"merged": here}
    await ctx.step("think", _work, spec["step_ms"], {"ok": True})
    ctx.check()
    await ctx.effect(
        "charge",
        _row(here, "charge"),
        business_key=order_key(here),
        undo=_undo(here, "charge"),
    )

    async def send(attempt: int) -> JsonValue:
        return {"ok": True, "attempt": attempt}

    await ctx.outbound("notify", {"order": order_key(here)}, send)
    return {"charged": order_key(here)}


def _undo(execution: str, what: str) -> Any:
    async def undo(tx: Any, _result: Any) -> JsonValue:
        await insert_business_row(tx, f"{execution}|undo:{what}")
        return {"undone": what}

    return undo


__all__ = ["app", "order_key", "spec_of"]


# -- the cluster's workload ------------------------------------------------------------------


def _leaves(spec: dict[str, Any]) -> int:
    return int(spec["fan_out"]) ** int(spec["depth"]) if spec["depth"] > 0 else 0


def _runs(config: Any, run_id: str) -> list[Any]:
    from agboss_sql.lab.workload import ClusterRun

    runs = []
    for index in range(config.trees):
        pause = config.pause_every > 0 and index % config.pause_every == config.pause_every - 1
        spec = {
            "fan_out": config.fan_out,
            "depth": config.depth,
            "pause": pause,
            "step_ms": config.step_ms,
        }
        runs.append(ClusterRun("tree", spec, f"r{run_id}-t{index:02d}"))
    return runs


def _charged(rows: list[str], tree: str, what: str) -> set[str]:
    return {
        row.rsplit("|", 1)[0]
        for row in rows
        if row.startswith(f"{tree}/") and row.endswith(f"|{what}")
    }


def _progress(connection: Any, runs: list[Any]) -> float:
    import sqlalchemy as sa

    from agboss_sql.lab.business import business_rows

    if not runs:
        return 1.0
    prefix = runs[0].id.rsplit("-", 1)[0]
    charged = connection.execute(
        sa.select(sa.func.count()).where(business_rows.c.row.like(f"{prefix}-%|charge"))
    ).scalar_one()
    total = sum(_leaves(spec_of(run.input)) for run in runs)
    return float(charged) / max(1, total)


def _audit(history: Any, runs: list[Any]) -> list[Any]:
    """The tree's own rules: a succeeded tree charged every leaf once and undid nothing; a
    cancelled tree undid its reserve and refunded every order it charged, once."""
    from agboss_sql.lab.faults.audit import Violation

    found = []
    rows = list(history.business_rows)
    status = {str(r["execution_id"]): str(r["status"]) for r in history.records}
    for run in runs:
        spec = spec_of(run.input)
        charged = _charged(rows, run.id, "charge")
        refunded = _charged(rows, run.id, "undo:charge")
        if status.get(run.id) == "succeeded":
            if len(charged) != _leaves(spec):
                found.append(
                    Violation(
                        "tree",
                        f"{run.id} succeeded with {len(charged)} of {_leaves(spec)} leaves charged",
                    )
                )
            if refunded or f"{run.id}|undo:reserve" in rows:
                found.append(
                    Violation("tree", f"{run.id} succeeded but refunded or undid its reserve")
                )
        elif status.get(run.id) == "cancelled":
            if f"{run.id}|undo:reserve" not in rows:
                found.append(Violation("tree", f"{run.id} cancelled; its reserve not undone"))
            if charged != refunded:
                found.append(
                    Violation(
                        "tree",
                        f"{run.id} cancelled: charged {sorted(charged - refunded)} not refunded, "
                        f"refunded {sorted(refunded - charged)} not charged",
                    )
                )
    return found


def _workload() -> Any:
    from agboss_sql.lab.workload import ClusterWorkload

    return ClusterWorkload(
        name="tree",
        app="agboss_sql.lab.tree_app:app",
        runs=_runs,
        progress=_progress,
        audit=_audit,
        business_table=True,
    )


workload: Any = _workload()
"""The tree as the cluster's workload (`agboss-sql cluster --workload tree`)."""
