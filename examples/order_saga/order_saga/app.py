"""The workflows: `order` (the saga) and `ship` (one item, a child on any worker).

Run them on as many workers as you like, all on one database:

    agboss-sql worker --url URL --app order_saga.app:app
"""

from __future__ import annotations

import asyncio
from typing import Any

from agboss_sql.runtime import Child, WorkflowContext, Workflows
from order_saga.schema import payments, refunds, shipments

app = Workflows("order-saga")


# -- steps: plain async functions, run once, their results stored -------------------------


async def reserve_stock(order: dict[str, Any]) -> dict[str, Any]:
    """Stand-in for a call to the inventory service (it takes a moment)."""
    await asyncio.sleep(0.05)
    return {"reserved": order["items"]}


async def pack(order_id: str, item: str) -> dict[str, Any]:
    """Stand-in for the warehouse packing an item (it takes a moment)."""
    await asyncio.sleep(0.1)
    return {"packed": item}


async def release_stock(reservation: dict[str, Any]) -> None:
    """Undo of `reserve_stock` (runs once if the order is cancelled after it)."""


async def charge_card(tx: Any, order: dict[str, Any], by: str) -> dict[str, Any]:
    """An effect: the payment row commits with the fence and the stored result, once."""
    await tx.execute(
        payments.insert().values(order_id=order["id"], cents=order["cents"], charged_by=by)
    )
    return {"charged": order["cents"]}


async def refund_card(tx: Any, charged: dict[str, Any], order_id: str) -> None:
    """Undo of `charge_card`, in its own fenced transaction (runs once)."""
    await tx.execute(refunds.insert().values(order_id=order_id, cents=charged["charged"]))


async def record_shipment(tx: Any, order_id: str, item: str, by: str) -> dict[str, Any]:
    await tx.execute(shipments.insert().values(order_id=order_id, item=item, shipped_by=by))
    return {"item": item, "shipped_by": by}


# -- workflows -----------------------------------------------------------------------------


@app.workflow
async def ship(ctx: WorkflowContext, job: dict[str, Any]) -> dict[str, Any]:
    """Ship one item of an order (a child workflow: any worker runs it)."""
    await ctx.step("pack", pack, job["order_id"], job["item"])
    here = ctx.instance_id  # not an argument: arguments are compared on replay

    async def record(tx: Any, order_id: str, item: str) -> dict[str, Any]:
        return await record_shipment(tx, order_id, item, here)

    return await ctx.effect("record", record, job["order_id"], job["item"])


@app.workflow
async def order(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    """Reserve, charge, ship every item on any worker, wait for approval, notify."""
    reservation = await ctx.step("reserve", reserve_stock, order, undo=release_stock)

    here = ctx.instance_id  # not an argument: arguments are compared on replay

    async def charge(tx: Any, order: dict[str, Any]) -> dict[str, Any]:
        return await charge_card(tx, order, here)

    async def refund(tx: Any, charged: dict[str, Any]) -> None:
        await refund_card(tx, charged, order["id"])

    charged = await ctx.effect(
        "charge", charge, order, business_key=f"order:{order['id']}", undo=refund
    )
    shipped = await ctx.children(
        "ship", [Child("ship", {"order_id": order["id"], "item": item}) for item in order["items"]]
    )
    approval = None
    if order.get("needs_approval"):
        approval = await ctx.pause("approval", {"order": order["id"], "cents": order["cents"]})

    async def notify(attempt: int) -> dict[str, Any]:
        # Stand-in for an e-mail API: the attempt number is its idempotency key.
        return {"sent": True, "attempt": attempt}

    await ctx.outbound("notify", {"order": order["id"]}, notify)
    return {
        "reserved": reservation["reserved"],
        "charged": charged["charged"],
        "shipped": [s["item"] for s in shipped],
        "approval": approval,
    }
