"""The workflow app the view tests leave trees of: a root that doubles its input in a step
(with an undo), runs one `leaf` child per unit of its input, then pauses for approval."""

from __future__ import annotations

from agboss_sql.runtime import Child, WorkflowContext, Workflows

app = Workflows("views")


async def double(n: int) -> int:
    return 2 * n


async def forget(_doubled: int) -> None:
    return None


@app.workflow
async def leaf(ctx: WorkflowContext, n: int) -> int:
    return await ctx.step("double", double, n)


@app.workflow
async def tree(ctx: WorkflowContext, n: int) -> dict[str, object]:
    doubled = await ctx.step("double", double, n, undo=forget)
    leaves = await ctx.children("leaves", [Child("leaf", i) for i in range(n)])
    decision = await ctx.pause("approval", {"doubled": doubled})
    return {"doubled": doubled, "leaves": leaves, "decision": decision}
