"""The workflow app the metrics tests run in worker processes: `tree` (a step, an effect,
two `leaf` children) and `slow` (one step that takes `seconds`, long enough for its lease
to be renewed, or for its worker to be frozen in it)."""

from __future__ import annotations

import asyncio
from typing import Any

from agboss_sql.runtime import Child, WorkflowContext, Workflows

app = Workflows("metrics")


async def double(n: int) -> int:
    return 2 * n


async def noted(_tx: Any, n: int) -> int:
    return n + 1


async def wait(seconds: float) -> float:
    await asyncio.sleep(seconds)  # the work a step does: it takes this long
    return seconds


@app.workflow
async def leaf(ctx: WorkflowContext, n: int) -> int:
    return await ctx.step("double", double, n)


@app.workflow
async def tree(ctx: WorkflowContext, n: int) -> dict[str, Any]:
    doubled = await ctx.step("double", double, n)
    noted_ = await ctx.effect("note", noted, n)
    leaves = await ctx.children("leaves", [Child("leaf", i) for i in range(n)])
    return {"doubled": doubled, "noted": noted_, "leaves": leaves}


@app.workflow
async def slow(ctx: WorkflowContext, seconds: float) -> float:
    return await ctx.step("wait", wait, seconds)
